#!/usr/bin/env python3
"""Sums the GPU work of a Chrome trace kernel by kernel, or compares two (issue #14's GPT-2 gap): the
trace `volt_bench_gpt2 --trace A` writes (libtorch's kineto, the C++ loop) and the one
`benchmarks/gpt2.py --trace B` writes (torch.profiler, the Python loop), over the same number of
steps. Sums the device time of every kernel, copy and memset by name, and prints the totals and
the names whose time differs most, per step.

    python3 tools/kernel_table.py A.json [B.json] [--steps 3] [--top 25] [--cat kernel,...]

With one trace (e.g. `volt_bench_fused_sdpa_cuda --varlen --trace A`), its own table.

Kernel names are shortened: template arguments and parameter lists are dropped, so instances of
one kernel template add up.
"""
import argparse
import collections
import gzip
import json
import re


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def short(name):
    while True:  # template arguments, innermost first
        shorter = re.sub(r"<[^<>]*>", "", name)
        if shorter == name:
            break
        name = shorter
    if name.endswith(")"):  # the parameter list (not "(anonymous namespace)" inside the name)
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    name = re.sub(r"^void ", "", name).replace("(anonymous namespace)::", "")
    return name[:80]


def table(trace, cats):
    time = collections.Counter()
    count = collections.Counter()
    # kineto writes {"traceEvents": [...]}; the legacy profiler (no kineto) a bare list.
    for e in trace.get("traceEvents", []) if isinstance(trace, dict) else trace:
        if e.get("ph") != "X" or ("any" not in cats and e.get("cat", "").lower() not in cats):
            continue
        n = short(e.get("name", "?"))
        time[n] += float(e.get("dur", 0.0))
        count[n] += 1
    return time, count


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a")
    ap.add_argument("b", nargs="?", help="a second trace to compare with")
    ap.add_argument("--steps", type=int, default=3, help="steps each trace holds")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--cat", default="kernel,gpu_memcpy,gpu_memset",
                    help="event categories counted (comma-separated; 'any': every event, e.g. "
                    "a CPU trace of the legacy profiler, which has none)")
    ap.add_argument("--names", nargs="+", default=["A", "B"], help="what to call the traces")
    a = ap.parse_args()
    cats = set(a.cat.lower().split(","))
    ta, ca = table(load(a.a), cats)
    tb, cb = table(load(a.b), cats) if a.b else (collections.Counter(), collections.Counter())
    s = float(a.steps)
    na, nb = (a.names + ["B"])[:2]
    print(f"GPU time per step, by kernel ({a.steps} steps; ms, launches per step)")
    if not a.b:
        print(f"  total: {na} {sum(ta.values()) / s / 1e3:9.3f} ms in"
              f" {sum(ca.values()) / s:7.0f} launches")
        print(f"  {'kernel':80s} {'ms':>9s} {'n':>5s} {'share':>6s}")
        total = sum(ta.values()) or 1.0
        for n in sorted(ta, key=lambda n: -ta[n])[:a.top]:
            print(f"  {n:80s} {ta[n] / s / 1e3:9.3f} {ca[n] / s:5.0f} {100 * ta[n] / total:5.1f}%")
        return
    print(f"  total: {na} {sum(ta.values()) / s / 1e3:9.3f} ms in {sum(ca.values()) / s:7.0f}"
          f" launches;  {nb} {sum(tb.values()) / s / 1e3:9.3f} ms in"
          f" {sum(cb.values()) / s:7.0f} launches")
    names = sorted(set(ta) | set(tb), key=lambda n: -abs(ta[n] - tb[n]))
    print(f"  {'kernel':80s} {na + ' ms':>9s} {'n':>5s} {nb + ' ms':>9s} {'n':>5s} {'diff ms':>8s}")
    for n in names[:a.top]:
        print(f"  {n:80s} {ta[n] / s / 1e3:9.3f} {ca[n] / s:5.0f} {tb[n] / s / 1e3:9.3f}"
              f" {cb[n] / s:5.0f} {(ta[n] - tb[n]) / s / 1e3:+8.3f}")

if __name__ == "__main__":
    main()
