#!/usr/bin/python3
"""Sweeps bad values through every parameter the `volt` CLI lists in `volt fit --help`: each
callback, logger, profiler and checkpoint IO, the ddp and deepspeed strategies, the demo models,
the data module, the --optimizer and --lr_scheduler classes and the Trainer. Each value gets one short real run (3 training batches of the
shipped Fashion-MNIST config; strategies on 2 processes) and is flagged when the CLI does not
answer as the brief asks of bad input: exit 0 (accepted) or 2 (a typed config error), never
exit 1 from a config value, "[cli] unexpected error", a signal or a hang.

    /usr/bin/python3 tools/cli_bad_values.py build/bin/volt [section ...]

Sections: trainer, model, data, cb, lg, pf, io, st, opt, sch (default: all). Prints one line per run and
the flagged ones again at the end; exits 1 when any was flagged. Takes about 15 minutes on the
2-core machine (strategies dominate). Not in ctest for that reason: run it after adding a
component or a parameter. Session 34's first pass found 14 problems (docs/FEATURES.md, note).
Exit 0 is not checked for meaning: a value such as patience=0 is legitimate, and one that is
accepted but meaningless has to be spotted in the printed list.
"""
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "..", "configs", "fashion_mnist_mlp.yaml")
VALUES = {
    "int": ["-7", "0", "99999999999"],
    "int|null": ["-3", "0", "99999999999"],
    "float": ["-1", "nan", "inf"],
    "float|null": ["-1", "nan", "inf"],
    "int|float": ["-1", "nan", "1e30"],
    "str": ["''", "bad/../x", "zz"],
    "str|null": ["''", "zz"],
    "list[str]": ["[]", "['']"],
    "list[int]": ["[]", "[0]", "[-5]"],
    "list[float]": ["[]", "[-1]", "[nan]"],
}
# Parameters whose runs need a fixed companion value.
COMPANIONS = {
    ("cb", "EarlyStopping"): ["--trainer.callbacks.0.monitor=val_loss"],
    ("cb", "ActivationCheckpointing"): ["--trainer.callbacks.0.modules=['net.*']"],
    ("cb", "StochasticWeightAveraging"): ["--trainer.callbacks.0.swa_lrs=[0.05]"],
    ("sch", "StepLR"): ["--lr_scheduler.step_size=1"],
    ("sch", "MultiStepLR"): ["--lr_scheduler.milestones=[1]"],
    ("sch", "ExponentialLR"): ["--lr_scheduler.gamma=0.5"],
    ("sch", "CosineAnnealingLR"): ["--lr_scheduler.T_max=2"],
    ("sch", "CosineAnnealingWarmRestarts"): ["--lr_scheduler.T_0=2"],
    ("sch", "OneCycleLR"): ["--lr_scheduler.max_lr=0.1", "--lr_scheduler.total_steps=5"],
    ("sch", "CyclicLR"): ["--lr_scheduler.base_lr=0.01", "--lr_scheduler.max_lr=0.1"],
    ("sch", "ReduceLROnPlateau"): ["--lr_scheduler.monitor=val_loss"],
    ("sch", "WarmupDecayLR"): ["--lr_scheduler.total_num_steps=5"],
}
# Exit 1 by design: a data folder without the data is a failed run (DataError; cli.h), as a
# corrupt file found mid-run is.
RUN_FAILURES = {("data", "FashionMNIST", "root")}
# Step counts the tuner callbacks take as asked: a huge one is a long search, as max_steps.
LONG_RUNS = {("LearningRateFinder", "num_training_steps"), ("BatchSizeFinder", "steps_per_trial")}
SECTIONS = {"callbacks": "cb", "loggers": "lg", "profilers": "pf", "checkpoint": "io",
            "strategies": "st", "trainer": "trainer", "models": "model", "data": "data",
            "optimizers": "opt", "LR": "sch"}


def parameters(volt):
    """(section, component, key, type) for each parameter `volt fit --help` lists."""
    text = subprocess.run([volt, "fit", "--help"], capture_output=True, text=True).stdout
    section = component = None
    for line in text.splitlines():
        if re.match(r"^\S", line):
            section = SECTIONS.get(line.split(" ")[0])
            component = "Trainer" if section == "trainer" else None
            continue
        m = re.match(r"^  (\S+) — ", line)
        if m and section:
            component = m.group(1)
            continue
        m = re.match(r"^    --(\S+)\s+(\S+)\s+\[", line)
        if m and section and component:
            yield section, component, m.group(1).split(".")[-1], m.group(2)


def setup(section, component):
    """The arguments that select `component` and the prefix of its parameters."""
    return {
        "trainer": ([], "--trainer."),
        "model": (["--model=" + component], "--model."),
        "data": (["--data=" + component], "--data."),
        "cb": (["--trainer.callbacks=[]", "--trainer.callbacks+=" + component],
               "--trainer.callbacks.0."),
        "lg": (["--trainer.callbacks=[]", "--trainer.loggers=[]",
                "--trainer.loggers+=" + component], "--trainer.loggers.0."),
        "pf": (["--trainer.profiler=" + component], "--trainer.profiler."),
        "io": (["--trainer.checkpoint_io=" + component], "--trainer.checkpoint_io."),
        "st": (["--trainer.devices=2", "--trainer.strategy=" + component],
               "--trainer.strategy.init_args."),
        "opt": (["--optimizer=" + component], "--optimizer."),
        "sch": (["--optimizer=SGD", "--lr_scheduler=" + component], "--lr_scheduler."),
    }[section]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    volt, only = sys.argv[1], set(sys.argv[2:])
    flagged = []
    with tempfile.TemporaryDirectory() as root:
        base = ["fit", "--config", CONFIG, "--trainer.max_epochs=1",
                "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2",
                "--trainer.enable_progress_bar=false", "--trainer.default_root_dir=" + root]
        for section, component, key, kind in parameters(volt):
            if (only and section not in only) or (section == "st" and
                                                  component not in ("ddp", "deepspeed")):
                continue
            if section == "trainer" and key in ("max_epochs", "max_steps", "max_time"):
                continue  # a huge limit is a long run, as asked
            if (component, key) in LONG_RUNS:
                continue  # the same for the tuners' step counts
            select, prefix = setup(section, component)
            for value in VALUES.get(kind, []):
                args = base + select + COMPANIONS.get((section, component), [])
                args.append(prefix + key + "=" + value)
                try:
                    r = subprocess.run([volt] + args, capture_output=True, text=True, timeout=120)
                    code, out = r.returncode, r.stdout + r.stderr
                except subprocess.TimeoutExpired:
                    code, out = "timeout", ""
                said = [l for l in out.splitlines()
                        if l.startswith("[") and not l.startswith("[volt] info")]
                allowed = (0, 1, 2) if (section, component, key) in RUN_FAILURES else (0, 2)
                bad = code not in allowed or "[cli] unexpected error" in out
                line = "%s %s.%s=%s -> %s %s" % (section, component, key, value, code,
                                                 said[0][:160] if said else "")
                print(("FLAG " if bad else "     ") + line, flush=True)
                if bad:
                    flagged.append(line)
    print("\n%d flagged" % len(flagged))
    for line in flagged:
        print("  " + line)
    sys.exit(1 if flagged else 0)


if __name__ == "__main__":
    main()
