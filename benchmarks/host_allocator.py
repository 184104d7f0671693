#!/usr/bin/python3
"""The demo trained under each host allocator, side by side (docs/PERFORMANCE.md).

    /usr/bin/python3 benchmarks/host_allocator.py [--reps N] [--steps N] [--build DIR]

Each repetition runs `volt fit` of the demo CNN (CnnClassifier, Fashion-MNIST, batch 64, one
loader worker: what scripts/demo.sh trains) and of the demo MLP once per contender: the C
library's malloc with its own defaults (`--trainer.reuse_host_memory=false`) and as volt tunes
it by default (freed memory kept for reuse), jemalloc and tcmalloc (scripts/with_allocator.sh),
the order rotating between repetitions so that machine drift hits all alike. Steps/s come from ThroughputMonitor in the
run's metrics.csv, over the steps after the first third (its rolling window; start-up, data loading and warm-up
excluded); peak RSS from GNU time. The table shows medians over the repetitions.
"""

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (label, scripts/with_allocator.sh name, extra volt arguments); the first is the baseline.
CONTENDERS = [("glibc, its defaults", "default", ["--trainer.reuse_host_memory=false"]),
              ("glibc, freed memory kept (volt's default)", "default", []),
              ("jemalloc", "jemalloc", []),
              ("tcmalloc", "tcmalloc", [])]
MODELS = {"demo CNN": "CnnClassifier", "demo MLP": "MlpClassifier"}


def run(build, allocator, extra, model, steps, workdir):
    out = os.path.join(workdir, f"{allocator}-{len(extra)}-{model}")
    third = max(steps // 3, 1)
    cmd = ["/usr/bin/time", "-f", "maxrss_kb=%M",
           "bash", os.path.join(ROOT, "scripts/with_allocator.sh"), allocator,
           os.path.join(build, "bin/volt"), "fit", f"--model={model}", "--data=FashionMNIST",
           "--data.batch_size=64", "--data.num_workers=1", f"--trainer.max_steps={3 * third}",
           "--trainer.limit_val_batches=0", "--trainer.num_sanity_val_steps=0",
           "--trainer.enable_progress_bar=false", "--trainer.enable_checkpointing=false",
           f"--trainer.log_every_n_steps={third}", "--trainer.callbacks+=ThroughputMonitor",
           f"--trainer.callbacks.0.window_size={2 * third + 1}",
           "--seed_everything=42",
           f"--trainer.default_root_dir={out}"] + extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    expected = f"host allocator: {allocator} ("
    if expected not in p.stderr:
        sys.exit(f"volt did not report '{expected}':\n{p.stderr}")
    rss_kb = int(p.stderr.rsplit("maxrss_kb=", 1)[1].split()[0])
    with open(os.path.join(out, "volt_logs/version_0/metrics.csv")) as f:
        rates = [float(r["train/device/batches_per_sec"]) for r in csv.DictReader(f)
                 if r.get("train/device/batches_per_sec")]
    if len(rates) != 1:
        sys.exit(f"expected 1 throughput reading, got {rates}")
    # The window of the last 2 * third steps, whose first point is the end of step `third`.
    return rates[0], rss_kb / 1024.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    results = {(m, c[0]): ([], []) for m in MODELS for c in CONTENDERS}
    with tempfile.TemporaryDirectory() as work:
        for rep in range(a.reps):
            k = rep % len(CONTENDERS)
            order = CONTENDERS[k:] + CONTENDERS[:k]
            for name, model in MODELS.items():
                for label, al, extra in order:
                    rate, rss = run(a.build, al, extra, model, a.steps,
                                    os.path.join(work, str(rep)))
                    results[(name, label)][0].append(rate)
                    results[(name, label)][1].append(rss)
                    print(f"rep {rep} {name} {label}: {rate:.2f} steps/s, peak RSS {rss:.0f} MiB",
                          file=sys.stderr)
    print(f"| model | allocator | steps/s (median of {a.reps}) | min - max "
          f"| vs {CONTENDERS[0][0]} | peak RSS (MiB, median) |")
    print("|---|---|---:|---:|---:|---:|")
    for name in MODELS:
        base = statistics.median(results[(name, CONTENDERS[0][0])][0])
        for label, _, _ in CONTENDERS:
            rates, rss = results[(name, label)]
            med = statistics.median(rates)
            print(f"| {name} | {label} | {med:.2f} | {min(rates):.2f} - {max(rates):.2f} "
                  f"| {med / base:.3f}x | {statistics.median(rss):.0f} |")

if __name__ == "__main__":
    main()
