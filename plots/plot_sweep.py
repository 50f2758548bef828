#!/usr/bin/python3
"""Plots of a bigbatch sweep folder (reads only the folder; writes DIR/plots/).

  1. validation metric against step, the best trial of each batch size
  2. steps to target against batch size (log2 axes), perfect scaling, fit S(B)
  3. best learning rate against batch size, with linear and sqrt slopes
  4. learning rate and batch size schedules against step
  5. the gradient noise scale B_simple over training

Each figure is written as PNG and SVG, with the plotted points beside it as
JSON (same name), so tests and readers can check them against the tables.
Usage: plot_sweep.py SWEEP_DIR
"""
import csv
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def number(text):
    return float(text) if text not in ("", None) else None


def save(fig, out, name, points):
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(out, f"{name}.{ext}"), dpi=120, bbox_inches="tight")
    plt.close(fig)
    tmp = os.path.join(out, f"{name}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(points, f, indent=1)
    os.replace(tmp, os.path.join(out, f"{name}.json"))


def main(sweep_dir):
    table = read_csv(os.path.join(sweep_dir, "steps_to_target.csv"))
    with open(os.path.join(sweep_dir, "sweep.json")) as f:
        sweep = json.load(f)
    with open(os.path.join(sweep_dir, "fit.json")) as f:
        fit = json.load(f)
    metric = sweep["target"]["metric"]
    threshold = sweep["target"]["threshold"]
    out = os.path.join(sweep_dir, "plots")
    os.makedirs(out, exist_ok=True)
    best = {int(r["batch_size"]): r["trial"] for r in table}
    metrics = {b: read_csv(os.path.join(sweep_dir, t, "metrics.csv")) for b, t in best.items()}
    colors = plt.cm.viridis([i / max(1, len(best) - 1) for i in range(len(best))])

    # 1. validation metric against step
    fig, ax = plt.subplots(figsize=(7, 4.5))
    points = {}
    for color, (b, rows) in zip(colors, sorted(metrics.items())):
        steps = [int(r["step"]) for r in rows]
        values = [number(r[metric]) for r in rows]
        ax.plot(steps, values, color=color, label=f"B={b}")
        points[str(b)] = {"trial": best[b], "step": steps, metric: values}
    ax.axhline(threshold, color="gray", linestyle="--", label="target")
    ax.set_xscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_title("Best trial per batch size")
    ax.legend(fontsize=8)
    save(fig, out, "validation", points)

    # 2. steps to target against batch size
    reached = [(int(r["batch_size"]), int(r["steps"])) for r in table if r["reached"] == "1"]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    points = {"batch_sizes": [b for b, _ in reached], "steps": [s for _, s in reached], "fit": fit}
    if reached:
        bs, ss = zip(*reached)
        ax.plot(bs, ss, "o-", label="measured")
        b0, s0 = reached[0]
        ax.plot(bs, [s0 * b0 / b for b in bs], "k:", label="perfect scaling")
        if "s_min" in fit:
            grid = [bs[0] * (bs[-1] / bs[0]) ** (i / 50) for i in range(51)]
            b_crit = fit["b_crit"] if fit["b_crit"] is not None else math.inf
            curve = [fit["s_min"] + fit["e_min"] / b for b in grid]
            label = f"S_min(1+B_crit/B), B_crit={b_crit:.0f}"
            ax.plot(grid, curve, "r--", label=label)
            points["fit_curve"] = {"batch_sizes": grid, "steps": curve}
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel(f"steps to {metric} <= {threshold}")
    ax.legend(fontsize=8)
    save(fig, out, "steps_to_target", points)

    # 3. best learning rate against batch size
    rates = [(int(r["batch_size"]), float(r["best_lr"])) for r in table if r["reached"] == "1"]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    points = {"batch_sizes": [b for b, _ in rates], "best_lr": [x for _, x in rates]}
    if rates:
        bs, lrs = zip(*rates)
        ax.plot(bs, lrs, "o-", label="best rate")
        ax.plot(bs, [lrs[0] * b / bs[0] for b in bs], "k:", label="linear")
        ax.plot(bs, [lrs[0] * math.sqrt(b / bs[0]) for b in bs], "k--", label="sqrt")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("learning rate")
    ax.legend(fontsize=8)
    save(fig, out, "best_lr", points)

    # 4. schedules
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    points = {}
    for color, (b, rows) in zip(colors, sorted(metrics.items())):
        steps = [int(r["step"]) for r in rows]
        lrs = [number(r["lr"]) for r in rows]
        batches = [int(r["batch_size"]) for r in rows]
        a1.plot(steps, lrs, color=color, label=f"B={b}")
        a2.plot(steps, batches, color=color)
        points[str(b)] = {"step": steps, "lr": lrs, "batch_size": batches}
    a1.set_ylabel("learning rate")
    a1.legend(fontsize=8)
    a2.set_ylabel("batch size")
    a2.set_yscale("log", base=2)
    a2.set_xlabel("step")
    save(fig, out, "schedules", points)

    # 5. gradient noise scale
    fig, ax = plt.subplots(figsize=(7, 4.5))
    points = {}
    for color, (b, rows) in zip(colors, sorted(metrics.items())):
        # Early estimates can be <= 0 (the |G|^2 average has not settled): a
        # log axis shows the positive ones, the JSON keeps every value.
        pairs = [(int(r["step"]), number(r["gns"])) for r in rows if number(r["gns"]) is not None]
        if pairs:
            positive = [(s, g) for s, g in pairs if g > 0]
            if positive:
                ax.plot(*zip(*positive), color=color, label=f"B={b}")
            points[str(b)] = {"step": [s for s, _ in pairs], "gns": [g for _, g in pairs]}
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("B_simple")
    ax.set_title("Gradient noise scale" + ("" if points else " (not measured: gns.micro_batches = 0)"))
    if points:
        ax.legend(fontsize=8)
    save(fig, out, "noise_scale", points)
    print(f"plots in {out}: validation, steps_to_target, best_lr, schedules, noise_scale (.png, .svg, .json)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: plot_sweep.py SWEEP_DIR")
    main(sys.argv[1])
