#!/usr/bin/python3
"""Independent reader for TensorBoard event files (stdlib only, no TensorFlow/protobuf):
checks the TFRecord framing and both masked CRC32Cs of every record, decodes the Event /
Summary / hparams-plugin protobufs by field number, and prints a JSON summary. volt's tests
run it on files volt's TensorBoardLogger wrote.

Usage: python3 tools/read_tfevents.py EVENTS_FILE   (exit 1 and a message on any defect)
"""
import json
import struct
import sys


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


TABLE = _crc32c_table()


def masked_crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(blob):
    pos = 0
    while pos < len(blob):
        if pos + 12 > len(blob):
            raise ValueError("truncated record header at byte %d" % pos)
        header = blob[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (len_crc,) = struct.unpack("<I", blob[pos + 8:pos + 12])
        if masked_crc32c(header) != len_crc:
            raise ValueError("length CRC mismatch at byte %d" % pos)
        data = blob[pos + 12:pos + 12 + length]
        if len(data) != length or pos + 16 + length > len(blob):
            raise ValueError("truncated record data at byte %d" % pos)
        (data_crc,) = struct.unpack("<I", blob[pos + 12 + length:pos + 16 + length])
        if masked_crc32c(data) != data_crc:
            raise ValueError("data CRC mismatch at byte %d" % pos)
        yield data
        pos += 16 + length


def decode(buf):
    """Protobuf message -> {field: [values]}; varints as int, fixed64/32 as bytes."""
    out, pos = {}, 0

    def varint():
        nonlocal pos
        shift = result = 0
        while True:
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result
            shift += 7

    while pos < len(buf):
        key = varint()
        field, wire = key >> 3, key & 7
        if wire == 0:
            val = varint()
        elif wire == 1:
            val, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            n = varint()
            val, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            val, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError("unsupported wire type %d" % wire)
        out.setdefault(field, []).append(val)
    return out


def f64(b):
    return struct.unpack("<d", b)[0]


def main():
    blob = open(sys.argv[1], "rb").read()
    result = {"records": 0, "file_version": None, "scalars": [], "hparams": {},
              "experiment_hparams": [], "session_end_status": None, "session_log_start_steps": [],
              "log_messages": 0}
    try:
        for data in records(blob):
            result["records"] += 1
            ev = decode(data)
            step = ev.get(2, [0])[0]
            if 3 in ev:
                result["file_version"] = ev[3][0].decode()
            # Event (tensorflow/core/util/event.proto): log_message=6, session_log=7;
            # SessionLog.status=1, START=1.
            if 6 in ev:
                result["log_messages"] += 1
            if 7 in ev and decode(ev[7][0]).get(1, [0])[0] == 1:
                result["session_log_start_steps"].append(step)
            for summary in ev.get(5, []):
                for value in decode(summary).get(1, []):
                    v = decode(value)
                    tag = v[1][0].decode()
                    if 2 in v:
                        result["scalars"].append([tag, step, struct.unpack("<f", v[2][0])[0],
                                                  f64(ev[1][0])])
                    elif 9 in v:
                        plugin = decode(decode(v[9][0])[1][0])
                        if plugin[1][0] != b"hparams":
                            continue
                        content = decode(plugin[2][0])
                        if 2 in content:
                            for info in decode(content[2][0]).get(4, []):
                                result["experiment_hparams"].append(decode(info)[1][0].decode())
                        if 3 in content:
                            for entry in decode(content[3][0]).get(1, []):
                                e = decode(entry)
                                val = decode(e[2][0])
                                result["hparams"][e[1][0].decode()] = (
                                    f64(val[2][0]) if 2 in val else val[3][0].decode())
                        if 4 in content:
                            result["session_end_status"] = decode(content[4][0])[1][0]
    except (ValueError, IndexError, KeyError) as e:
        print("bad event file: %s" % e, file=sys.stderr)
        sys.exit(1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
