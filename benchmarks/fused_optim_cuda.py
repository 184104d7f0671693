"""torch.optim.AdamW in Python on CUDA as a for-loop, foreach and fused, on the shapes
volt_bench_fused_optim_cuda uses (150 x 64x64; GPT-2 124M), timed the same way: rounds of
`steps` steps between two device synchronizations, median milliseconds per step.

    python3 benchmarks/fused_optim_cuda.py [rounds] [steps]
"""
import sys
import time

import torch


def small_set():
    return "150 x 64x64", [(64, 64)] * 150


def gpt2():
    shapes = [(50257, 768), (1024, 768)]
    for _ in range(12):
        shapes += [(768,), (768,), (768, 2304), (2304,), (768, 768), (768,), (768,), (768,),
                   (768, 3072), (3072,), (3072, 768), (768,)]
    shapes += [(768,), (768,)]
    return "GPT-2 124M (148 tensors)", shapes


def make(shapes):
    torch.manual_seed(0)
    ps = []
    for s in shapes:
        p = torch.randn(s, device="cuda", requires_grad=True)
        p.grad = torch.randn(s, device="cuda") * 1e-3
        ps.append(p)
    return ps


def ms_per_step(step, steps):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / steps


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("| workload | torch.optim.AdamW | ms per step |")
    print("|---|---|---|")
    for name, shapes in (small_set(), gpt2()):
        opts = {}
        for mode, kw in (("for-loop", dict(foreach=False)), ("foreach", dict(foreach=True)),
                         ("fused", dict(fused=True))):
            opts[mode] = torch.optim.AdamW(make(shapes), lr=1e-4, weight_decay=0.01, **kw)
        for o in opts.values():
            for _ in range(5):
                o.step()
        times = {m: [] for m in opts}
        for _ in range(rounds):
            for m, o in opts.items():
                times[m].append(ms_per_step(o.step, steps))
        for m in opts:
            t = sorted(times[m])[len(times[m]) // 2]
            print(f"| {name} | {m} | {t:.3f} |")


if __name__ == "__main__":
    main()
