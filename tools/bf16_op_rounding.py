#!/usr/bin/python3
"""How libtorch's CPU kernels round bfloat16 arithmetic, measured (Debian's python3-torch 1.13,
the same libtorch volt links). volt's bf16 optimizer kernels (src/kernels/detail/multi_tensor.cpp)
repeat what this prints; rerun it when libtorch changes.

    /usr/bin/python3 tools/bf16_op_rounding.py

Part 1 checks, op by op on 1e6 random elements, which of several rounding models equals
libtorch's result for every element. Part 2 runs five AdamW / Adam(L2) steps, amsgrad or not,
with torch.optim (the same op sequence as torch::optim in C++) against the chosen model written
out in float32 with a bf16 rounding after each op, and counts mismatching elements (expect 0).
Both use tensors far larger than a vector, so libtorch's vector lanes decide; in the scalar tail
of a loop add_(x, alpha) rounds alpha * x before adding (tests/kernels/fused_optim_test.cpp).
"""
import math

import torch

BF = torch.bfloat16
N = 1_000_003


def bf(x):
    """Round to bf16 (nearest even), back to float32."""
    return x.to(BF).float()


def f32(x):
    return x.to(torch.float32)


def fma(a, b, c):
    """float32 fma: the product of two floats is exact in double."""
    return f32(a.double() * b.double() + c.double())


def scalar(x):
    return torch.tensor(x, dtype=torch.float64)


def part1():
    torch.manual_seed(0)
    a, b = torch.randn(N).to(BF), torch.randn(N).to(BF)
    c = (torch.rand(N) + 0.1).to(BF)
    s = 0.0123456
    fa, fb, fc = a.float(), b.float(), c.float()
    cases = {
        "mul_(s)": (a.clone().mul_(s), {"s rounded to bf16": bf(fa * bf(scalar(s))),
                                        "s in float": bf(fa * f32(scalar(s)))}),
        "add_(x, alpha)": (a.clone().add_(b, alpha=s),
                           {"one fma, alpha bf16": bf(fma(fb, bf(scalar(s)), fa)),
                            "alpha*x rounded first": bf(fa + bf(fb * bf(scalar(s))))}),
        "addcmul_(x, y, v)": (a.clone().addcmul_(b, c, value=s),
                              {"v in float, one rounding": bf(fa + f32(scalar(s)) * fb * fc),
                               "v bf16, each op rounded": bf(fa + bf(bf(bf(scalar(s)) * fb) * fc))}),
        "addcdiv_(x, y, v)": (a.clone().addcdiv_(b, c, value=-s),
                              {"v in float, one rounding": bf(fa + f32(scalar(-s)) * fb / fc),
                               "v bf16, each op rounded": bf(fa + bf(bf(bf(scalar(-s)) * fb) / fc))}),
        "div(s)": (a / 0.9, {"s rounded to bf16": bf(fa / bf(scalar(0.9))),
                             "s in float": bf(fa / f32(scalar(0.9)))}),
        "sqrt": (c.sqrt(), {"one rounding": bf(fc.sqrt())}),
    }
    for op, (got, models) in cases.items():
        for name, want in models.items():
            same = (got.float() == want).float().mean().item()
            print(f"{op:18s} {name:28s} equal on {100 * same:7.3f}% of elements")


def part2():
    lr, wd, b1, b2, eps = 0.01, 0.01, 0.9, 0.999, 1e-8
    for amsgrad in (False, True):
        for mode in ("adamw", "adam_l2"):
            torch.manual_seed(1)
            p = torch.randn(N).to(BF)
            ref = p.clone().requires_grad_()
            kind = torch.optim.AdamW if mode == "adamw" else torch.optim.Adam
            opt = kind([ref], lr=lr, weight_decay=wd, amsgrad=amsgrad, foreach=False)
            pe, m, v, vmax = p.float(), torch.zeros(N), torch.zeros(N), torch.zeros(N)
            bad = 0
            for step in range(1, 6):
                g = torch.randn(N).to(BF)
                ref.grad = g.clone()
                opt.step()
                bc1, bc2 = 1 - b1 ** step, 1 - b2 ** step
                gi, pi = g.float(), pe
                if mode == "adamw":
                    pi = bf(pi * bf(scalar(1 - lr * wd)))
                else:
                    gi = bf(fma(pi, bf(scalar(wd)), gi))
                m = bf(fma(gi, bf(scalar(1 - b1)), bf(m * bf(scalar(b1)))))
                v = bf(fma(f32(scalar(1 - b2)) * gi, gi, bf(v * bf(scalar(b2)))))
                d = v
                if amsgrad:
                    vmax = torch.maximum(vmax, v)
                    d = vmax
                d = bf(bf(bf(d.sqrt()) / bf(scalar(math.sqrt(bc2)))) + bf(scalar(eps)))
                pe = bf((f32(scalar(-(lr / bc1))) * m) / d + pi)
                bad += (pe != ref.detach().float()).sum().item()
            print(f"{mode:8s} amsgrad={amsgrad!s:5s} 5 steps: {bad} mismatching elements")


if __name__ == "__main__":
    part1()
    part2()
