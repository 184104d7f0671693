"""GPT-2 training throughput as a plain PyTorch loop and under PyTorch Lightning, for the side
by side with volt_bench_gpt2 (issue #14): the same model as examples/gpt2.h (pre-norm blocks,
causal scaled_dot_product_attention, tanh GELU, tied output projection, GPT-2's init), the same
synthetic tokens, bf16 autocast ("bf16-mixed" in Lightning), AdamW(lr 6e-4, betas 0.9/0.95,
weight decay 0.1, fused on CUDA). Tokens/s over the steps after the warm-up ones (synchronized
at both ends), median of the rounds.

    python3 benchmarks/gpt2.py [--device cuda|cpu] [--layers L] [--dim D] [--heads H]
                               [--vocab V] [--seq T] [--batch B] [--steps S] [--warmup W]
                               [--rounds R] [--no-lightning]

Defaults on CUDA: GPT-2 small, batch 16 x 1024, 30 steps (10 warm up), 2 rounds. With --device
cpu the defaults shrink to volt_bench_gpt2's smoke configuration; Lightning is skipped where it
is not installed.
"""
import argparse
import math
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F


def attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    return s.masked_fill(mask, float("-inf")).softmax(-1) @ v


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.c_attn, self.attn_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.c_fc, self.mlp_proj = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).chunk(3, -1)
        split = lambda u: u.reshape(b, t, self.heads, c // self.heads).transpose(1, 2)  # noqa
        a = attention(split(q), split(k), split(v)).transpose(1, 2).reshape(b, t, c)
        x = x + self.attn_proj(a)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt2(nn.Module):
    def __init__(self, vocab, context, layers, heads, dim):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
        self.h = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        resid = 0.02 / math.sqrt(2 * layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "ln_" in name:
                    continue
                if name.endswith("bias"):
                    p.zero_()
                else:
                    p.normal_(0.0, resid if "_proj." in name else 0.02)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.h:
            x = blk(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def lm_loss(net, x, y):
    logits = net(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))


def adamw(params, device):
    kw = dict(lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    if device == "cuda":
        kw["fused"] = True
    return torch.optim.AdamW(params, **kw)


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def plain(a, x, y, warm=None):
    """The plain loop; `warm` runs after the first a.warmup steps (synchronized)."""
    torch.manual_seed(1)
    net = Gpt2(a.vocab, a.context, a.layers, a.heads, a.dim).to(a.device)
    opt = adamw(net.parameters(), a.device)
    net.train()
    t0 = None
    for i in range(a.steps):
        xb = x[i * a.batch:(i + 1) * a.batch].to(a.device, non_blocking=True)
        yb = y[i * a.batch:(i + 1) * a.batch].to(a.device, non_blocking=True)
        opt.zero_grad()
        with torch.autocast(a.device, dtype=torch.bfloat16):
            loss = lm_loss(net, xb, yb)
        loss.backward()
        opt.step()
        if i + 1 == a.warmup:
            sync(a.device)
            if warm:
                warm()
            t0 = time.perf_counter()
    sync(a.device)
    return (a.steps - a.warmup) * a.batch * a.seq / (time.perf_counter() - t0), loss.item()


def trace_plain(a, x, y):
    """The plain loop again, its last 3 steps under torch.profiler (GPU activity only; CPU ops
    on the CPU), saved as a Chrome trace to a.trace (tools/kernel_table.py compares it with volt_bench_gpt2's)."""
    from torch.profiler import ProfilerActivity, profile
    b = argparse.Namespace(**vars(a))
    b.warmup = b.steps - 3
    p = profile(activities=[ProfilerActivity.CUDA if a.device == "cuda" else ProfilerActivity.CPU])
    plain(b, x, y, warm=p.__enter__)
    p.__exit__(None, None, None)
    p.export_chrome_trace(a.trace)
    print(f"  trace of the plain loop's last 3 steps: {a.trace}")


def lightning(a, x, y):
    import pytorch_lightning as pl

    class Clock(pl.Callback):
        t0 = t1 = 0.0

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx + 1 == a.warmup:
                sync(a.device)
                self.t0 = time.perf_counter()

        def on_train_end(self, trainer, module):
            sync(a.device)
            self.t1 = time.perf_counter()

    class Lit(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = Gpt2(a.vocab, a.context, a.layers, a.heads, a.dim)

        def training_step(self, b, i):
            loss = lm_loss(self.net, b[0], b[1])
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return adamw(self.parameters(), a.device)

    torch.manual_seed(1)
    m = Lit()
    clock = Clock()
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=a.batch,
                                     pin_memory=a.device == "cuda")
    t = pl.Trainer(accelerator="gpu" if a.device == "cuda" else "cpu", devices=1,
                   precision="bf16-mixed", max_steps=a.steps, logger=False,
                   enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, num_sanity_val_steps=0, callbacks=[clock])
    t.fit(m, dl)
    loss = t.callback_metrics.get("train_loss")
    return ((a.steps - a.warmup) * a.batch * a.seq / (clock.t1 - clock.t0),
            float(loss) if loss is not None else float("nan"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    for flag in ("layers", "dim", "heads", "vocab", "seq", "batch", "steps", "warmup", "rounds"):
        ap.add_argument("--" + flag, type=int)
    ap.add_argument("--no-lightning", action="store_true")
    ap.add_argument("--trace", help="after the rounds, a Chrome trace of the plain loop's last "
                    "3 steps (GPU kernels) to this file")
    a = ap.parse_args()
    big = dict(layers=12, dim=768, heads=12, vocab=50257, seq=1024, batch=16, steps=30,
               warmup=10, rounds=2)
    small = dict(layers=2, dim=64, heads=4, vocab=512, seq=64, batch=4, steps=8, warmup=3,
                 rounds=2)
    for k, v in (big if a.device == "cuda" else small).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.context = max(1024 if a.device == "cuda" else 64, a.seq)
    if a.warmup >= a.steps:
        a.warmup = a.steps // 2
    warnings.filterwarnings("ignore")
    try:
        import pytorch_lightning
        have_pl = not a.no_lightning
        pl_version = pytorch_lightning.__version__
    except ImportError:
        have_pl, pl_version = False, "not installed"
    print("torch", torch.__version__, "lightning", pl_version,
          torch.cuda.get_device_name() if a.device == "cuda" else "cpu")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(a.vocab, (a.steps * a.batch, a.seq + 1), generator=g)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    n = sum(p.numel() for p in Gpt2(a.vocab, a.context, a.layers, a.heads, a.dim).parameters())
    print(f"GPT-2 {a.layers} layers, dim {a.dim}, {a.heads} heads, vocab {a.vocab} "
          f"({n / 1e6:.1f}M parameters), batch {a.batch} x {a.seq} tokens, bf16, AdamW; "
          f"{a.steps} steps, the first {a.warmup} warm up; {a.rounds} rounds")
    res = {"python torch loop": [], "lightning": []}
    last = {}
    for r in range(-1, a.rounds):
        p, last["python torch loop"] = plain(a, x, y)
        lt = 0.0
        if have_pl:
            lt, last["lightning"] = lightning(a, x, y)
        if r >= 0:
            res["python torch loop"].append(p)
            res["lightning"].append(lt)
    for k, v in res.items():
        if k == "lightning" and not have_pl:
            print(f"  {k:22s} skipped (pytorch_lightning {pl_version})")
            continue
        print(f"  {k:22s} {sorted(v)[len(v) // 2]:12.0f} tokens/s   last loss {last[k]:.4f}")
    if a.trace:
        trace_plain(a, x, y)


if __name__ == "__main__":
    main()
