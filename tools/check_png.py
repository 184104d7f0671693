#!/usr/bin/env python3
"""Checks that a screenshot of a volt run report shows a drawn page, with the standard library
only (zlib + struct PNG decoding): the expected size, enough non-background pixels, several
distinct colours, and pixels in several of the report's series colours (the plots rendered).

Usage: tools/check_png.py SCREENSHOT.png [--width W] [--height H] [--min-drawn F]
                          [--min-colours N] [--min-series N]
Exit status 0 when every check passes, 1 otherwise (each failure printed).
"""
import argparse
import collections
import struct
import sys
import zlib

# The first series colours of the report's palette (Tableau 10), in plot order.
SERIES_COLOURS = ["4e79a7", "f28e2b", "e15759", "76b7b2", "59a14f"]


def read_png(path):
    """Returns (width, height, channels, rows), rows a list of bytes, one per scanline."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG file")
    pos, idat, ihdr = 8, [], None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if ihdr is None:
        raise ValueError(f"{path} has no IHDR chunk")
    width, height, depth, colour_type, _, _, interlace = ihdr
    channels = {2: 3, 6: 4}.get(colour_type)
    if depth != 8 or channels is None or interlace != 0:
        raise ValueError(f"{path}: unsupported PNG (bit depth {depth}, colour type "
                         f"{colour_type}, interlace {interlace}); expected 8-bit RGB/RGBA")
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        ftype = raw[start]
        line = bytearray(raw[start + 1:start + 1 + stride])
        if ftype == 1:  # Sub
            for i in range(channels, stride):
                line[i] = (line[i] + line[i - channels]) & 0xFF
        elif ftype == 2:  # Up
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev))
        elif ftype == 3:  # Average
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif ftype == 4:  # Paeth
            for i in range(stride):
                a = line[i - channels] if i >= channels else 0
                b = prev[i]
                c = prev[i - channels] if i >= channels else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        elif ftype != 0:
            raise ValueError(f"{path}: bad filter type {ftype} in row {y}")
        rows.append(bytes(line))
        prev = line
    return width, height, channels, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("png")
    ap.add_argument("--width", type=int, help="expected width in pixels")
    ap.add_argument("--height", type=int, help="expected height in pixels")
    ap.add_argument("--min-drawn", type=float, default=0.10,
                    help="least fraction of pixels differing from the background (0.10)")
    ap.add_argument("--min-colours", type=int, default=24,
                    help="least number of distinct colours, 4 bits per channel (24)")
    ap.add_argument("--min-series", type=int, default=1,
                    help="least number of series colours with >= 40 pixels each (1)")
    args = ap.parse_args()

    width, height, channels, rows = read_png(args.png)
    pixels = collections.Counter()
    for row in rows:
        pixels.update(zip(row[0::channels], row[1::channels], row[2::channels]))
    total = width * height
    background, bg_count = pixels.most_common(1)[0]
    drawn = 1 - bg_count / total
    coarse = {(r >> 4, g >> 4, b >> 4) for r, g, b in pixels}
    series_hits = []
    for hexcol in SERIES_COLOURS:
        ref = tuple(int(hexcol[i:i + 2], 16) for i in (0, 2, 4))
        n = sum(c for px, c in pixels.items() if sum(abs(p - q) for p, q in zip(px, ref)) <= 24)
        series_hits.append((hexcol, n))
    series = sum(1 for _, n in series_hits if n >= 40)

    failures = []
    if args.width and width != args.width:
        failures.append(f"width {width} != expected {args.width}")
    if args.height and height != args.height:
        failures.append(f"height {height} != expected {args.height}")
    if drawn < args.min_drawn:
        failures.append(f"only {drawn:.1%} of pixels differ from the background "
                        f"#{bytes(background).hex()} (need {args.min_drawn:.0%}): blank page?")
    if len(coarse) < args.min_colours:
        failures.append(f"only {len(coarse)} distinct colours (need {args.min_colours})")
    if series < args.min_series:
        failures.append(f"only {series} plot colours drawn (need {args.min_series}): "
                        + ", ".join(f"#{h}={n}px" for h, n in series_hits))
    print(f"[check_png] {args.png}: {width}x{height}, background #{bytes(background).hex()}, "
          f"{drawn:.1%} drawn, {len(coarse)} colours, series colours "
          + ", ".join(f"#{h}={n}px" for h, n in series_hits))
    for f in failures:
        print(f"[check_png] FAIL: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
