#!/usr/bin/env python3
"""Reference values for volt's lr_find (tests/tuner/lr_finder_test.cpp), computed the way
Lightning's tuner does with PyTorch: the schedule of _ExponentialLR / _LinearLR, the smoothing of
_LRCallback, and suggestion() = argmin of torch.gradient(losses, spacing=[x]) after the skips,
where x is log10(lr) for an exponential ladder (volt; Lightning's open PR #21171 for its issue
#21141) and lr for a linear one (Lightning 2.6 uses lr for both; printed too, for comparison).
Run with Debian's python3-torch: python3 tools/lr_find_reference.py"""
import math

import torch


def schedule(mode, lo, hi, n):
    out = []
    for k in range(n):
        if k == 0:
            out.append(lo)
            continue
        r = (k + 1) / n
        out.append(lo + r * (hi - lo) if mode == "linear" else lo * (hi / lo) ** r)
    return out


def smooth(raw, beta=0.98, threshold=4.0):
    avg, best, out = 0.0, 0.0, []
    for i, loss in enumerate(raw):
        step = i + 1
        avg = beta * avg + (1 - beta) * loss
        s = avg / (1 - beta ** (step + 1))
        stop = threshold is not None and step > 1 and s > threshold * best
        if s < best or step == 1:
            best = s
        out.append(s)
        if stop:
            break
    return out


def suggestion(lrs, losses, skip_begin=10, skip_end=1, log_axis=True):
    lo = torch.tensor(losses[skip_begin:-skip_end], dtype=torch.float64)
    lr = torch.tensor(lrs[skip_begin:-skip_end], dtype=torch.float64)
    if log_axis:
        lr = torch.log10(lr)
    finite = torch.isfinite(lo)
    lo, lr = lo[finite], lr[finite]
    if len(lo) < 2:
        return None
    g = torch.gradient(lo, spacing=[lr])[0]
    kept = torch.arange(len(losses))[skip_begin:-skip_end][finite]
    return int(kept[int(torch.argmin(g))])


def main():
    print("exponential 1e-8..1, n=100, lr[0], lr[1], lr[50], lr[99]:",
          *("%.17g" % v for v in [schedule("exponential", 1e-8, 1, 100)[i] for i in (0, 1, 50, 99)]))
    print("linear 0.01..0.5, n=10:", *("%.17g" % v for v in schedule("linear", 0.01, 0.5, 10)))
    # A loss that falls, flattens and then blows up, with a NaN inside.
    lrs = schedule("exponential", 1e-5, 10.0, 40)
    raw = [2.0 / (1 + 40 * math.exp(-((i - 18) / 3.0) ** 2)) + (0.0 if i < 30 else 0.5 * (i - 29) ** 2)
           for i in range(40)]
    sm = smooth(raw)
    print("smoothed (threshold 4):", len(sm), "points; last %.17g" % sm[-1])
    sm_all = smooth(raw, threshold=None)
    print("smoothed (no threshold) [0], [1], [20]:", *("%.17g" % sm_all[i] for i in (0, 1, 20)))
    losses = list(sm_all)
    losses[15] = float("nan")
    print("suggestion index (10, 1):", suggestion(lrs, losses))
    print("suggestion index (0, 1):", suggestion(lrs, losses, 0, 1))
    print("suggestion index (37, 1):", suggestion(lrs, losses, 37, 1))
    print("Lightning 2.6 (spacing lr) suggestion index (10, 1):",
          suggestion(lrs, losses, log_axis=False))
    lin = schedule("linear", 0.01, 0.5, 40)
    print("linear ladder 0.01..0.5, same losses, suggestion index (10, 1):",
          suggestion(lin, losses, log_axis=False))


if __name__ == "__main__":
    main()
