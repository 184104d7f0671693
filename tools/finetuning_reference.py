#!/usr/bin/python3
"""Reference fits with Lightning's BackboneFinetuning for tests/callbacks/finetuning_test.cpp.

Run with Debian's python3-torch (1.13):

    /usr/bin/python3 tools/finetuning_reference.py [tests/callbacks/data/finetuning_reference.json]

Lightning itself is not installable here, so its algorithm is written out below from
lightning.pytorch.callbacks.finetuning (2.6): freeze the backbone before configure_optimizers
(which takes the parameters that require a gradient), call finetune_function when each training
epoch starts (unfreeze_and_add_param_group at unfreeze_backbone_at_epoch, then the backbone's
rate times lambda_func(epoch + 1), capped at the first group's when should_align), then train
the epoch with plain SGD steps and step an epoch-interval StepLR after it, as Lightning's loop.
A frozen BatchNorm layer is PyTorch's: track_running_stats = False (batch statistics in
training, running statistics unchanged).

One departure of volt is modelled on purpose, and only in the case that says so
("freeze_with_train_bn"): Lightning's BackboneFinetuning.freeze_before_training calls
freeze(backbone) with its default train_bn=True, so the backbone's BatchNorm layers train while
it is frozen whatever train_bn says; volt passes train_bn.

Each case holds the data, the initial state (parameters and buffers by name), the learning rate
of every param group during each epoch, and the final state. Floats are written with repr(), so
they round-trip exactly.
"""

import json
import sys

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


def flatten_modules(modules):
    return [m for m in modules.modules() if not list(m.children()) or m._parameters]


def filter_params(modules, train_bn=True, requires_grad=True):
    for mod in flatten_modules(modules):
        if isinstance(mod, _BatchNorm) and not train_bn:
            continue
        for p in mod.parameters(recurse=False):
            if p.requires_grad == requires_grad:
                yield p


def make_trainable(modules):
    for m in flatten_modules(modules):
        if isinstance(m, _BatchNorm):
            m.track_running_stats = True
        for p in m.parameters(recurse=False):
            p.requires_grad = True


def freeze_module(m):
    if isinstance(m, _BatchNorm):
        m.track_running_stats = False
    for p in m.parameters(recurse=False):
        p.requires_grad = False


def freeze(modules, train_bn=True):
    for m in flatten_modules(modules):
        if isinstance(m, _BatchNorm) and train_bn:
            make_trainable(m)
        else:
            freeze_module(m)


def unfreeze_and_add_param_group(modules, optimizer, lr=None, initial_denom_lr=10.0, train_bn=True):
    make_trainable(modules)
    params_lr = optimizer.param_groups[0]["lr"] if lr is None else float(lr)
    denom_lr = initial_denom_lr if lr is None else 1.0
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    params = [p for p in filter_params(modules, train_bn, True) if id(p) not in held]
    if params:
        optimizer.add_param_group({"params": params, "lr": params_lr / denom_lr})


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU())
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        return self.head(self.backbone(x))


def state_of(model):
    return {k: v.detach().reshape(-1).tolist() for k, v in model.state_dict().items()}


def run(case):
    torch.manual_seed(case["seed"])
    g = torch.Generator().manual_seed(case["seed"])
    x = torch.randn(case["samples"], 8, generator=g)
    y = (x.sum(1) > 0).long()
    model = Net()
    init = state_of(model)
    # setup: freeze before configure_optimizers
    freeze(model.backbone, case["train_bn"] if case["freeze_with_train_bn"] else True)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=case["lr"],
                          momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, case["step_size"], 0.5) if case["step_size"] else None
    previous = None
    lrs = []
    at = case["unfreeze_backbone_at_epoch"]
    factor = case["lambda_factor"]
    for epoch in range(case["epochs"]):
        # BackboneFinetuning.finetune_function
        current = opt.param_groups[0]["lr"]
        if epoch == at:
            first = case["backbone_initial_lr"] or current * case["backbone_initial_ratio_lr"]
            previous = first
            unfreeze_and_add_param_group(model.backbone, opt, first, 10.0, case["train_bn"])
        elif epoch > at:
            nxt = factor * previous
            nxt = current if (case["should_align"] and nxt > current) else nxt
            opt.param_groups[-1]["lr"] = nxt
            previous = nxt
        lrs.append([grp["lr"] for grp in opt.param_groups])
        model.train()
        for i in range(0, case["samples"], case["batch"]):
            loss = nn.functional.cross_entropy(model(x[i:i + case["batch"]]), y[i:i + case["batch"]])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if sched is not None:
            sched.step()
    return {"x": x.reshape(-1).tolist(), "init": init, "lrs": lrs, "final": state_of(model)}


CASES = [
    # Lightning's defaults but a short run: unfreeze at 1, the rate doubles until it meets the
    # head's (which a StepLR halves every 2 epochs).
    {"name": "ratio_aligned_steplr", "seed": 3, "samples": 64, "batch": 16, "epochs": 5,
     "lr": 0.1, "step_size": 2, "unfreeze_backbone_at_epoch": 1, "backbone_initial_ratio_lr": 0.3,
     "backbone_initial_lr": None, "should_align": True, "lambda_factor": 2.0, "train_bn": True,
     "freeze_with_train_bn": False},
    # train_bn false: the backbone's BatchNorm is frozen with it (running statistics kept) and
    # stays out of the new group; a fixed starting rate growing 1.5x without alignment.
    {"name": "frozen_batchnorm_unaligned", "seed": 5, "samples": 64, "batch": 16, "epochs": 5,
     "lr": 0.05, "step_size": 0, "unfreeze_backbone_at_epoch": 2,
     "backbone_initial_ratio_lr": 0.1, "backbone_initial_lr": 0.02, "should_align": False,
     "lambda_factor": 1.5, "train_bn": False, "freeze_with_train_bn": True},
]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/callbacks/data/finetuning_reference.json"
    cases = []
    for case in CASES:
        cases.append({"case": case, **run(case)})
    with open(out, "w") as f:
        json.dump({"torch": torch.__version__, "cases": cases}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
