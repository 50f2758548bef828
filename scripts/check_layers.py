#!/usr/bin/env python3
"""Checks that every include of a repository file points down the layers.

The folders of the libraries, in order (a folder may include the folders of
the rows above its own, never one beside it or below it):
    compat   config
    kernels
    optimizers   schedules   normalization   noise
    distributed
    bigbatch.h (the umbrella header)
    experiments/
experiments/ is the runner, a folder per job, with its own order:
    io         torch-free formats: includes nothing of the repository but io
    cluster    torch-free workers and ranks: io
    workload   the interface, the built-in datasets and models: io and the libraries
    optim      the optimizers a config names, one entry each: io and the libraries
    runconfig  what a trial, a sweep, a cbs run is: + workload and optim
    train      the one training loop: + runconfig
    sweep      sweeps, cbs, results: + train and cluster
    cli        the command line and the programs: + sweep
tests/, benchmarks/, examples/ and scripts/ may include anything. One line per
include against the order ("FILE:LINE: "X" points up/sideways, from A to B");
the summary ends with the count.
Usage: check_layers.py [REPO]   (default: this script's repository)
"""
import os
import re
import sys

from check_includes import INCLUDE, report, sources

LIBRARY_RANKS = [("compat", "config"), ("kernels",), ("optimizers", "schedules", "normalization", "noise"),
                 ("distributed",), ("bigbatch.h",)]
LIBRARIES = {folder for rank in LIBRARY_RANKS for folder in rank}
RUNNER = {
    "experiments/io": set(),
    "experiments/cluster": {"experiments/io"},
    "experiments/workload": {"experiments/io"} | LIBRARIES,
    "experiments/optim": {"experiments/io"} | LIBRARIES,
    "experiments/runconfig": {"experiments/io", "experiments/workload", "experiments/optim"} | LIBRARIES,
    "experiments/train": {"experiments/io", "experiments/workload", "experiments/optim",
                          "experiments/runconfig"} | LIBRARIES,
    "experiments/sweep": {"experiments/io", "experiments/cluster", "experiments/workload", "experiments/optim",
                          "experiments/runconfig", "experiments/train"} | LIBRARIES,
}
RUNNER["experiments/cli"] = set(RUNNER) | LIBRARIES
FREE = ("tests", "benchmarks", "examples", "scripts")


def layer(path):
    """The layer a repository file belongs to: a library folder, bigbatch.h,
    experiments/FOLDER, or None for a file outside the layers."""
    parts = path.split("/")
    if parts[0] == "experiments":
        return "/".join(parts[:2]) if len(parts) > 2 else "experiments"
    if len(parts) == 1:
        return path if path in LIBRARIES else None
    return parts[0] if parts[0] in LIBRARIES else None


def allowed(frm):
    """The layers a file of layer `frm` may include (besides its own)."""
    if frm in RUNNER:
        return RUNNER[frm]
    if frm == "experiments":  # a file at the top of experiments/: none should be there
        return set()
    for i, rank in enumerate(LIBRARY_RANKS):
        if frm in rank:
            return {folder for below in LIBRARY_RANKS[:i] for folder in below}
    raise KeyError(frm)


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    problems = []
    files = [f for f in sources(repo) if not f.startswith(FREE)]
    for f in files:
        frm = layer(f)
        if frm is None:
            continue
        if frm == "experiments":
            problems.append(f"{f}: a file at the top of experiments/: put it in the folder of its job")
            continue
        with open(os.path.join(repo, f), encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        for m in INCLUDE.finditer(text):
            kind, name = m.groups()
            if kind != '"':
                continue
            target = os.path.normpath(os.path.join(os.path.dirname(f), name))
            to = layer(target)
            if to is None or to == frm or to in allowed(frm):
                continue
            line = text.count("\n", 0, m.start()) + 1
            problems.append(f"{f}:{line}: \"{name}\": {frm} may not include {to} (up, sideways or, torch-free, anything)")
    return report(problems, f"layers: {len(files)} files,")


if __name__ == "__main__":
    sys.exit(main())
