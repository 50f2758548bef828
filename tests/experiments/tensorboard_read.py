"""Reads a sweep folder's TensorBoard event files with the real `tensorboard`
package and checks them against the trials' metrics.csv (written by another
path): every evaluation's step, and every scalar to float32 rounding. Also: the
sweep folder's steps-to-target text, the trust ratios of a layer-wise
optimizer, Muon's update RMS per matrix, and that a file cut anywhere in its last record still reads up to
the record before it (a killed run).

Usage: tensorboard_read.py SWEEP_DIR [--trust-ratios] [--muon-update-rms NAME,...] [--trials-only]
(--trials-only: a `bigbatch train` folder, with no sweep-level text;
--muon-update-rms: the parameters Muon orthogonalizes, by name.)
Prints "read back ok" and exits 0 when everything holds.
"""
import csv
import json
import math
import os
import shutil
import sys
import tempfile

from tensorboard.backend.event_processing import event_accumulator, event_file_loader

# metrics.csv column -> the tag bigbatch writes it under
TAGS = {"train_loss": "train/loss", "val_loss": "val/loss", "val_error": "val/error", "lr": "lr",
        "batch_size": "batch_size", "examples": "examples", "epoch": "epoch", "gns": "gns/b_simple"}
EVENT_FILE = "events.out.tfevents.bigbatch"


def fail(message):
    print("FAIL tensorboard: " + message)
    sys.exit(1)


def scalars_of(run_dir):
    """{tag: [(step, value)]} through EventAccumulator, as TensorBoard's UI loads a run."""
    acc = event_accumulator.EventAccumulator(run_dir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def close32(a, b):
    return a == b or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-30)


def check_muon(run_dir, scalars, rows, names):
    """muon_update_rms/<name> for exactly the hidden matrices, at every
    evaluation, and about 0.2 * lr (match_rms_adamw: 0.2 sqrt(max(r, c))
    * lr * ||O||_F / sqrt(r c), and O's singular values lie in about
    [0.7, 1.2] after the iteration): within [0.1, 0.26] * lr."""
    tags = sorted(t for t in scalars if t.startswith("muon_update_rms/"))
    if tags != sorted("muon_update_rms/" + n for n in names):
        fail(f"{run_dir}: Muon's update RMS under {tags}, expected one for each of {sorted(names)}")
    lr = {int(r["step"]): float(r["lr"]) for r in rows}
    for tag in tags:
        if [s for s, _ in scalars[tag]] != [int(r["step"]) for r in rows]:
            fail(f"{run_dir}: {tag} not at every evaluation")
        for step, value in scalars[tag]:
            if not 0.1 * lr[step] <= value <= 0.26 * lr[step]:
                fail(f"{run_dir}: {tag} at step {step} is {value}, not about 0.2 * lr = {0.2 * lr[step]}")


def check_trial(run_dir, want_trust, muon=None):
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        # A seed whose rate was beaten before it started is pruned at step 0
        # (trial_queue.h): it has nothing to log.
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        if summary["status"] == "pruned" and summary["steps"] == 0:
            return 0, None
        fail(run_dir + ": metrics.csv has no rows")
    scalars = scalars_of(run_dir)
    steps = [int(r["step"]) for r in rows]
    for column, tag in TAGS.items():
        expected = [(int(r["step"]), float(r[column])) for r in rows if r[column] != ""]
        got = scalars.get(tag, [])
        if [s for s, _ in got] != [s for s, _ in expected]:
            fail(f"{run_dir}: {tag} at steps {[s for s, _ in got]}, metrics.csv has {[s for s, _ in expected]}")
        for (step, value), (_, want) in zip(got, expected):
            if not close32(value, want):
                fail(f"{run_dir}: {tag} at step {step} is {value}, metrics.csv has {want}")
    trust = [t for t in scalars if t.startswith("trust_ratio/")]
    if want_trust:
        if not trust:
            fail(run_dir + ": no trust_ratio/ scalars")
        for tag in trust:
            if [s for s, _ in scalars[tag]] != steps:
                fail(f"{run_dir}: {tag} not at every evaluation")
            if not all(v > 0 and math.isfinite(v) for _, v in scalars[tag]):
                fail(f"{run_dir}: {tag} has a value that is not a positive number")
    elif trust:
        fail(run_dir + ": trust ratios from an optimizer without them")
    if muon is not None:
        check_muon(run_dir, scalars, rows, muon)
    elif any(t.startswith("muon_update_rms/") for t in scalars):
        fail(run_dir + ": Muon's update RMS from another optimizer")
    return len(rows), len(scalars)


def check_cut_tail(path):
    """Cut the file inside its last record at several points: the loader reads
    every whole record before it and stops without an error."""
    whole = list(event_file_loader.EventFileLoader(path).Load())
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        data = f.read()
    # the last record's length: its header's first 8 bytes, little-endian
    last_start = size
    events = 0
    pos = 0
    while pos < size:
        length = int.from_bytes(data[pos:pos + 8], "little")
        last_start = pos
        pos += 16 + length
        events += 1
    if events != len(whole):
        fail(f"{path}: {len(whole)} events read, {events} records framed")
    with tempfile.TemporaryDirectory() as tmp:
        for cut in sorted({last_start + 1, last_start + 8, last_start + 13, size - 4, size - 1}):
            cut_path = os.path.join(tmp, EVENT_FILE)
            with open(cut_path, "wb") as f:
                f.write(data[:cut])
            got = list(event_file_loader.EventFileLoader(cut_path).Load())
            if len(got) != len(whole) - 1:
                fail(f"{path} cut at byte {cut} of {size}: {len(got)} events read, expected {len(whole) - 1}")
            if [e.step for e in got] != [e.step for e in whole[:-1]]:
                fail(f"{path} cut at byte {cut}: the steps read differ from the whole file's")


def main():
    sweep_dir = sys.argv[1]
    want_trust = "--trust-ratios" in sys.argv[2:]
    muon = None
    if "--muon-update-rms" in sys.argv[2:]:
        muon = sys.argv[sys.argv.index("--muon-update-rms") + 1].split(",")
    trials = sorted(d for d in os.listdir(sweep_dir) if os.path.isfile(os.path.join(sweep_dir, d, "metrics.csv")))
    if not trials:
        fail(sweep_dir + ": no trial folders")
    evaluations = 0
    logged = []
    for name in trials:
        rows, _ = check_trial(os.path.join(sweep_dir, name), want_trust, muon)
        evaluations += rows
        if rows:
            logged.append(name)
    check_cut_tail(os.path.join(sweep_dir, logged[0], EVENT_FILE))
    if "--trials-only" in sys.argv[2:]:
        print(f"{len(trials)} trials, {evaluations} evaluations read back by tensorboard")
        print("read back ok")
        return

    # The sweep folder's own run: the steps-to-target table in the Text tab.
    texts = [e for e in event_file_loader.EventFileLoader(os.path.join(sweep_dir, EVENT_FILE)).Load()
             if e.summary.value]
    value = texts[0].summary.value[0] if texts else None
    if value is None or value.tag != "steps_to_target" or value.metadata.plugin_data.plugin_name != "text":
        fail(sweep_dir + ": no steps_to_target text summary")
    table = value.tensor.string_val[0].decode()
    with open(os.path.join(sweep_dir, "steps_to_target.csv")) as f:
        batches = [r["batch_size"] for r in csv.DictReader(f)]
    if not all(f"| {b} " in table for b in batches):
        fail(sweep_dir + ": the text summary lacks a batch size of steps_to_target.csv:\n" + table)
    print(f"{len(trials)} trials, {evaluations} evaluations read back by tensorboard")
    print("read back ok")


if __name__ == "__main__":
    main()
