#!/usr/bin/python3
"""Runs a TorchScript file volt exported with python3-torch only (no volt code) and prints, as
JSON, what Python sees: the module's training flag, its parameter and buffer names, and for each
case the largest difference between its outputs and the ones volt's function computed. volt's
tests run it to show that the export is a plain TorchScript module Python runs alike.

CASES is a file of torch::pickle_save(dict) with "input_<c>_<i>" (case c's input i) and
"output_<c>_<k>" (the function's output k on case c).

Usage: /usr/bin/python3 tools/check_torchscript.py MODEL CASES
"""
import json
import sys

import torch


def main():
    model = torch.jit.load(sys.argv[1])
    cases = torch.load(sys.argv[2])
    n = 1 + max(int(k.split("_")[1]) for k in cases)
    report = {"training": model.training,
              "parameters": [name for name, _ in model.named_parameters()],
              "buffers": [name for name, _ in model.named_buffers()],
              "cases": []}
    for c in range(n):
        inputs = [cases["input_%d_%d" % (c, i)]
                  for i in range(sum(k.startswith("input_%d_" % c) for k in cases))]
        want = [cases["output_%d_%d" % (c, k)]
                for k in range(sum(k.startswith("output_%d_" % c) for k in cases))]
        with torch.no_grad():
            got = model(*inputs)
        got = list(got) if isinstance(got, tuple) else [got]
        same = len(got) == len(want) and all(
            g.shape == w.shape and g.dtype == w.dtype for g, w in zip(got, want))
        diff = max(((g.double() - w.double()).abs().max().item() if g.numel() else 0.0)
                   for g, w in zip(got, want)) if same else None
        report["cases"].append({"same_shapes": same, "max_abs_diff": diff,
                                "bit_equal": same and all(torch.equal(g, w)
                                                          for g, w in zip(got, want))})
    print(json.dumps(report))


if __name__ == "__main__":
    main()
