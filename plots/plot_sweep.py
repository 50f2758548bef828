#!/usr/bin/python3
"""Plots of bigbatch sweep folders (reads only the folders; writes figures).

One sweep, into SWEEP_DIR/plots/:
  1. validation metric and training loss of the best trial of each batch
     size, against step and against examples seen (four panels); with
     "average", the averaged weights' metric dashed
  2. steps to target against batch size (log2 axes), perfect scaling, fit S(B);
     with several seeds, each point (the best rate's median) carries its
     bootstrap interval over seeds as an error bar (an arrow where its high
     end is "not reached")
  3. best learning rate against batch size, with linear and sqrt slopes; a
     rate on the edge of its search circled
  4. learning rate and batch size schedules against step (drawn as steps)
  5. the gradient noise scale B_simple over training
  6. with "horizons", the final metric at each horizon (horizons.csv)

Several sweeps (the variants of one config, or folders from different runs),
compared on one set of figures in OUT_DIR:
  compare_steps_to_target   steps to target against batch size, a line per
                            sweep, its fit where it has one, perfect scaling
  compare_examples_to_target  examples to target against batch size
  compare_bytes_to_target   bytes each rank sent in the gradient exchange to
                            reach the target (data-parallel sweeps: the
                            tables' bytes column), when every sweep has them
  compare_best_lr           best rate against batch size per sweep
  compare_horizons          the sweeps with "horizons": their final metric
                            at each horizon, a panel per batch size
  compare_validation        per batch size, each sweep's best trial's
                            validation curve against examples seen (and
                            its averaged weights', dashed, with "average")

Each figure is written as PNG and SVG, with the plotted points beside it as
JSON (same name), so tests and readers can check them against the tables.
Usage: plot_sweep.py SWEEP_DIR
       plot_sweep.py --compare OUT_DIR LABEL=SWEEP_DIR [LABEL=SWEEP_DIR ...]
       plot_sweep.py --cbs CBS_DIR   (a `bigbatch cbs` folder: plot_cbs.py)
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


def interval(row):
    """A row's (low, high) bootstrap interval of its steps; None without one
    (one seed, or a table from before the column); high may be math.inf."""
    low, high = number(row.get("steps_low")), number(row.get("steps_high"))
    return (low, high) if low is not None and high is not None else None


def error_bars(ax, rows, color, scale=lambda row: 1.0):
    """Draws each reached row's interval around its steps (times scale(row))."""
    for r in rows:
        span = interval(r)
        if span is None:
            continue
        b, mid, k = int(r["batch_size"]), float(r["steps"]), scale(r)
        low, high = span
        ax.plot([b, b], [low * k, (high if math.isfinite(high) else mid * 1.5) * k], "-", color=color,
                linewidth=1, alpha=0.7)
        if not math.isfinite(high):
            ax.plot([b], [mid * 1.5 * k], "^", color=color, markersize=5)


def save(fig, out, name, points):
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(out, f"{name}.{ext}"), dpi=120, bbox_inches="tight")
    plt.close(fig)
    tmp = os.path.join(out, f"{name}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(points, f, indent=1)
    os.replace(tmp, os.path.join(out, f"{name}.json"))


def load_sweep(sweep_dir):
    with open(os.path.join(sweep_dir, "sweep.json")) as f:
        sweep = json.load(f)
    with open(os.path.join(sweep_dir, "fit.json")) as f:
        fit = json.load(f)
    return {"dir": sweep_dir, "sweep": sweep, "fit": fit,
            "table": read_csv(os.path.join(sweep_dir, "steps_to_target.csv"))}


def averaged_curve(rows, metric):
    """The averaged weights' `metric` at each evaluation (metrics.csv's
    avg_ columns, "average" in the config), or None without one."""
    values = [number(r.get("avg_" + metric, "")) for r in rows]
    return values if any(v is not None for v in values) else None


def main(sweep_dir):
    loaded = load_sweep(sweep_dir)
    table, sweep, fit = loaded["table"], loaded["sweep"], loaded["fit"]
    metric = sweep["target"]["metric"]
    threshold = sweep["target"]["threshold"]
    out = os.path.join(sweep_dir, "plots")
    os.makedirs(out, exist_ok=True)
    best = {int(r["batch_size"]): r["trial"] for r in table}
    metrics = {b: read_csv(os.path.join(sweep_dir, t, "metrics.csv")) for b, t in best.items()}
    colors = plt.cm.viridis([i / max(1, len(best) - 1) for i in range(len(best))])

    # 1. validation metric and training loss against step and examples seen
    # (with "average", the averaged weights' metric dashed beside it)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharey="row")
    points = {}
    dashed = False
    for color, (b, rows) in zip(colors, sorted(metrics.items())):
        curves = {key: [number(r[key]) for r in rows] for key in (metric, "train_loss")}
        xs = {"step": [int(r["step"]) for r in rows], "examples": [int(r["examples"]) for r in rows]}
        for row, key in enumerate((metric, "train_loss")):
            for col, x in enumerate(("step", "examples")):
                axes[row][col].plot(xs[x], curves[key], color=color, label=f"B={b}")
        averaged = averaged_curve(rows, metric)
        if averaged:
            curves["avg_" + metric] = averaged
            for col, x in enumerate(("step", "examples")):
                axes[0][col].plot(xs[x], [math.nan if v is None else v for v in averaged], color=color,
                                  linestyle="--", label=None if dashed else "averaged weights (dashed)")
            dashed = True
        points[str(b)] = {"trial": best[b], **xs, **curves}
    for col, x in enumerate(("step", "examples seen")):
        axes[0][col].axhline(threshold, color="gray", linestyle="--", label="target")
        for row in range(2):
            axes[row][col].set_xscale("log")
        axes[1][col].set_xlabel(x)
    axes[0][0].set_ylabel(metric.replace("_", " "))
    axes[1][0].set_ylabel("training loss")
    axes[1][0].set_yscale("log")
    axes[0][0].set_title("Best trial per batch size")
    axes[0][1].legend(fontsize=8)
    save(fig, out, "validation", points)

    # 2. steps to target against batch size
    done = [r for r in table if r["reached"] == "1"]
    reached = [(int(r["batch_size"]), float(r["steps"])) for r in done]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    points = {"batch_sizes": [b for b, _ in reached], "steps": [s for _, s in reached], "fit": fit,
              "intervals": [None if interval(r) is None else
                            [interval(r)[0], interval(r)[1] if math.isfinite(interval(r)[1]) else None]
                            for r in done]}
    if reached:
        bs, ss = zip(*reached)
        seeds = max(int(r.get("seeds") or 1) for r in done)
        ax.plot(bs, ss, "o-", label="measured" if seeds == 1 else f"median of {seeds} seeds")
        error_bars(ax, done, "C0")
        b0, s0 = reached[0]
        ax.plot(bs, [s0 * b0 / b for b in bs], "k:", label="perfect scaling")
        if "s_min" in fit:
            grid = [bs[0] * (bs[-1] / bs[0]) ** (i / 50) for i in range(51)]
            b_crit = fit["b_crit"] if fit["b_crit"] is not None else math.inf
            curve = [fit["s_min"] + fit["e_min"] / b for b in grid]
            label = f"S_min(1+B_crit/B), B_crit={b_crit:.0f}"
            if "range" in fit:
                low, high = (x if x is not None else math.inf for x in fit["range"]["b_crit"])
                label += f" ({fit['range']['level']:.0%}: {low:.0f}-{high:.0f})"
            ax.plot(grid, curve, "r--", label=label)
            points["fit_curve"] = {"batch_sizes": grid, "steps": curve}
    if "error" in fit:
        ax.text(0.03, 0.03, "no fit: " + fit["error"], transform=ax.transAxes, fontsize=7, color="r")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel(f"steps to {metric} <= {threshold}")
    ax.legend(fontsize=8)
    save(fig, out, "steps_to_target", points)

    # 3. best learning rate against batch size
    rows = [r for r in table if r["reached"] == "1"]
    rates = [(int(r["batch_size"]), float(r["best_lr"])) for r in rows]
    edges = [r.get("edge", "") for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    points = {"batch_sizes": [b for b, _ in rates], "best_lr": [x for _, x in rates], "edge": edges}
    if rates:
        bs, lrs = zip(*rates)
        ax.plot(bs, lrs, "o-", label="best rate")
        on_edge = [(b, x) for (b, x), e in zip(rates, edges) if e]
        if on_edge:  # hollow: the best rate may lie beyond the search
            ax.plot(*zip(*on_edge), "o", markersize=11, markerfacecolor="none", markeredgecolor="r",
                    label="on the search's edge")
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
        # Rates and batch sizes hold between evaluations: draw them as steps.
        a1.plot(steps, lrs, color=color, label=f"B={b}", drawstyle="steps-post")
        a2.plot(steps, batches, color=color, drawstyle="steps-post")
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
    drawn = "validation, steps_to_target, best_lr, schedules, noise_scale"
    if horizon_figure(out, "horizons", [("", sweep_dir)]):
        drawn += ", horizons"
    print(f"plots in {out}: {drawn} (.png, .svg, .json)")


def panels(count, width, height):
    """A figure of `count` panels sharing their y axis, up to 3 a row, the
    unused ones hidden: (fig, axes, panel), panel(i) the i-th."""
    cols = min(3, count)
    nrows = (count + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(width * cols, height * nrows), squeeze=False, sharey=True)
    for j in range(count, nrows * cols):
        axes[j // cols][j % cols].axis("off")
    return fig, axes, lambda i: axes[i // cols][i % cols]


def read_horizons(sweep_dir):
    """horizons.csv's rows by batch size (a sweep whose trials have
    "horizons"), and horizons.json's cost per batch size; None without."""
    path = os.path.join(sweep_dir, "horizons.csv")
    if not os.path.exists(path):
        return None
    rows = {}
    for r in read_csv(path):
        rows.setdefault(int(r["batch_size"]), []).append(r)
    with open(os.path.join(sweep_dir, "horizons.json")) as f:
        cost = json.load(f)["cost"]
    return rows, cost


def horizon_figure(out, name, labelled):
    """The loss-against-horizon frontier: per batch size a panel, each
    sweep's final metric at each horizon (the best rate's median over seeds,
    its bootstrap interval as error bars) against the examples seen there;
    the legend gives the steps branching trained against each horizon alone.
    False (nothing drawn) when no sweep has horizons."""
    frontiers = [(label, read_horizons(d)) for label, d in labelled]
    frontiers = [(label, h) for label, h in frontiers if h is not None]
    if not frontiers:
        return False
    batches = sorted({b for _, (rows, _) in frontiers for b in rows})
    fig, axes, panel = panels(len(batches), 4.8, 3.8)
    points = {}
    for i, b in enumerate(batches):
        ax = panel(i)
        points[str(b)] = {}
        for k, (label, (rows, cost)) in enumerate(frontiers):
            if b not in rows:
                continue
            rs = rows[b]
            xs = [int(r["examples"]) for r in rs]
            ys = [number(r["final"]) if r["final"] != "inf" else math.nan for r in rs]
            low = [number(r["final_low"]) for r in rs]
            high = [number(r["final_high"]) for r in rs]
            share = cost.get(str(b))
            tag = f"{label + ': ' if label else ''}" + (f"{share['ratio']:.2f}x the steps of separate runs"
                                                          if share else "cost incomplete")
            color = plt.cm.tab10.colors[k % 10]
            ax.plot(xs, ys, "o-", color=color, label=tag)
            bars = [(x, y, lo, hi) for x, y, lo, hi in zip(xs, ys, low, high) if lo is not None and hi is not None]
            if bars:
                ax.errorbar([x for x, *_ in bars], [y for _, y, *_ in bars],
                            yerr=[[y - lo for _, y, lo, _ in bars], [hi - y for _, y, _, hi in bars]],
                            fmt="none", ecolor=color, capsize=3)
            points[str(b)][label or "sweep"] = {"horizon": [float(r["horizon"]) for r in rs], "examples": xs,
                                                "final": ys, "low": low, "high": high, "cost": share}
        ax.set_xscale("log")
        ax.set_title(f"B={b}", fontsize=10)
        ax.set_xlabel("examples at the horizon")
        ax.legend(fontsize=7)
    metric = frontiers[0][1][0][batches[0]][0]["metric"]
    axes[0][0].set_ylabel(f"final {metric.replace('_', ' ')}")
    save(fig, out, name, points)
    return True


def compare(out, labelled):
    """The comparison figures of several sweeps, labelled (label, dir) pairs."""
    sweeps = [(label, load_sweep(d)) for label, d in labelled]
    targets = {(s["sweep"]["target"]["metric"], s["sweep"]["target"]["threshold"]) for _, s in sweeps}
    if len(targets) != 1:
        sys.exit(f"plot_sweep.py: the sweeps have different targets {sorted(targets)}; compare like with like")
    metric, threshold = targets.pop()
    os.makedirs(out, exist_ok=True)
    colors = plt.cm.tab10.colors
    markers = "os^DvPX*"
    style = {label: (colors[i % len(colors)], markers[i % len(markers)]) for i, (label, _) in enumerate(sweeps)}

    def reached(s, key):
        return [(int(r["batch_size"]), float(r[key])) for r in s["table"] if r["reached"] == "1"]

    # Steps, examples and bytes to target, best rate: one line per sweep.
    figures = [("compare_steps_to_target", "steps", f"steps to {metric} <= {threshold}"),
               ("compare_examples_to_target", "examples", f"examples to {metric} <= {threshold}"),
               ("compare_best_lr", "best_lr", "best learning rate")]
    counted = all(any(r.get("bytes") for r in s["table"] if r["reached"] == "1") for _, s in sweeps)
    if counted:
        figures.insert(2, ("compare_bytes_to_target", "bytes", f"bytes sent per rank to {metric} <= {threshold}"))
    for name, key, ylabel in figures:
        fig, ax = plt.subplots(figsize=(7, 5))
        points = {}
        first = None
        for label, s in sweeps:
            color, marker = style[label]
            pairs = reached(s, key)
            points[label] = {"batch_sizes": [b for b, _ in pairs], key: [v for _, v in pairs]}
            if not pairs:
                continue
            bs, vs = zip(*pairs)
            ax.plot(bs, vs, marker=marker, color=color, label=label)
            done = [r for r in s["table"] if r["reached"] == "1"]
            if key == "steps":
                error_bars(ax, done, color)
            elif key == "examples":  # the steps' interval, in examples (their ratio per row)
                error_bars(ax, done, color, lambda r: float(r["examples"]) / float(r["steps"]))
            first = first or pairs[0]
            fit = s["fit"]
            # The fit is in steps: examples are not steps x B once a schedule
            # grows the batch, so only the steps figure draws it.
            if key == "steps" and "s_min" in fit:
                points[label]["fit"] = fit
                grid = [bs[0] * (bs[-1] / bs[0]) ** (i / 50) for i in range(51)]
                curve = [fit["s_min"] + fit["e_min"] / b for b in grid]
                ax.plot(grid, curve, "--", color=color, linewidth=1,
                        label=f"{label}: fit, B_crit={fit['b_crit'] if fit['b_crit'] is not None else math.inf:.0f}")
        if first and key == "steps":
            b0, s0 = first
            all_b = sorted({b for _, s in sweeps for b, _ in reached(s, key)})
            ax.plot(all_b, [s0 * b0 / b for b in all_b], "k:", label="perfect scaling")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2 if key not in ("best_lr", "bytes") else 10)
        ax.set_xlabel("batch size")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
        save(fig, out, name, points)

    # Each batch size's best trial of every sweep, against examples seen.
    batches = sorted({int(r["batch_size"]) for _, s in sweeps for r in s["table"]})
    fig, axes, panel = panels(len(batches), 4.5, 3.5)
    points = {}
    for i, b in enumerate(batches):
        ax = panel(i)
        points[str(b)] = {}
        for label, s in sweeps:
            row = next((r for r in s["table"] if int(r["batch_size"]) == b), None)
            if row is None:
                continue
            rows = read_csv(os.path.join(s["dir"], row["trial"], "metrics.csv"))
            examples = [int(r["examples"]) for r in rows]
            values = [number(r[metric]) for r in rows]
            color, _ = style[label]
            ax.plot(examples, values, color=color, label=label)
            points[str(b)][label] = {"trial": row["trial"], "examples": examples, metric: values}
            averaged = averaged_curve(rows, metric)
            if averaged:
                ax.plot(examples, [math.nan if v is None else v for v in averaged], color=color, linestyle="--",
                        label=f"{label}: averaged weights")
                points[str(b)][label]["avg_" + metric] = averaged
        ax.axhline(threshold, color="gray", linestyle="--")
        ax.set_xscale("log")
        ax.set_title(f"B={b}", fontsize=10)
        ax.set_xlabel("examples seen")
    axes[0][0].set_ylabel(metric.replace("_", " "))
    axes[0][0].legend(fontsize=8)
    save(fig, out, "compare_validation", points)
    horizons = horizon_figure(out, "compare_horizons", [(label, s["dir"]) for label, s in sweeps])
    print(f"comparison plots in {out}: compare_steps_to_target, compare_examples_to_target, "
          f"{'compare_bytes_to_target, ' if counted else ''}compare_best_lr, compare_validation"
          f"{', compare_horizons' if horizons else ''} (.png, .svg, .json)")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--cbs":  # a bigbatch cbs folder
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import plot_cbs
        plot_cbs.main(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "--compare":
        compare(sys.argv[2], [arg.split("=", 1) for arg in sys.argv[3:]])
    elif len(sys.argv) == 2:
        main(sys.argv[1])
    else:
        sys.exit("usage: plot_sweep.py SWEEP_DIR | plot_sweep.py --compare OUT_DIR LABEL=SWEEP_DIR ...")
