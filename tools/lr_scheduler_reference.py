#!/usr/bin/python3
"""Reference lr sequences from torch.optim.lr_scheduler for tests/optim/lr_scheduler_test.cpp.

Run with Debian's python3-torch (1.13):

    /usr/bin/python3 tools/lr_scheduler_reference.py [tests/optim/data/lr_scheduler_reference.json]

Every case is a spec (optimizer + scheduler + number of steps) that the C++ test reads back and
builds with volt's schedulers. For each case the file holds the lrs of every param group right
after construction and after each `step()` (get_last_lr() read from the param groups), and for
cases with `record_momentum` the momentum (SGD/RMSprop) or beta1 (Adam/AdamW) of every group.
Floats are written with repr(), so they round-trip exactly.
"""

import json
import math
import os
import sys
import warnings

import torch
from torch.optim import lr_scheduler as S
from torch.optim import swa_utils

# LambdaLR factors by name; tests/optim/lr_scheduler_test.cpp defines the same functions.
LAMBDAS = {
    "pow095": lambda e: 0.95 ** e,
    "warmup10_inv_sqrt": lambda e: min((e + 1) / 10, 1 / math.sqrt(max(e, 1))),
    "halve_every_7": lambda e: 0.5 ** (e // 7),
    "const095": lambda e: 0.95,
}

# CyclicLR scale functions by name; the C++ test defines the same functions.
SCALE_FNS = {
    "inv_sqrt": lambda x: 1 / math.sqrt(x),
    "inv_linear_0.02": lambda x: 1 / (1 + 0.02 * x),
}


def make_optimizer(spec):
    params = [torch.nn.Parameter(torch.zeros(2, dtype=torch.float64)) for _ in spec["lrs"]]
    groups = [{"params": [p], "lr": lr} for p, lr in zip(params, spec["lrs"])]
    kind = spec["type"]
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=spec["lrs"][0], momentum=spec.get("momentum", 0.0))
    if kind == "adam":
        return torch.optim.Adam(groups, lr=spec["lrs"][0], betas=tuple(spec["betas"]))
    if kind == "adamw":
        return torch.optim.AdamW(groups, lr=spec["lrs"][0], betas=tuple(spec["betas"]))
    if kind == "rmsprop":
        return torch.optim.RMSprop(groups, lr=spec["lrs"][0], momentum=spec["momentum"])
    raise ValueError(kind)


def make_scheduler(spec, opt):
    k, a = spec["kind"], spec.get("args", {})
    if k == "StepLR":
        return S.StepLR(opt, step_size=a["step_size"], gamma=a["gamma"])
    if k == "MultiStepLR":
        return S.MultiStepLR(opt, milestones=a["milestones"], gamma=a["gamma"])
    if k == "ExponentialLR":
        return S.ExponentialLR(opt, gamma=a["gamma"])
    if k == "CosineAnnealingLR":
        return S.CosineAnnealingLR(opt, T_max=a["t_max"], eta_min=a["eta_min"])
    if k == "CosineAnnealingWarmRestarts":
        return S.CosineAnnealingWarmRestarts(opt, T_0=a["t_0"], T_mult=a["t_mult"],
                                             eta_min=a["eta_min"])
    if k == "LinearLR":
        return S.LinearLR(opt, start_factor=a["start_factor"], end_factor=a["end_factor"],
                          total_iters=a["total_iters"])
    if k == "LambdaLR":
        fns = [LAMBDAS[n] for n in a["lambdas"]]
        return S.LambdaLR(opt, fns if len(fns) > 1 else fns[0])
    if k == "OneCycleLR":
        return S.OneCycleLR(opt, max_lr=a["max_lr"], total_steps=a["total_steps"],
                            pct_start=a["pct_start"], anneal_strategy=a["anneal_strategy"],
                            cycle_momentum=a["cycle_momentum"], base_momentum=a["base_momentum"],
                            max_momentum=a["max_momentum"], div_factor=a["div_factor"],
                            final_div_factor=a["final_div_factor"], three_phase=a["three_phase"])
    if k == "SequentialLR":
        subs = [make_scheduler(s, opt) for s in a["schedulers"]]
        return S.SequentialLR(opt, schedulers=subs, milestones=a["milestones"])
    if k == "ChainedScheduler":
        return S.ChainedScheduler([make_scheduler(s, opt) for s in a["schedulers"]])
    if k == "MultiplicativeLR":
        fns = [LAMBDAS[n] for n in a["lambdas"]]
        return S.MultiplicativeLR(opt, fns if len(fns) > 1 else fns[0])
    if k == "ConstantLR":
        return S.ConstantLR(opt, factor=a["factor"], total_iters=a["total_iters"])
    if k == "PolynomialLR":
        return S.PolynomialLR(opt, total_iters=a["total_iters"], power=a["power"])
    if k == "CyclicLR":
        fn = SCALE_FNS[a["scale_fn"]] if a.get("scale_fn") else None
        return S.CyclicLR(opt, base_lr=a["base_lr"], max_lr=a["max_lr"],
                          step_size_up=a["step_size_up"], step_size_down=a["step_size_down"],
                          mode=a["mode"], gamma=a["gamma"], scale_fn=fn,
                          scale_mode=a["scale_mode"], cycle_momentum=a["cycle_momentum"],
                          base_momentum=a["base_momentum"], max_momentum=a["max_momentum"])
    if k == "SWALR":
        return swa_utils.SWALR(opt, swa_lr=a["swa_lr"], anneal_epochs=a["anneal_epochs"],
                               anneal_strategy=a["anneal_strategy"])
    if k == "ReduceLROnPlateau":
        return S.ReduceLROnPlateau(opt, mode=a["mode"], factor=a["factor"],
                                   patience=a["patience"], threshold=a["threshold"],
                                   threshold_mode=a["threshold_mode"], cooldown=a["cooldown"],
                                   min_lr=a["min_lr"], eps=a["eps"])
    raise ValueError(k)


def momentum_of(opt):
    out = []
    for g in opt.param_groups:
        out.append(g["betas"][0] if "betas" in g else g["momentum"])
    return out


def run(case):
    opt = make_optimizer(case["optimizer"])
    sched = make_scheduler(case["scheduler"], opt)
    lrs = [[g["lr"] for g in opt.param_groups]]
    mom = [momentum_of(opt)]
    metrics = case.get("metrics")
    added = case.get("add_group")
    for i in range(case["steps"]):
        if added is not None and i == added["after"]:
            # As BaseFinetuning.unfreeze_and_add_param_group, after `after` steps.
            param = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
            opt.add_param_group({"params": [param], "lr": added["lr"]})
        # optimizer.step() first, as in training (no gradients: parameters stay put).
        opt.step()
        if metrics is not None:
            sched.step(metrics[i])
        else:
            sched.step()
        lrs.append([g["lr"] for g in opt.param_groups])
        mom.append(momentum_of(opt))
        if metrics is None:
            assert lrs[-1] == list(sched.get_last_lr()), case["name"]
    out = dict(case)
    out["lrs"] = lrs
    if case.get("record_momentum"):
        out["momentum"] = mom
    return out


SGD2 = {"type": "sgd", "lrs": [0.1, 0.05], "momentum": 0.9}


def onecycle(max_lr, total, **kw):
    a = {"max_lr": max_lr, "total_steps": total, "pct_start": 0.3, "anneal_strategy": "cos",
         "cycle_momentum": True, "base_momentum": 0.85, "max_momentum": 0.95,
         "div_factor": 25.0, "final_div_factor": 1e4, "three_phase": False}
    a.update(kw)
    return {"kind": "OneCycleLR", "args": a}


def cyclic(base_lr, max_lr, step_size_up, **kw):
    a = {"base_lr": base_lr, "max_lr": max_lr, "step_size_up": step_size_up,
         "step_size_down": None, "mode": "triangular", "gamma": 1.0, "scale_fn": None,
         "scale_mode": "cycle", "cycle_momentum": True, "base_momentum": 0.8,
         "max_momentum": 0.9}
    a.update(kw)
    return {"kind": "CyclicLR", "args": a}


def chained(*schedulers):
    return {"kind": "ChainedScheduler", "args": {"schedulers": list(schedulers)}}


def rop(**kw):
    a = {"mode": "min", "factor": 0.1, "patience": 10, "threshold": 1e-4,
         "threshold_mode": "rel", "cooldown": 0, "min_lr": 0.0, "eps": 1e-8}
    a.update(kw)
    return {"kind": "ReduceLROnPlateau", "args": a}


def cases():
    c = []

    def add(name, sched, steps, optimizer=SGD2, **extra):
        c.append(dict(name=name, optimizer=optimizer, scheduler=sched, steps=steps, **extra))

    add("step_7_half", {"kind": "StepLR", "args": {"step_size": 7, "gamma": 0.5}}, 50)
    add("step_1_0.9", {"kind": "StepLR", "args": {"step_size": 1, "gamma": 0.9}}, 40)
    add("multistep_repeats",
        {"kind": "MultiStepLR", "args": {"milestones": [5, 12, 12, 30], "gamma": 0.3}}, 50)
    add("multistep_unsorted_repeats",
        {"kind": "MultiStepLR", "args": {"milestones": [3, 9, 3, 20], "gamma": 0.5}}, 30)
    add("exponential_0.95", {"kind": "ExponentialLR", "args": {"gamma": 0.95}}, 60)
    add("exponential_0.7", {"kind": "ExponentialLR", "args": {"gamma": 0.7}}, 40)
    # Runs past T_max: the recursive form climbs back up (period 2*T_max).
    add("cosine_20_past_tmax",
        {"kind": "CosineAnnealingLR", "args": {"t_max": 20, "eta_min": 0.001}}, 60)
    add("cosine_50", {"kind": "CosineAnnealingLR", "args": {"t_max": 50, "eta_min": 0.0}}, 50)
    add("cosine_7_many_periods",
        {"kind": "CosineAnnealingLR", "args": {"t_max": 7, "eta_min": 0.01}}, 60)
    add("warm_restarts_10",
        {"kind": "CosineAnnealingWarmRestarts",
         "args": {"t_0": 10, "t_mult": 1, "eta_min": 0.001}}, 50)
    add("warm_restarts_3_x2",
        {"kind": "CosineAnnealingWarmRestarts", "args": {"t_0": 3, "t_mult": 2, "eta_min": 0.0}},
        60)
    add("linear_default",
        {"kind": "LinearLR", "args": {"start_factor": 1.0 / 3, "end_factor": 1.0,
                                      "total_iters": 5}}, 30)
    add("linear_warmup_10",
        {"kind": "LinearLR", "args": {"start_factor": 0.1, "end_factor": 1.0,
                                      "total_iters": 10}}, 30)
    add("linear_decay_to_0",
        {"kind": "LinearLR", "args": {"start_factor": 0.5, "end_factor": 0.0,
                                      "total_iters": 20}}, 40)
    add("linear_decay_40",
        {"kind": "LinearLR", "args": {"start_factor": 1.0, "end_factor": 0.05,
                                      "total_iters": 40}}, 50)
    add("lambda_per_group",
        {"kind": "LambdaLR", "args": {"lambdas": ["pow095", "warmup10_inv_sqrt"]}}, 40)
    add("lambda_shared", {"kind": "LambdaLR", "args": {"lambdas": ["halve_every_7"]}}, 40)
    add("onecycle_cos_sgd", onecycle([0.5, 0.2], 50), 50, record_momentum=True)
    add("onecycle_linear_three_phase_adam",
        onecycle([0.01, 0.003], 60, anneal_strategy="linear", three_phase=True, pct_start=0.25,
                 div_factor=10.0, final_div_factor=100.0),
        60, optimizer={"type": "adam", "lrs": [0.001, 0.0005], "betas": [0.9, 0.999]},
        record_momentum=True)
    add("onecycle_cos_three_phase_adamw",
        onecycle([0.02, 0.01], 40, three_phase=True, pct_start=0.4, base_momentum=0.8,
                 max_momentum=0.9),
        40, optimizer={"type": "adamw", "lrs": [0.001, 0.001], "betas": [0.95, 0.999]},
        record_momentum=True)
    add("onecycle_cos_rmsprop_pct_0.2",
        onecycle(0.05, 35, pct_start=0.2, base_momentum=0.5, max_momentum=0.9), 35,
        optimizer={"type": "rmsprop", "lrs": [0.01, 0.002], "momentum": 0.0},
        record_momentum=True)
    add("onecycle_linear_no_momentum",
        onecycle([1.0, 0.4], 45, anneal_strategy="linear", cycle_momentum=False, pct_start=0.5,
                 div_factor=5.0, final_div_factor=50.0),
        45, record_momentum=True)
    add("sequential_warmup_cosine",
        {"kind": "SequentialLR", "args": {
            "schedulers": [
                {"kind": "LinearLR", "args": {"start_factor": 0.1, "end_factor": 1.0,
                                              "total_iters": 5}},
                {"kind": "CosineAnnealingLR", "args": {"t_max": 25, "eta_min": 1e-4}}],
            "milestones": [5]}}, 40)
    add("sequential_three",
        {"kind": "SequentialLR", "args": {
            "schedulers": [
                {"kind": "LinearLR", "args": {"start_factor": 0.25, "end_factor": 1.0,
                                              "total_iters": 8}},
                {"kind": "ExponentialLR", "args": {"gamma": 0.9}},
                {"kind": "StepLR", "args": {"step_size": 3, "gamma": 0.5}}],
            "milestones": [4, 15]}}, 40)
    add("sequential_multistep_lambda",
        {"kind": "SequentialLR", "args": {
            "schedulers": [
                {"kind": "MultiStepLR", "args": {"milestones": [2, 4], "gamma": 0.5}},
                {"kind": "LambdaLR", "args": {"lambdas": ["pow095", "warmup10_inv_sqrt"]}},
                {"kind": "CosineAnnealingWarmRestarts",
                 "args": {"t_0": 4, "t_mult": 2, "eta_min": 0.0}}],
            "milestones": [6, 20]}}, 45)
    # OneCycleLR constructed second overwrites param_group['initial_lr'] (to max_lr/div_factor),
    # which SequentialLR resets every group's lr to before the first scheduler's initial step.
    add("sequential_linear_onecycle",
        {"kind": "SequentialLR", "args": {
            "schedulers": [
                {"kind": "LinearLR", "args": {"start_factor": 0.5, "end_factor": 1.0,
                                              "total_iters": 4}},
                onecycle([0.3, 0.2], 30)],
            "milestones": [6]}}, 36, record_momentum=True)
    # SWALR counts its steps by _step_count, which its own constructor advanced: after a
    # milestone it is one step into its annealing at once (volt was one behind before session 81).
    add("sequential_step_swalr",
        {"kind": "SequentialLR", "args": {
            "schedulers": [
                {"kind": "StepLR", "args": {"step_size": 100, "gamma": 0.1}},
                {"kind": "SWALR", "args": {"swa_lr": 0.1, "anneal_epochs": 4,
                                           "anneal_strategy": "linear"}}],
            "milestones": [3]}}, 30)
    # SWALR: cosine and linear annealing to per-group or shared SWA lrs, and the jump at once.
    add("swalr_cos_10_per_group",
        {"kind": "SWALR", "args": {"swa_lr": [0.02, 0.2], "anneal_epochs": 10,
                                   "anneal_strategy": "cos"}}, 30)
    add("swalr_linear_7_shared",
        {"kind": "SWALR", "args": {"swa_lr": 0.01, "anneal_epochs": 7,
                                   "anneal_strategy": "linear"}}, 30)
    add("swalr_cos_1", {"kind": "SWALR", "args": {"swa_lr": [0.5, 0.001], "anneal_epochs": 1,
                                                  "anneal_strategy": "cos"}}, 30)
    add("swalr_no_annealing", {"kind": "SWALR", "args": {"swa_lr": 0.03, "anneal_epochs": 0,
                                                         "anneal_strategy": "linear"}}, 30)
    # Session 98: ConstantLR, PolynomialLR, MultiplicativeLR, CyclicLR, ChainedScheduler.
    add("constant_half_4", {"kind": "ConstantLR", "args": {"factor": 0.5, "total_iters": 4}}, 30)
    add("constant_default",
        {"kind": "ConstantLR", "args": {"factor": 1.0 / 3, "total_iters": 5}}, 30)
    add("constant_0_iters", {"kind": "ConstantLR", "args": {"factor": 0.25, "total_iters": 0}},
        30)
    add("polynomial_4_linear", {"kind": "PolynomialLR", "args": {"total_iters": 4, "power": 1.0}},
        30)
    add("polynomial_10_squared",
        {"kind": "PolynomialLR", "args": {"total_iters": 10, "power": 2.0}}, 30)
    add("polynomial_20_sqrt", {"kind": "PolynomialLR", "args": {"total_iters": 20, "power": 0.5}},
        30)
    add("multiplicative_shared", {"kind": "MultiplicativeLR", "args": {"lambdas": ["const095"]}},
        40)
    add("multiplicative_per_group",
        {"kind": "MultiplicativeLR", "args": {"lambdas": ["const095", "halve_every_7"]}}, 40)
    add("cyclic_triangular_sgd", cyclic([0.01, 0.001], [0.1, 0.01], 5), 40,
        record_momentum=True)
    add("cyclic_triangular2_rmsprop_down",
        cyclic(0.001, 0.006, 4, step_size_down=8, mode="triangular2",
               base_momentum=[0.85, 0.8], max_momentum=[0.95, 0.9]), 50,
        optimizer={"type": "rmsprop", "lrs": [0.01, 0.002], "momentum": 0.5},
        record_momentum=True)
    add("cyclic_exp_range_adam_no_momentum",
        cyclic(0.01, 0.05, 3, mode="exp_range", gamma=0.97, cycle_momentum=False), 40,
        optimizer={"type": "adam", "lrs": [0.001, 0.0005], "betas": [0.9, 0.999]})
    add("cyclic_custom_cycle_fractional",
        cyclic([0.02, 0.01], [0.2, 0.05], 2.5, step_size_down=4, scale_fn="inv_sqrt"), 40,
        record_momentum=True)
    add("cyclic_custom_iterations",
        cyclic(0.005, 0.05, 6, scale_fn="inv_linear_0.02", scale_mode="iterations"), 40,
        record_momentum=True)
    add("chained_constant_exponential",
        chained({"kind": "ConstantLR", "args": {"factor": 0.1, "total_iters": 2}},
                {"kind": "ExponentialLR", "args": {"gamma": 0.9}}), 30)
    add("chained_linear_cosine_past_tmax",
        chained({"kind": "LinearLR", "args": {"start_factor": 0.1, "end_factor": 1.0,
                                              "total_iters": 5}},
                {"kind": "CosineAnnealingLR", "args": {"t_max": 20, "eta_min": 1e-4}}), 45)
    # LambdaLR is not chainable: built second it takes the shared initial lr as its base.
    add("chained_constant_lambda",
        chained({"kind": "ConstantLR", "args": {"factor": 0.5, "total_iters": 3}},
                {"kind": "LambdaLR", "args": {"lambdas": ["halve_every_7"]}}), 30)
    add("chained_onecycle_constant",
        chained(onecycle([0.5, 0.2], 40),
                {"kind": "ConstantLR", "args": {"factor": 0.5, "total_iters": 10}}), 40,
        record_momentum=True)
    add("chained_multiplicative_cyclic",
        chained({"kind": "MultiplicativeLR", "args": {"lambdas": ["const095"]}},
                cyclic([0.01, 0.001], [0.1, 0.01], 4)), 30, record_momentum=True)
    add("sequential_constant_polynomial",
        {"kind": "SequentialLR", "args": {
            "schedulers": [
                {"kind": "ConstantLR", "args": {"factor": 0.5, "total_iters": 3}},
                {"kind": "PolynomialLR", "args": {"total_iters": 20, "power": 2.0}}],
            "milestones": [3]}}, 30)
    # CyclicLR built second keeps its own base_lr; the sequence starts at the shared initial lr.
    add("sequential_linear_cyclic",
        {"kind": "SequentialLR", "args": {
            "schedulers": [
                {"kind": "LinearLR", "args": {"start_factor": 0.2, "end_factor": 1.0,
                                              "total_iters": 5}},
                cyclic([0.01, 0.005], [0.05, 0.02], 3)],
            "milestones": [5]}}, 35, record_momentum=True)
    # Metric-driven: improvement, plateaus (with sub-threshold changes), cooldown, min_lr floor.
    plateau = ([1.0, 0.9, 0.8, 0.7, 0.65] + [0.65] * 4 + [0.64999, 0.6, 0.6, 0.6, 0.6, 0.6]
               + [0.5, 0.5, 0.5, 0.5, 0.49995, 0.5, 0.5, 0.5, 0.4] + [0.4] * 20
               + [0.3, 0.35, 0.36, 0.37, 0.38, 0.39])
    add("plateau_min_rel_cooldown_minlr",
        rop(factor=0.5, patience=2, cooldown=2, min_lr=[0.01, 0.001]), len(plateau),
        metrics=plateau)
    acc = ([0.5, 0.6, 0.65, 0.655, 0.66, 0.7, 0.705, 0.7, 0.71, 0.72] + [0.72] * 10
           + [0.8, 0.805, 0.809, 0.811, 0.82, 0.821, 0.9] + [0.9] * 13)
    add("plateau_max_abs", rop(mode="max", factor=0.2, patience=1, threshold=0.01,
                               threshold_mode="abs", min_lr=0.0), len(acc), metrics=acc)
    add("plateau_max_rel_cooldown",
        rop(mode="max", factor=0.3, patience=3, threshold=0.05, cooldown=3, min_lr=0.002),
        len(acc), metrics=acc)
    # Every step is bad; reductions stop once they would change an lr by less than eps.
    flat = [1.0] * 30
    add("plateau_eps_stops_reductions", rop(factor=0.1, patience=0, threshold_mode="abs"),
        len(flat), metrics=flat)
    add("plateau_min_abs_patience3",
        rop(factor=0.7, patience=3, threshold=0.02, threshold_mode="abs", cooldown=1,
            min_lr=[0.0, 0.01]), len(plateau), metrics=plateau)
    return c


def added_group_cases():
    """A param group added after the scheduler was built (BaseFinetuning's unfreeze): PyTorch's
    chainable get_lr() scales every group's current lr, so StepLR, MultiStepLR, ExponentialLR,
    CosineAnnealingLR (except one step past each minimum, where it zips base_lrs), LinearLR,
    ConstantLR and PolynomialLR schedule the new group too; LambdaLR, MultiplicativeLR,
    CosineAnnealingWarmRestarts and CyclicLR zip over base_lrs or their per-group settings and
    leave it alone; SequentialLR's milestone restart (step(0), the closed form) zips base_lrs.
    OneCycleLR, SWALR and ReduceLROnPlateau fail in torch 1.13 (KeyError / IndexError)."""
    c = []

    def add(name, sched, steps, after, lr=0.02):
        c.append(dict(name=name, optimizer=SGD2, scheduler=sched, steps=steps,
                      add_group={"after": after, "lr": lr}))

    add("step_3_half", {"kind": "StepLR", "args": {"step_size": 3, "gamma": 0.5}}, 12, 4)
    add("multistep", {"kind": "MultiStepLR", "args": {"milestones": [2, 6, 6], "gamma": 0.3}},
        10, 3)
    add("exponential", {"kind": "ExponentialLR", "args": {"gamma": 0.9}}, 10, 2)
    add("cosine_past_minima",
        {"kind": "CosineAnnealingLR", "args": {"t_max": 4, "eta_min": 0.001}}, 20, 2)
    add("linear_warmup", {"kind": "LinearLR", "args": {"start_factor": 0.25, "end_factor": 1.0,
                                                       "total_iters": 6}}, 10, 2)
    add("constant", {"kind": "ConstantLR", "args": {"factor": 0.5, "total_iters": 4}}, 8, 1)
    add("polynomial", {"kind": "PolynomialLR", "args": {"total_iters": 8, "power": 2.0}}, 10, 3)
    add("lambda", {"kind": "LambdaLR", "args": {"lambdas": ["pow095"]}}, 8, 2)
    add("multiplicative", {"kind": "MultiplicativeLR", "args": {"lambdas": ["const095"]}}, 8, 2)
    add("warm_restarts",
        {"kind": "CosineAnnealingWarmRestarts", "args": {"t_0": 3, "t_mult": 1,
                                                         "eta_min": 0.0}}, 8, 2)
    add("cyclic", cyclic([0.01, 0.001], [0.1, 0.01], 3), 10, 2)
    add("sequential_linear_cosine",
        {"kind": "SequentialLR", "args": {
            "schedulers": [
                {"kind": "LinearLR", "args": {"start_factor": 0.1, "end_factor": 1.0,
                                              "total_iters": 5}},
                {"kind": "CosineAnnealingLR", "args": {"t_max": 6, "eta_min": 1e-4}}],
            "milestones": [5]}}, 14, 2)
    add("chained_constant_exponential",
        chained({"kind": "ConstantLR", "args": {"factor": 0.5, "total_iters": 3}},
                {"kind": "ExponentialLR", "args": {"gamma": 0.9}}), 10, 1)
    return c


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "..", "tests", "optim", "data", "lr_scheduler_reference.json")
    path = sys.argv[1] if len(sys.argv) > 1 else default
    warnings.simplefilter("ignore")  # SequentialLR's step(0) warns about the deprecated epoch arg
    torch.set_default_dtype(torch.float64)
    doc = {
        "generator": "tools/lr_scheduler_reference.py",
        "torch_version": torch.__version__,
        "note": "lrs[0] is right after construction, lrs[i] after the i-th step()",
        "cases": [run(c) for c in cases()],
        "added_group_cases": [run(c) for c in added_group_cases()],
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("wrote {} cases to {}".format(len(doc["cases"]), os.path.normpath(path)))


if __name__ == "__main__":
    main()
