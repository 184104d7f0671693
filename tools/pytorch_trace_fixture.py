#!/usr/bin/python3
"""A real PyTorch-profiler Chrome trace for tests/cli/perf_scan_test.cpp (`volt perf --trace`).

Regenerate with Debian's python3-torch (1.13):

    /usr/bin/python3 tools/pytorch_trace_fixture.py [tests/cli/data/pytorch_1.13_cpu.pt.trace.json]

A small training loop (MLP, DataLoader, SGD, and `loss.item()` every step: one host read per
step) runs under torch.profiler.profile with schedule(wait=1, warmup=1, active=3, repeat=1), and
export_chrome_trace writes the three active steps. Debian's torch is built without kineto, so
this is the autograd profiler's legacy format: a JSON array of complete events without "cat",
pid "CPU functions", PyTorch's own record_function names (ProfilerStep#N,
enumerate(DataLoader)#..., Optimizer.step#SGD.step, ...). Timings differ run to run; the test
checks only what does not (steps, host reads per step, which names are regions).
"""

import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile, schedule


def main(out):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.utils.data.TensorDataset(torch.randn(6 * 32, 64), torch.randint(0, 4, (6 * 32,)))
    loader = torch.utils.data.DataLoader(data, batch_size=32)
    losses = []
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=1, warmup=1, active=3, repeat=1)) as prof:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())  # the symptom: a host read per step
            prof.step()
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    prof.export_chrome_trace(out)
    print(f"wrote {out} ({os.path.getsize(out)} bytes); losses {losses}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/cli/data/pytorch_1.13_cpu.pt.trace.json")
