"""The hand-written training loop in Python, for side-by-side numbers with volt.

Uses Debian's python3-torch (the same libtorch 1.13.1 build volt links) and the same data:
the first 16384 Fashion-MNIST training images, normalized as volt::FashionMnist does.
Prints "steps_per_s <value>".
"""
import argparse
import gzip
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = "/usr/share/datasets/fashion-mnist"


def load(n):
    with gzip.open(f"{ROOT}/train-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)[:n]
    with gzip.open(f"{ROOT}/train-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)[:n]
    x = (torch.from_numpy(x.copy()).float() / 255.0 - 0.2860) / 0.3530
    return x.contiguous(), torch.from_numpy(y.copy()).long()


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc0 = nn.Linear(784, 128)
        self.out = nn.Linear(128, 10)

    def forward(self, x):
        return self.out(F.relu(self.fc0(x.reshape(x.shape[0], -1))))


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.drop = nn.Dropout(0.25)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = self.drop(F.relu(self.fc1(x.reshape(x.shape[0], -1))))
        return self.fc2(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    x, y = load(16384)
    net = Mlp() if a.model == "mlp" else Cnn()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    net.train()
    n, per_epoch, done = x.shape[0], x.shape[0] // a.batch, 0
    t0 = time.perf_counter()
    while done < a.steps:
        perm = torch.randperm(n)
        for b in range(per_epoch):
            if done >= a.steps:
                break
            idx = perm[b * a.batch:(b + 1) * a.batch]
            xb, yb = x.index_select(0, idx), y.index_select(0, idx)
            opt.zero_grad()
            loss = F.cross_entropy(net(xb), yb)
            loss.backward()
            opt.step()
            done += 1
    print(f"steps_per_s {a.steps / (time.perf_counter() - t0):.2f}")


if __name__ == "__main__":
    main()
