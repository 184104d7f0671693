#!/usr/bin/python3
"""Reads a safetensors file with python3-torch only (no volt code) and prints, as JSON, each
tensor's dtype, shape and float64 sum plus the metadata. volt's tests run it on files volt wrote
to show that Python reads them.

Usage: /usr/bin/python3 tools/check_safetensors.py FILE
"""
import json
import struct
import sys

import torch

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
          "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def main():
    data = open(sys.argv[1], "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {"__metadata__": header.pop("__metadata__", {})}
    for name, e in header.items():
        b, end = e["data_offsets"]
        dtype = DTYPES[e["dtype"]]
        chunk = bytearray(body[b:end])
        if len(chunk):
            t = torch.frombuffer(chunk, dtype=torch.uint8 if dtype == torch.bool else dtype)
            t = t.to(torch.bool) if dtype == torch.bool else t
        else:
            t = torch.zeros(0, dtype=dtype)
        t = t.reshape(e["shape"])
        out[name] = {"dtype": e["dtype"], "shape": e["shape"], "sum": float(t.double().sum())}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
