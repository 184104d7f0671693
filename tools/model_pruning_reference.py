#!/usr/bin/python3
"""Reference fits with Lightning's ModelPruning for tests/callbacks/model_pruning_test.cpp.

Run with Debian's python3-torch (1.13):

    /usr/bin/python3 tools/model_pruning_reference.py [tests/callbacks/data/model_pruning_reference.json]

Lightning itself is not installable here, so its callback is written out below from
lightning.pytorch.callbacks.pruning (2.6) around PyTorch's own torch.nn.utils.prune, which does
the pruning: resolve the parameters at setup (every layer's weights, then every layer's biases,
unless listed) and copy them for the lottery ticket; after each training epoch (which, as in
Lightning's loop, ends with the validation pass, so the pruning hooks' `weight` attributes hold
the current weights) prune by `amount` (global_unstructured over all of them, or the method per
parameter), then rewind the remaining weights to the copies (or to new values from
reset_parameters with resample_parameters); at the end of training make the pruning permanent.

One departure of volt is modelled on purpose: Lightning's `_copy_param` assigns the copy's
tensor as the weight's `.data` without copying it, so the copy then trains with the weight and a
later rewind rewinds to nothing; the rewind here copies (the lottery ticket's initial values
every time), as volt does.

Each case holds the data, the initial state, the final state, and the zeros of each pruned
parameter after each epoch. Floats are written with repr(), so they round-trip exactly.
"""

import copy
import json
import sys

import torch
from torch import nn
from torch.nn.utils import prune


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


METHODS = {"l1_unstructured": (prune.L1Unstructured, prune.l1_unstructured),
           "random_unstructured": (prune.RandomUnstructured, prune.random_unstructured),
           "ln_structured": (prune.LnStructured, prune.ln_structured),
           "random_structured": (prune.RandomStructured, prune.random_structured)}


def plain_state(model):
    """Parameters by their unpruned names (weight = weight_orig * weight_mask while pruned)."""
    out = {}
    for name, module in (("fc1", model.fc1), ("fc2", model.fc2)):
        for p in ("weight", "bias"):
            out[name + "." + p] = getattr(module, p).detach().reshape(-1).tolist()
    return out


def amount_of(case, epoch):
    a = case["amounts"][min(epoch, len(case["amounts"]) - 1)]
    return a  # an int is a count, a float a fraction, as PyTorch's


def run(case):
    torch.manual_seed(case["seed"])
    g = torch.Generator().manual_seed(case["seed"])
    x = torch.randn(case["samples"], 8, generator=g)
    y = (x.sum(1) > 0).long()
    xv = torch.randn(32, 8, generator=g)
    model = Net()
    init = plain_state(model)
    # What volt's test seeds before fit (the random methods and resampling draw from it).
    torch.manual_seed(case["fit_seed"])
    layers = {"fc1": model.fc1, "fc2": model.fc2}
    names = case["parameter_names"]
    params = [(layers[m], p) for p in names for m in ("fc1", "fc2")]
    keys = [m + "." + p for p in names for m in ("fc1", "fc2")]
    originals = {m: copy.deepcopy(layers[m]) for m in ("fc1", "fc2")}
    initial = {k: getattr(layers[k.split(".")[0]], k.split(".")[1]).detach().clone() for k in keys}
    if case["optimizer"] == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=case["lr"], momentum=0.9, weight_decay=1e-3)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=case["lr"])
    method_cls, method_fn = METHODS[case["pruning_fn"]]
    extra = {}
    if case["pruning_fn"].endswith("_structured"):
        extra["dim"] = case["pruning_dim"]
    if case["pruning_fn"] == "ln_structured":
        extra["n"] = case["pruning_norm"]
    zeros = []
    for epoch in range(case["epochs"]):
        model.train()
        for i in range(0, case["samples"], case["batch"]):
            loss = nn.functional.cross_entropy(model(x[i:i + case["batch"]]),
                                               y[i:i + case["batch"]])
            loss.backward()
            if case.get("clip"):  # Lightning's clip_gradients (the pruned weights' are masked)
                torch.nn.utils.clip_grad_norm_(model.parameters(), case["clip"])
            opt.step()
            opt.zero_grad(set_to_none=True)
        model.eval()
        with torch.no_grad():
            model(xv)  # the validation pass (refreshes the pruned `weight` attributes)
        # ModelPruning._run_pruning at on_train_epoch_end
        amount = amount_of(case, epoch)
        if amount:
            if case["use_global_unstructured"]:
                prune.global_unstructured(params, pruning_method=method_cls, amount=amount)
            else:
                for module, name in params:
                    method_fn(module, name=name, amount=amount, **extra)
            if case["lottery"]:
                if case["resample"]:
                    for m in ("fc1", "fc2"):
                        fresh = copy.deepcopy(originals[m])  # Lightning: a copy of setup's copy
                        fresh.reset_parameters()
                        for k in keys:
                            if k.startswith(m + "."):
                                p = k.split(".")[1]
                                dst = getattr(layers[m], p + "_orig", None)
                                dst = dst if dst is not None else getattr(layers[m], p)
                                dst.data = getattr(fresh, p).data.clone()
                else:
                    for k in keys:
                        m, p = k.split(".")
                        dst = getattr(layers[m], p + "_orig", None)
                        dst = dst if dst is not None else getattr(layers[m], p)
                        dst.data = initial[k].clone()
        zeros.append([int((getattr(layers[k.split(".")[0]], k.split(".")[1] + "_mask",
                                   torch.ones(1)) == 0).sum()) for k in keys])
    for module, name in params:  # make_pruning_permanent at on_train_end
        if hasattr(module, name + "_mask"):
            prune.remove(module, name)
    return {"x": x.reshape(-1).tolist(), "xv": xv.reshape(-1).tolist(), "init": init,
            "keys": keys, "zeros": zeros, "final": plain_state(model)}


CASES = [
    # Lightning's defaults: global L1 over every weight and bias, half of what is left each
    # epoch, rewound to the initial values each time; SGD with momentum and weight decay, and
    # gradients clipped by norm (which sees the pruned weights' gradients as zero).
    {"name": "global_l1_lottery", "seed": 3, "fit_seed": 11, "samples": 64, "batch": 16, "clip": 0.15,
     "epochs": 3, "lr": 0.1, "optimizer": "sgd", "pruning_fn": "l1_unstructured",
     "parameter_names": ["weight", "bias"], "use_global_unstructured": True, "amounts": [0.5],
     "lottery": True, "resample": False},
    # Whole input columns of each weight by their L2 norm, 2 per epoch (a count), no rewind.
    {"name": "ln_structured_count", "seed": 5, "fit_seed": 11, "samples": 64, "batch": 16,
     "epochs": 3, "lr": 0.1, "optimizer": "sgd", "pruning_fn": "ln_structured",
     "pruning_dim": 1, "pruning_norm": 2, "parameter_names": ["weight"],
     "use_global_unstructured": False, "amounts": [2], "lottery": False, "resample": False},
    # Random entries per parameter, an amount that changes by epoch (none in the first), and
    # rewinds to resampled values; Adam.
    {"name": "random_resample", "seed": 7, "fit_seed": 13, "samples": 64, "batch": 16,
     "epochs": 3, "lr": 0.01, "optimizer": "adam", "pruning_fn": "random_unstructured",
     "parameter_names": ["weight", "bias"], "use_global_unstructured": False,
     "amounts": [0.0, 0.3, 0.5], "lottery": True, "resample": True},
]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/callbacks/data/model_pruning_reference.json"
    cases = [{"case": case, **run(case)} for case in CASES]
    with open(out, "w") as f:
        json.dump({"torch": torch.__version__, "cases": cases}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
