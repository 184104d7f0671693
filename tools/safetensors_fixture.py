#!/usr/bin/python3
"""Writes tests/io/data/python_written.safetensors by hand with python3-torch (Debian has no
`safetensors` package): the layout Python's safetensors writes (8-byte LE header length, JSON
header padded with spaces to 8 bytes, raw little-endian data). volt's tests read it back and
check every value, which pins volt's reader to files produced outside volt.

Usage: /usr/bin/python3 tools/safetensors_fixture.py [out_path]
"""
import json
import struct
import sys

import torch


def tensors():
    return {
        "weight": torch.arange(6, dtype=torch.float32).reshape(2, 3) * 0.5 - 1,
        "bias": torch.tensor([1.5, -2.25, 3.0, 1e-300], dtype=torch.float64),
        "half": torch.tensor([0.5, -1.0], dtype=torch.float16),
        "bf": torch.tensor([1.0, -2.5, 3.0], dtype=torch.bfloat16),
        "idx": torch.tensor([[1, -2], [3, 2**40]], dtype=torch.int64),
        "empty": torch.zeros(0, dtype=torch.int32),
        "u8": torch.tensor([0, 255, 7], dtype=torch.uint8),
        "flag": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.25, dtype=torch.float32),
        "i16": torch.tensor([-300, 300], dtype=torch.int16),
        "i8": torch.tensor([-7, 7], dtype=torch.int8),
    }


DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
          torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
          torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def raw(t):
    t = t.contiguous()
    if t.numel() == 0:
        return b""
    # bytes of the storage, whatever the dtype (numpy lacks bfloat16)
    return t.view(-1).view(torch.uint8).numpy().tobytes() if t.dtype != torch.bool else \
        t.to(torch.uint8).numpy().tobytes()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/io/data/python_written.safetensors"
    ts = tensors()
    # Data in a different order from the names, as Python's safetensors (sorted by dtype size).
    order = sorted(ts, key=lambda k: (-ts[k].element_size(), k))
    header, blobs, offset = {"__metadata__": {"format": "pt", "producer": "tools/safetensors_fixture.py"}}, [], 0
    for name in order:
        b = raw(ts[name])
        header[name] = {"dtype": DTYPES[ts[name].dtype], "shape": list(ts[name].shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


if __name__ == "__main__":
    main()
