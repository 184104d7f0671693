"""The plain PyTorch loop and PyTorch Lightning on a CUDA GPU, for the side-by-side with
volt_bench_cuda_loop (same models, data, batch sizes and optimizer): the Fashion-MNIST MLP
784-256-128-10 at batch 128 and the demo CNN at batch 64, Adam(lr=1e-3) (as written, which is
the foreach implementation on CUDA, and with fused=True), the first 16384
training images on the CPU. Prints steps/s (median of the rounds, after a warm-up round).

    python3 benchmarks/cuda_loop.py [--rounds R] [--mlp-steps N] [--cnn-steps N] [--no-lightning]
                                    [--only mlp|cnn] [--cudnn-benchmark]

--cudnn-benchmark: cuDNN autotuning on for both (torch.backends.cudnn.benchmark, Lightning's
Trainer(benchmark=True)), as volt_bench_cuda_loop's flag does for volt and the hand loop.
"""
import argparse
import os
import sys
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_loop import Cnn, load  # noqa: E402  (the same data and demo CNN)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc0 = nn.Linear(784, 256)
        self.fc1 = nn.Linear(256, 128)
        self.out = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.fc0(x.reshape(x.shape[0], -1)))
        return self.out(F.relu(self.fc1(x)))


def plain(make, x, y, batch, steps, cudnn_benchmark, fused=False):
    torch.backends.cudnn.benchmark = cudnn_benchmark
    net = make().cuda()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, fused=fused or None)
    net.train()
    n, per_epoch, done = x.shape[0], x.shape[0] // batch, 0
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while done < steps:
        perm = torch.randperm(n)
        for b in range(per_epoch):
            if done >= steps:
                break
            idx = perm[b * batch:(b + 1) * batch]
            xb, yb = x.index_select(0, idx).cuda(), y.index_select(0, idx).cuda()
            opt.zero_grad()
            loss = F.cross_entropy(net(xb), yb)
            loss.backward()
            opt.step()
            done += 1
    torch.cuda.synchronize()
    return steps / (time.perf_counter() - t0)


def lightning(make, x, y, batch, steps, cudnn_benchmark, fused=False):
    import pytorch_lightning as pl

    class Lit(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = make()

        def training_step(self, b, i):
            loss = F.cross_entropy(self.net(b[0]), b[1])
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3, fused=fused or None)

    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch,
                                     shuffle=True)
    t = pl.Trainer(accelerator="gpu", devices=1, max_steps=steps, logger=False,
                   enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, num_sanity_val_steps=0,
                   benchmark=cudnn_benchmark)
    m = Lit()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    t.fit(m, dl)
    torch.cuda.synchronize()
    return steps / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mlp-steps", type=int, default=2000)
    ap.add_argument("--cnn-steps", type=int, default=1000)
    ap.add_argument("--no-lightning", action="store_true")
    ap.add_argument("--only", choices=("mlp", "cnn"))
    ap.add_argument("--cudnn-benchmark", action="store_true")
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    os.environ.setdefault("PL_DISABLE_FORK", "1")
    x, y = load(16384)
    for name, make, batch, steps in (("mlp 784-256-128-10", Mlp, 128, a.mlp_steps),
                                     ("cnn (demo)", Cnn, 64, a.cnn_steps)):
        if a.only and not name.startswith(a.only):
            continue
        # Adam as written (foreach on CUDA), then Adam(fused=True), on each side.
        res = {"python torch loop": [], "lightning": [], "python torch loop, fused Adam": [],
               "lightning, fused Adam": []}
        for r in range(-1, a.rounds):
            got = {}
            for fused in (False, True):
                tag = ", fused Adam" if fused else ""
                torch.manual_seed(r + 1)
                got["python torch loop" + tag] = plain(make, x, y, batch, steps,
                                                       a.cudnn_benchmark, fused)
                got["lightning" + tag] = 0 if a.no_lightning else lightning(
                    make, x, y, batch, steps, a.cudnn_benchmark, fused)
            if r >= 0:
                for k, v in got.items():
                    res[k].append(v)
        tuned = ", cuDNN autotuning on" if a.cudnn_benchmark else ""
        print(f"\n{name}, batch {batch}, Adam, {steps} steps x {a.rounds} rounds{tuned} "
              "(median steps/s)")
        for k, v in res.items():
            print(f"  {k:28s} {sorted(v)[len(v) // 2]:9.1f}")


if __name__ == "__main__":
    import pytorch_lightning
    print("torch", torch.__version__, "lightning", pytorch_lightning.__version__,
          torch.cuda.get_device_name())
    main()
