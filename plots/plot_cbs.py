#!/usr/bin/python3
"""Plots of a `bigbatch cbs` folder, into CBS_DIR/plots/:

  cbs_curve      the critical batch size against examples seen (log axes):
                 each checkpoint's interval [B*, next tested batch) as a bar,
                 a point at its geometric middle (an up-triangle where B* is
                 the largest batch tried: a lower bound), the reference runs'
                 B_simple beside it, and the derived batch-size warmup
  cbs_branches   each checkpoint's branch losses against branch batch size,
                 the critical batch marked
  cbs_compare    (after --compare) the target metric against steps and
                 against examples for the small, large and warmup runs

Each figure as PNG and SVG, with its points as JSON beside it.
Usage: plot_cbs.py CBS_DIR   (or plot_sweep.py --cbs CBS_DIR)
"""
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_sweep import number, read_csv, save  # noqa: E402


def curve(d, rows, patch, out):
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    points = {"critical": [], "b_simple": [], "warmup": []}
    for r in rows:
        e, b, nxt = int(r["examples"]), number(r["critical_batch"]), number(r["next_batch"])
        x = max(e, 1)
        if b is None:
            continue
        mid = math.sqrt(b * nxt) if nxt else b
        points["critical"].append({"examples": e, "critical_batch": b, "next_batch": nxt, "plotted": mid})
        if nxt:
            ax.plot([x, x], [b, nxt], color="C0", alpha=0.35, linewidth=4)
        ax.plot([x], [mid], marker="o" if nxt else "^", color="C0", linestyle="none")
    # B_simple is a ratio of two noisy estimates: a negative one (|G|^2
    # estimated below 0) has no place on a log axis and is left out.
    measured = [r for r in rows if (number(r["b_simple"]) or 0) > 0]
    xs = [max(int(r["examples"]), 1) for r in measured]
    gs = [number(r["b_simple"]) for r in measured]
    points["b_simple"] = [{"examples": x, "b_simple": g} for x, g in zip(xs, gs)]
    ax.plot([], [], marker="o", color="C0", linestyle="none", label="critical batch (measured)")
    if gs:
        ax.plot(xs, gs, marker="s", color="C1", label="B_simple (reference run)")
    # The warmup: batch against examples, as steps up to the last checkpoint.
    stages = patch["schedule"].get("batch_warmup", [])
    last = max(max(int(r["examples"]) for r in rows), 1)
    first = min((max(int(r["examples"]), 1) for r in rows), default=1)
    wx, wy, start = [], [], first
    for st in stages:
        wx += [start, st["until_examples"]]
        wy += [st["batch"], st["batch"]]
        start = st["until_examples"]
    wx += [start, last]
    wy += [patch["batch_sizes"][0]] * 2
    points["warmup"] = [{"examples": x, "batch": y} for x, y in zip(wx, wy)]
    ax.plot(wx, wy, color="C2", linestyle="--", label="derived batch-size warmup")
    ax.set_xscale("log")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("examples seen by the reference run")
    ax.set_ylabel("batch size")
    ax.set_title(os.path.basename(os.path.normpath(d)) + ": critical batch size over training", fontsize=10)
    ax.legend(fontsize=8)
    save(fig, out, "cbs_curve", points)


def branches(d, rows, cfg, out):
    batches = cfg["cbs"]["branch_batches"]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    points = []
    cmap = plt.get_cmap("viridis")
    for k, r in enumerate(rows):
        losses = [number(r[f"loss_b{b}"]) for b in batches]
        xs = [b for b, v in zip(batches, losses) if v is not None]
        ys = [v for v in losses if v is not None]
        color = cmap(k / max(1, len(rows) - 1))
        ax.plot(xs, ys, marker=".", color=color, label=f"{int(r['examples'])} examples")
        crit = number(r["critical_batch"])
        if crit is not None and r[f"loss_b{int(crit)}"]:
            ax.plot([crit], [number(r[f"loss_b{int(crit)}"])], marker="*", markersize=12, color=color)
        points.append({"examples": int(r["examples"]), "batches": xs, "losses": ys, "critical_batch": crit})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("branch batch size")
    ax.set_ylabel(f"val_loss after {cfg['cbs']['window']} examples")
    ax.set_title("branch losses at each checkpoint (star: critical batch)", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    save(fig, out, "cbs_branches", points)


def compare(d, cfg, out):
    runs = read_csv(os.path.join(d, "compare.csv"))
    metric = cfg["target"]["metric"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    points = {}
    for r in runs:
        if r["seed"] != runs[0]["seed"]:
            continue
        name = f"{r['run']}_b{r['batch_size']}_s{r['seed']}"
        m = read_csv(os.path.join(d, "compare", name, "metrics.csv"))
        steps = [int(x["step"]) for x in m]
        examples = [int(x["examples"]) for x in m]
        values = [number(x[metric]) for x in m]
        label = f"{r['run']} (B={r['batch_size']})"
        axes[0].plot(steps, values, label=label)
        axes[1].plot(examples, values, label=label)
        points[r["run"]] = {"steps": steps, "examples": examples, metric: values}
    for ax, xlabel in zip(axes, ["steps", "examples seen"]):
        ax.axhline(cfg["target"]["threshold"], color="gray", linestyle="--")
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(metric.replace("_", " "))
        ax.legend(fontsize=8)
    axes[0].set_title("to the target: fixed small, fixed large, warmup", fontsize=10)
    save(fig, out, "cbs_compare", points)


def main(d):
    out = os.path.join(d, "plots")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(d, "cbs.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(d, "schedule.json")) as f:
        patch = json.load(f)
    rows = read_csv(os.path.join(d, "cbs.csv"))
    curve(d, rows, patch, out)
    branches(d, rows, cfg, out)
    names = ["cbs_curve", "cbs_branches"]
    if os.path.exists(os.path.join(d, "compare.csv")):
        compare(d, cfg, out)
        names.append("cbs_compare")
    print(f"plots in {out}: {', '.join(names)} (.png, .svg, .json)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: plot_cbs.py CBS_DIR")
    main(sys.argv[1])
