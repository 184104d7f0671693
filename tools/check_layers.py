#!/usr/bin/env python3
"""Checks volt's layering: a folder may include volt headers only from folders below it.

Every `#include "volt/<folder>/..."` (public headers) and `#include "<folder>/detail/..."` or
`"<folder>/loops/..."` (private headers under src/) in include/volt/ and src/ is an arrow from
the including file's folder to <folder>. The ranks below are the architecture
(docs/ARCHITECTURE.md, "Layers"): an arrow must point to a strictly lower rank or stay in its
own folder. An include that climbs out of its folder ("../") is refused: it would hide its arrow
(until session 90 three upward arrows hid that way). Exit 0 when every arrow points down, 1 with
one line per violation otherwise.
"""
import os
import re
import sys

RANKS = {
    "core": 0,          # vocabulary, errors, logging, registry machinery, Module/RunContext
    "kernels": 1,       # fused kernels (libtorch only)
    "data": 2, "io": 2, "optim": 2, "accelerators": 2, "precision": 2,
    "distributed": 2,   # process groups, launcher, cluster environments
    "graphs": 2,        # graph capture/replay: the shape-keyed cache, options, capture checks
    "nn": 3,            # model building blocks over precision: activation checkpointing, Pipeline
    "loggers": 4, "profiler": 4, "strategies": 4,
    "callbacks": 5,
    "report": 5,        # the run report reads what loggers/ wrote (log_dir, the CSV dialect)
    "trainer": 6,       # Trainer, loops, resolve_plan, built-in registration
    "cli": 7, "tuner": 7,  # tuner: lr_find builds a Trainer of its own
    "fabric": 7,  # Fabric: resolve_plan (trainer/plan.h) for a loop the program writes
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"(?:volt/)?([a-z_]+)/')
CLIMBING = re.compile(r'^\s*#\s*include\s+"\.\./')


def folder_of(root, path):
    rel = os.path.relpath(path, root)
    return rel.split(os.sep)[0] if os.sep in rel else None


def main(repo):
    violations = []
    for root in (os.path.join(repo, "include", "volt"), os.path.join(repo, "src")):
        for dirpath, _, files in os.walk(root):
            for name in sorted(files):
                if not name.endswith((".h", ".hpp", ".cpp", ".cu")):
                    continue
                path = os.path.join(dirpath, name)
                src = folder_of(root, path)
                if src is None:
                    continue  # volt.h, the umbrella header, includes everything by design
                if src not in RANKS:
                    violations.append(f"{path}: folder '{src}' has no layer; add it to RANKS "
                                      "in tools/check_layers.py and to docs/ARCHITECTURE.md")
                    continue
                with open(path, encoding="utf-8") as f:
                    for lineno, line in enumerate(f, 1):
                        if CLIMBING.match(line):
                            violations.append(
                                f"{os.path.relpath(path, repo)}:{lineno}: an include climbing "
                                "out of its folder (\"../\") hides which layer it reaches; write "
                                "it from src/ or include/ (\"core/detail/x.h\", \"volt/core/x.h\")")
                            continue
                        m = INCLUDE.match(line)
                        if not m or m.group(1) not in RANKS or m.group(1) == src:
                            continue
                        dst = m.group(1)
                        if RANKS[dst] >= RANKS[src]:
                            violations.append(
                                f"{os.path.relpath(path, repo)}:{lineno}: {src} (layer "
                                f"{RANKS[src]}) includes {dst} (layer {RANKS[dst]}); an include "
                                "must point to a lower layer")
    for v in violations:
        print(v)
    if not violations:
        print("layers: every include points down")
    return 1 if violations else 0


def self_test():
    """The check must catch an upward include (core -> trainer) and accept a downward one."""
    import tempfile
    with tempfile.TemporaryDirectory() as repo:
        os.makedirs(os.path.join(repo, "include", "volt", "core"))
        os.makedirs(os.path.join(repo, "src", "trainer"))
        with open(os.path.join(repo, "src", "trainer", "t.cpp"), "w") as f:
            f.write('#include "volt/core/x.h"\n')
        if main(repo) != 0:
            return 1
        with open(os.path.join(repo, "include", "volt", "core", "x.h"), "w") as f:
            f.write('#include "volt/trainer/trainer.h"\n')
        if main(repo) != 1:
            print("self-test: an upward include was not reported")
            return 1
        os.remove(os.path.join(repo, "include", "volt", "core", "x.h"))
        with open(os.path.join(repo, "src", "trainer", "t.cpp"), "w") as f:
            f.write('#include "../cli/detail/x.h"\n')
        if main(repo) != 1:
            print("self-test: an include climbing out of its folder was not reported")
            return 1
    print("self-test passed")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else
                  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
