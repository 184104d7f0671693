#!/usr/bin/python3
"""How libtorch's CPU kernels round bfloat16 arithmetic, measured (Debian's python3-torch 1.13,
the same libtorch volt links here; and torch 2.11 on the GPU machine). volt's bf16 optimizer
kernels (src/kernels/detail/multi_tensor.cpp) repeat what this prints; rerun it when libtorch
changes. 1.13: every scalar rounded to bf16. 2.11 (2026-11-26, AVX512): Python's t.mul_(s) and
div_(s) keep their scalar in float, the rest as 1.13. But C++'s Tensor::mul_(Scalar), which
torch::optim calls, is at::mul_out(self, wrapped(s), self): the scalar is the first input, which
2.x's float ("opmath") path does not take, so it is still rounded to bf16 (read in 2.x's source,
session 24). Python reaches that overload as torch.ops.aten.mul_.Scalar: part 1 compares both,
and parts 3 and 4 run torch::optim's C++ sequence with it. The model before session 24 took the
Python rule for mul_ and failed the FusedSGD/FusedAdamW bf16 tests against 2.11's torch::optim
(H200 machine, 2026-11-26: first step equal, later ones 0.8-4 % of elements apart).

    /usr/bin/python3 tools/bf16_op_rounding.py

Part 1 checks, op by op on 1e6 random elements, which of several rounding models equals
libtorch's result for every element. Part 2 runs five AdamW / Adam(L2) steps, amsgrad or not,
with torch.optim (in 1.13 the same op sequence as torch::optim in C++) against the 1.13 model
written out in float32 with a bf16 rounding after each op, and counts mismatching elements
(expect 0 on 1.13). Part 3 runs torch::optim's C++ op sequence in Python against the model for
the running torch.
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
    print("torch", torch.__version__, "threads", torch.get_num_threads())
    torch.manual_seed(0)
    a, b = torch.randn(N).to(BF), torch.randn(N).to(BF)
    c = (torch.rand(N) + 0.1).to(BF)
    s = 0.0123456
    fa, fb, fc = a.float(), b.float(), c.float()
    sb, sf = bf(scalar(s)), f32(scalar(s))
    inv = f32(scalar(1.0) / f32(scalar(0.9)).double())  # 1/0.9 computed in float
    cases = {
        "mul_(s)": (a.clone().mul_(s), {"s rounded to bf16": bf(fa * sb),
                                        "s in float": bf(fa * sf)}),
        "C++ mul_(s) (aten::mul_.Scalar)": (torch.ops.aten.mul_.Scalar(a.clone(), s),
                                            {"s rounded to bf16": bf(fa * sb),
                                             "s in float": bf(fa * sf)}),
        "add_(x, alpha)": (a.clone().add_(b, alpha=s),
                           {"one fma, alpha bf16": bf(fma(fb, sb, fa)),
                            "one fma, alpha float": bf(fma(fb, sf, fa)),
                            "alpha*x rounded first": bf(fa + bf(fb * sb)),
                            "alpha float, x*alpha then +": bf(fa + fb * sf),
                            "alpha float, alpha*x rounded": bf(fa + bf(fb * sf))}),
        "addcmul_(x, y, v)": (a.clone().addcmul_(b, c, value=s),
                              {"v in float, one rounding": bf(fa + sf * fb * fc),
                               "v float, one fma": bf(fma(sf * fb, fc, fa)),
                               "v bf16, one rounding": bf(fa + sb * fb * fc),
                               "v bf16, each op rounded": bf(fa + bf(bf(sb * fb) * fc))}),
        "addcdiv_(x, y, v)": (a.clone().addcdiv_(b, c, value=-s),
                              {"v in float, one rounding": bf(fa + -sf * fb / fc),
                               "v float, v*(x/y)": bf(fa + -sf * (fb / fc)),
                               "v bf16, one rounding": bf(fa + -sb * fb / fc),
                               "v bf16, each op rounded": bf(fa + bf(bf(-sb * fb) / fc))}),
        "div(s)": (a / 0.9, {"s rounded to bf16": bf(fa / bf(scalar(0.9))),
                             "s in float": bf(fa / f32(scalar(0.9))),
                             "times 1/s in float": bf(fa * inv)}),
        "add(s)": (a + s, {"s rounded to bf16": bf(fa + sb), "s in float": bf(fa + sf)}),
        "sqrt": (c.sqrt(), {"one rounding": bf(fc.sqrt())}),
        "maximum": (torch.maximum(a, b), {"exact": torch.maximum(fa, fb)}),
    }
    for op, (got, models) in cases.items():
        for name, want in models.items():
            same = (got.float() == want).float().mean().item()
            print(f"{op:18s} {name:28s} equal on {100 * same:7.3f}% of elements")


LR, WD, B1, B2, EPS = 0.01, 0.01, 0.9, 0.999, 1e-8
CASES = [(amsgrad, mode) for amsgrad in (False, True) for mode in ("adamw", "adam_l2")]


def torch_optim(mode, amsgrad):
    """Seeded bf16 parameters, a leaf copy of them and torch.optim's loop (foreach=False) on it."""
    torch.manual_seed(1)
    p = torch.randn(N).to(BF)
    ref = p.clone().requires_grad_()
    kind = torch.optim.AdamW if mode == "adamw" else torch.optim.Adam
    return p, ref, kind([ref], lr=LR, weight_decay=WD, amsgrad=amsgrad, foreach=False)


class Model:
    """torch::optim's AdamW / Adam(L2) step written out in float32 with one bf16 rounding per
    libtorch op; `ds` gives a div_ scalar as libtorch uses it (bf16 in 1.13, float in 2.x);
    C++'s mul_(s) rounds s to bf16 in both."""

    def __init__(self, p, mode, amsgrad, ds):
        self.mode, self.amsgrad, self.ds = mode, amsgrad, ds
        self.p, self.m, self.v, self.vmax = p.float(), torch.zeros(N), torch.zeros(N), torch.zeros(N)

    def step(self, g, step):
        ms, ds = bf, self.ds
        bc1, bc2 = 1 - B1 ** step, 1 - B2 ** step
        gi, pi = g.float(), self.p
        if self.mode == "adamw":
            pi = bf(pi * ms(scalar(1 - LR * WD)))
        else:
            gi = bf(fma(pi, bf(scalar(WD)), gi))
        self.m = bf(fma(gi, bf(scalar(1 - B1)), bf(self.m * ms(scalar(B1)))))
        self.v = bf(fma(f32(scalar(1 - B2)) * gi, gi, bf(self.v * ms(scalar(B2)))))
        d = self.v
        if self.amsgrad:
            self.vmax = torch.maximum(self.vmax, self.v)
            d = self.vmax
        d = bf(bf(bf(d.sqrt()) / ds(scalar(math.sqrt(bc2)))) + bf(scalar(EPS)))
        self.p = bf((f32(scalar(-(LR / bc1))) * self.m) / d + pi)
        return self.p


def part2():
    for amsgrad, mode in CASES:
        p, ref, opt = torch_optim(mode, amsgrad)
        model = Model(p, mode, amsgrad, bf)  # the 1.13 model
        bad = 0
        for step in range(1, 6):
            g = torch.randn(N).to(BF)
            ref.grad = g.clone()
            opt.step()
            bad += (model.step(g, step) != ref.detach().float()).sum().item()
        print(f"{mode:8s} amsgrad={amsgrad!s:5s} 5 steps: {bad} mismatching elements")


def part3():
    """torch::optim's C++ AdamW/Adam op sequence, run here op by op on bf16 tensors, against
    torch.optim (foreach=False): equal in 1.13; in 2.x Python's loop (lerp_, ...) may differ,
    and then only part 1 says what the C++ sequence rounds like."""
    # The model for the running torch: 2.x divides by a float scalar.
    ds = f32 if int(torch.__version__.split(".")[0]) >= 2 else bf
    cxx_mul_ = torch.ops.aten.mul_.Scalar  # Tensor::mul_(Scalar), as C++ calls it
    for amsgrad, mode in CASES:
        p, ref, opt = torch_optim(mode, amsgrad)
        model = Model(p, mode, amsgrad, ds)
        m, v, vmax = (torch.zeros(N, dtype=BF) for _ in range(3))
        bad = bad_model = 0
        for step in range(1, 6):
            g = torch.randn(N).to(BF)
            ref.grad = g.clone()
            opt.step()
            pe = model.step(g, step)
            bc1, bc2 = 1 - B1 ** step, 1 - B2 ** step
            if mode == "adamw":
                cxx_mul_(p, 1 - LR * WD)
            else:
                g = g.add(p, alpha=WD)
            cxx_mul_(m, B1).add_(g, alpha=1 - B1)
            cxx_mul_(v, B2).addcmul_(g, g, value=1 - B2)
            d = v
            if amsgrad:
                torch.maximum(vmax, v, out=vmax)
                d = vmax
            denom = (d.sqrt() / math.sqrt(bc2)).add_(EPS)
            p.addcdiv_(m, denom, value=-(LR / bc1))
            bad += (p != ref.detach()).sum().item()
            where = (pe != p.float()).nonzero().flatten().tolist()
            bad_model += len(where)
            if where and mode == "adamw" and not amsgrad:
                print("  step", step, "mismatch at", where[:8], "of", N)
        print(f"C++ sequence vs torch.optim {mode:8s} amsgrad={amsgrad!s:5s}: {bad} mismatches;"
              f" vs the model for this torch: {bad_model}")


SGD_CASES = [  # (name, momentum, dampening, nesterov, weight decay)
    ("momentum", 0.9, 0.0, False, 0.0),
    ("dampening", 0.8, 0.3, False, 0.0),
    ("nesterov", 0.9, 0.0, True, 0.0),
    ("all", 0.9, 0.0, True, 0.01),
]


def part4():
    """torch::optim's C++ SGD op sequence, op by op on bf16 tensors, against volt's bf16 SGD
    model for the running torch (src/kernels/detail/multi_tensor.cpp, sgd_body_bf16); the
    FusedSGD bf16 tests compare the same pair in C++."""
    cxx_mul_ = torch.ops.aten.mul_.Scalar  # Tensor::mul_(Scalar), as C++ calls it
    lr = 0.05
    for name, mom, damp, nesterov, wd in SGD_CASES:
        torch.manual_seed(2)
        p = torch.randn(N).to(BF)
        pm, buf, bm = p.float(), None, None
        bad = 0
        for step in range(6):
            g = torch.randn(N).to(BF)
            # torch::optim::SGD::step, as libtorch writes it in C++.
            d = g.add(p, alpha=wd) if wd != 0 else g
            if buf is None:
                buf = d.clone()
            else:
                cxx_mul_(buf, mom).add_(d, alpha=1 - damp)
            d = d.add(buf, alpha=mom) if nesterov else buf
            p.add_(d, alpha=-lr)
            # The model: one bf16 rounding per op.
            dm = g.float()
            if wd != 0:
                dm = bf(fma(pm, bf(scalar(wd)), dm))
            bm = dm if bm is None else bf(fma(dm, bf(scalar(1 - damp)), bf(bm * bf(scalar(mom)))))
            dm = bf(fma(bm, bf(scalar(mom)), dm)) if nesterov else bm
            pm = bf(fma(dm, bf(scalar(-lr)), pm))
            where = (pm != p.float()).nonzero().flatten().tolist()
            bad += len(where)
            if where and step < 3:
                i = where[0]
                print(f"  sgd {name} step {step}: {len(where)} mismatches, first at [{i}]: torch"
                      f" {p[i].item()!r}, model {pm[i].item()!r}")
        print(f"C++ SGD sequence vs the model for this torch, {name:9s}: {bad} mismatches")


if __name__ == "__main__":
    part1()
    part2()
    part3()
    part4()
