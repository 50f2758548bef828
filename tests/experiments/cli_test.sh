#!/usr/bin/env bash
# End-to-end tests of the `bigbatch` CLI, one scenario per call (ctest runs
# each as its own test). Usage: cli_test.sh SCENARIO BIGBATCH SOURCE_DIR WORK_DIR
set -euo pipefail
scenario=$1 bigbatch=$2 src=$3 work=$4/$1
rm -rf "$work" && mkdir -p "$work" && cd "$work"
# Each scenario its own core ledger (experiments/cluster/cores.h): ctest runs two at
# once, and their sweeps must not divide this machine's cores between them.
export BIGBATCH_CORE_LEDGER=$work/.cores
# The slow-math warning (experiments/sweep/machine.h) times one matrix
# product while ctest runs another test beside this one: a loaded CPU can
# time under the threshold and add a line the one-line checks do not expect
# (CLI.bad_configs did so once). Off here; env_precision tests it, forced
# and as measured.
export BIGBATCH_SLOW_MATH_BELOW=0
config=$src/tests/experiments/e2e_sweep.json
py=/usr/bin/python3
fail() { echo "FAIL: $*" >&2; exit 1; }
# A port nobody listens on, the kernel's choice (tests/free_port.h says why not one made from the pid).
free_port() { $py -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# expect_error EXIT_CODE MESSAGE_PART COMMAND...: the exit code and one line naming the problem.
expect_error() {
  local want=$1 part=$2 rc=0
  shift 2
  "$@" > out.txt 2> err.txt || rc=$?
  [ "$rc" -eq "$want" ] || fail "$* exited $rc, want $want: $(cat err.txt)"
  grep -qF -- "$part" err.txt || fail "$* said '$(cat err.txt)', want it to contain '$part'"
  [ "$(wc -l < err.txt)" -eq 1 ] || fail "$* printed more than one line: $(cat err.txt)"
  echo "ok: exit $rc: $(cat err.txt)"
}

# grows FILE: waits (polling, up to 60 s) until FILE is larger than it is
# now (absent counts as empty): a running trial has written past this point.
grows() {
  local size
  size=$(stat -c %s "$1" 2>/dev/null || echo 0)
  for _ in $(seq 3000); do
    [ "$(stat -c %s "$1" 2>/dev/null || echo 0)" -gt "$size" ] && return 0
    sleep 0.02
  done
}

# derive OUT 'python statements on c' [BASE]: a config derived from BASE
# (default: the e2e one).
derive() {
  $py - "${3:-$config}" "$1" "$2" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(c, open(sys.argv[2], "w"))
PY
}

case $scenario in
sweep)
  "$bigbatch" sweep "$config" --out runs --jobs 2 > sweep.txt
  cat sweep.txt
  # The known outcome: every batch size reaches the target, the steps to reach
  # it never grow with the batch (perfect scaling, then the plateau), the
  # examples never shrink, and each row is its batch's best rate by the median
  # over seeds (not reached: +inf), re-derived here from the summaries.
  $py - runs/e2e "$(cat "$config")" <<'PY'
import csv, json, os, sys
d, config = sys.argv[1], json.loads(sys.argv[2])
rows = list(csv.DictReader(open(os.path.join(d, "steps_to_target.csv"))))
assert [int(r["batch_size"]) for r in rows] == [8, 32, 128, 512, 2048], rows
assert all(r["reached"] == "1" for r in rows), rows
steps = [float(r["steps"]) for r in rows]
examples = [float(r["examples"]) for r in rows]
assert all(a >= b for a, b in zip(steps, steps[1:])), steps
assert all(a <= b for a, b in zip(examples, examples[1:])), examples
assert steps[0] > steps[-1], steps
def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
for r in rows:
    b = int(r["batch_size"])
    rates = {}  # point -> seed -> steps
    for t in os.listdir(d):
        s = os.path.join(d, t, "summary.json")
        if os.path.exists(s):
            j = json.load(open(s))
            if j["batch_size"] != b:
                continue
            p = int(t.split("_")[1][1:])
            reached = j["status"] == "reached"
            rates.setdefault(p, {})[j["seed"]] = j["steps_to_target"] if reached else float("inf")
            if reached:
                assert j["examples_to_target"] == j["steps_to_target"] * b
            assert j["code_version"] and j["libtorch_version"]
    assert all(len(v) == len(config["seeds"]) for v in rates.values()), rates
    best = min((median(list(v.values())), p) for p, v in rates.items())
    assert float(r["steps"]) == best[0], (r, rates)
    seeds = [rates[best[1]][s] for s in config["seeds"]]
    assert [float(x) for x in r["seed_steps"].split()] == seeds, (r, seeds)
    assert float(r["steps_min"]) == min(seeds) and float(r["steps_max"]) == max(seeds), r
    assert float(r["steps_low"]) <= best[0] <= float(r["steps_high"]), r
fit = json.load(open(os.path.join(d, "fit.json")))
assert fit["s_min"] > 0 and fit["b_crit"] > 0, fit
assert len(os.listdir(d)) == 2 * 5 * 4 + 5, os.listdir(d)  # trials + sweep.json + 2 tables + events + claims
assert sorted(os.listdir(os.path.join(d, "claims"))) == sorted(f"{t}.{n}" for t in os.listdir(d) if t.startswith("b")
                                                               for n in ("1", "2", "finished")), \
    "a run slot, a done slot and the announcement of its result per trial"

print("table ok:", steps, "B_crit", fit["b_crit"])
PY
  "$bigbatch" report runs/e2e | tee report.txt
  grep -q "^2048" report.txt || fail "report lacks the 2048 row"
  ;;
plot)
  "$bigbatch" sweep "$config" --out runs --jobs 2 > /dev/null
  "$bigbatch" plot runs/e2e
  $py - runs/e2e <<'PY'
import csv, json, os, sys
d = sys.argv[1]
p = os.path.join(d, "plots")
for name in ("validation", "steps_to_target", "best_lr", "schedules", "noise_scale"):
    for ext in ("png", "svg", "json"):
        f = os.path.join(p, f"{name}.{ext}")
        assert os.path.getsize(f) > 100, f
rows = list(csv.DictReader(open(os.path.join(d, "steps_to_target.csv"))))
pts = json.load(open(os.path.join(p, "steps_to_target.json")))
assert pts["batch_sizes"] == [int(r["batch_size"]) for r in rows if r["reached"] == "1"]
assert pts["steps"] == [float(r["steps"]) for r in rows if r["reached"] == "1"]
assert pts["fit"] == json.load(open(os.path.join(d, "fit.json")))
lr = json.load(open(os.path.join(p, "best_lr.json")))
assert lr["best_lr"] == [float(r["best_lr"]) for r in rows if r["reached"] == "1"]
val = json.load(open(os.path.join(p, "validation.json")))
for r in rows:
    m = list(csv.DictReader(open(os.path.join(d, r["trial"], "metrics.csv"))))
    assert val[r["batch_size"]]["step"] == [int(x["step"]) for x in m]
    assert val[r["batch_size"]]["val_error"] == [float(x["val_error"]) for x in m]
gns = json.load(open(os.path.join(p, "noise_scale.json")))
assert len(gns) == len(rows), gns.keys()
print("plots ok")
PY
  # A config with variants: each variant's plots, and the comparison figures
  # at the top, whose points are the variants' tables; one variant averages
  # its weights, whose curves are drawn dashed beside its own.
  derive variants.json 'c["name"] = "vs"; c["batch_sizes"] = [8, 128, 2048]; c["seeds"] = [0]; c["variants"] = {"sqrt": {}, "linear": {"schedule": {"scaling": "linear"}, "average": {"type": "ema", "decay": 0.9}}}'
  "$bigbatch" sweep variants.json --out runs --jobs 2 > /dev/null
  "$bigbatch" plot runs/vs > plot.txt
  $py - runs/vs <<'PY'
import csv, json, os, sys
d = sys.argv[1]
p = os.path.join(d, "plots")
for name in ("compare_steps_to_target", "compare_examples_to_target", "compare_best_lr", "compare_validation"):
    for ext in ("png", "svg", "json"):
        assert os.path.getsize(os.path.join(p, f"{name}.{ext}")) > 100, (name, ext)
steps = json.load(open(os.path.join(p, "compare_steps_to_target.json")))
examples = json.load(open(os.path.join(p, "compare_examples_to_target.json")))
curves = json.load(open(os.path.join(p, "compare_validation.json")))
assert sorted(steps) == ["linear", "sqrt"], steps.keys()
for variant in ("linear", "sqrt"):
    rows = list(csv.DictReader(open(os.path.join(d, variant, "steps_to_target.csv"))))
    done = [r for r in rows if r["reached"] == "1"]
    assert steps[variant]["batch_sizes"] == [int(r["batch_size"]) for r in done], (variant, steps[variant])
    assert steps[variant]["steps"] == [float(r["steps"]) for r in done], (variant, steps[variant])
    assert examples[variant]["examples"] == [float(r["examples"]) for r in done], variant
    for r in rows:
        m = list(csv.DictReader(open(os.path.join(d, variant, r["trial"], "metrics.csv"))))
        c = curves[r["batch_size"]][variant]
        assert c["trial"] == r["trial"] and c["examples"] == [int(x["examples"]) for x in m], (variant, r)
        if variant == "linear":  # its averaged weights' curve, every evaluation's
            assert c["avg_val_error"] == [float(x["avg_val_error"]) for x in m], (variant, r)
            assert c["avg_val_error"] != c["val_error"], r
        else:
            assert "avg_val_error" not in c and all(x["avg_val_error"] == "" for x in m), r
print("comparison ok")
PY
  # A sweep with horizons: its frontier figure's points are horizons.csv's.
  derive horizons.json 'c["name"] = "hz"; c["batch_sizes"] = [32, 128]; c["seeds"] = [0, 1]; c["search"] = {"lr": [0.03]}; c["schedule"] = {"base_batch": 8, "scaling": "sqrt", "decay": {"type": "cosine", "length": 300}}; c["budget"] = {"steps": 300}; c["horizons"] = [100, 200]'
  "$bigbatch" sweep horizons.json --out runs --jobs 2 > /dev/null
  "$bigbatch" plot runs/hz > plot.txt
  grep -q "horizons" plot.txt || fail "no horizons figure: $(cat plot.txt)"
  $py - runs/hz <<'PY'
import csv, json, os, sys
d = sys.argv[1]
rows = list(csv.DictReader(open(os.path.join(d, "horizons.csv"))))
pts = json.load(open(os.path.join(d, "plots", "horizons.json")))
assert len(rows) == 6, rows
for r in rows:
    p = pts[r["batch_size"]]["sweep"]
    k = p["horizon"].index(float(r["horizon"]))
    assert p["examples"][k] == int(r["examples"]) and p["final"][k] == float(r["final"]), (r, p)
print("horizons plot ok")
PY
  # Two folders on one figure, a side-by-side table, and a folder with another
  # target refused before anything is drawn.
  "$bigbatch" plot runs/vs/sqrt runs/e2e --labels a,b --out cmp > /dev/null
  [ -s cmp/compare_steps_to_target.json ] || fail "no comparison of two folders"
  $py -c "import json; assert sorted(json.load(open('cmp/compare_steps_to_target.json'))) == ['a', 'b']"
  "$bigbatch" report runs/vs --format markdown | tee report.md
  grep -qF "| batch size | linear | sqrt | sqrt / linear |" report.md || fail "markdown header"
  [ "$(grep -c '^| [0-9]' report.md)" -eq 3 ] || fail "markdown rows"
  derive loss.json 'c["name"] = "loss"; c["target"]["metric"] = "val_loss"; c["target"]["threshold"] = 1.3; c["batch_sizes"] = [128]; c["seeds"] = [0]'
  "$bigbatch" sweep loss.json --out runs > /dev/null
  expect_error 2 "only sweeps with the same target compare" "$bigbatch" plot runs/e2e runs/loss --out refused
  [ ! -e refused ] || fail "a refused comparison wrote figures"
  expect_error 2 "--out: needed" "$bigbatch" plot runs/e2e runs/vs
  ;;
cbs)
  cfg=$src/tests/experiments/e2e_cbs.json
  "$bigbatch" cbs "$cfg" --out reference --compare --jobs 2 > ref.txt 2> ref.err || fail "cbs failed: $(tail -3 ref.err)"
  cat ref.txt
  d=reference/e2e_cbs
  for f in cbs.json cbs.csv schedule.json compare.csv plots/cbs_curve.png plots/cbs_branches.svg plots/cbs_compare.json; do
    [ -s $d/$f ] || fail "no $f"
  done
  grep -q "batch-size warmup (schedule.json)" ref.txt || fail "no warmup in the report"
  grep -q "warmup" ref.txt || fail "no comparison in the report"
  # cbs.csv against its branches: each loss is the branches' mean over the
  # seeds, the critical batch follows the rule, schedule.json doubles by it.
  $py - $d <<'PY'
import csv, json, os, sys
d = sys.argv[1]
cfg = json.load(open(os.path.join(d, "cbs.json")))["cbs"]
rows = list(csv.DictReader(open(os.path.join(d, "cbs.csv"))))
assert [int(r["examples"]) for r in rows] == cfg["checkpoints"], rows
batches, tol = cfg["branch_batches"], cfg["tolerance"]["absolute"]
crit = []
for r in rows:
    losses = []
    for b in batches:
        ls = [json.load(open(os.path.join(d, "branches", f"e{r['examples']}_b{b}_f0_s{s}", "result.json")))["val_loss"]
              for s in (0, 1)]
        losses.append(sum(ls) / 2)
        assert abs(float(r[f"loss_b{b}"]) - losses[-1]) < 1e-9 * losses[-1], (r, b)
    k = max(i for i in range(len(losses)) if all(losses[i] <= losses[j] + tol for j in range(i)))
    assert int(r["critical_batch"]) == batches[k], (r, losses)
    crit.append(batches[k])
patch = json.load(open(os.path.join(d, "schedule.json")))
batch, stages = cfg["reference_batch"], []
for r, c in zip(rows, crit):
    grown = batch
    while c >= 2 * grown:
        grown *= 2
    if grown != batch:
        if int(r["examples"]) > 0:
            stages.append({"batch": batch, "until_examples": int(r["examples"])})
        batch = grown
assert patch["batch_sizes"] == [batch], patch
assert patch["schedule"].get("batch_warmup", []) == stages, (patch, stages)
runs = list(csv.DictReader(open(os.path.join(d, "compare.csv"))))
assert sorted({r["run"] for r in runs}) == ["large", "small", "warmup"], runs
print("cbs.csv, schedule.json and compare.csv agree with the branches")
PY
  # A real kill in the middle, then a rerun: the same files.
  "$bigbatch" cbs "$cfg" --out runs --compare --jobs 2 --no-plots > /dev/null 2>&1 &
  pid=$!
  for _ in $(seq 300); do [ -n "$(ls runs/e2e_cbs/branches 2>/dev/null | head -1)" ] && break; sleep 0.02; done
  kill -9 $pid 2>/dev/null || fail "cbs ended before it was killed"
  wait $pid || true
  echo "killed after $(ls runs/e2e_cbs/branches 2>/dev/null | wc -l) branches"
  "$bigbatch" cbs "$cfg" --out runs --compare --jobs 2 > resumed.txt 2> resumed.err
  for f in cbs.csv schedule.json compare.csv; do cmp $d/$f runs/e2e_cbs/$f || fail "resumed $f differs"; done
  # ... and at the worst moments, staged: a reference's last checkpoint
  # without its record (it resumes from the one before), a branch without
  # its result, one with a result cut short.
  rm runs/e2e_cbs/reference_s1/checkpoints/e16384.json runs/e2e_cbs/cbs.csv
  rm runs/e2e_cbs/branches/e64_b16_f0_s0/result.json
  head -c 30 runs/e2e_cbs/branches/e1024_b8_f0_s1/result.json > cut && mv cut runs/e2e_cbs/branches/e1024_b8_f0_s1/result.json
  "$bigbatch" cbs "$cfg" --out runs --compare --jobs 1 --no-plots > again.txt 2> again.err
  grep -q "reference_s1: resuming from its checkpoint at 4096 examples" again.err || fail "not resumed: $(cat again.err)"
  grep -q "68 of 70 branches already finished" again.err || fail "expected 2 branches redone: $(cat again.err)"
  grep -q "warning: runs/e2e_cbs/branches/e1024_b8_f0_s1/result.json: not readable" again.err || fail "no warning"
  for f in cbs.csv schedule.json compare.csv; do cmp $d/$f runs/e2e_cbs/$f || fail "$f differs after the redo"; done
  # schedule.json is a merge patch of the workload: `bigbatch train` runs it,
  # at the batch sizes of its stages, then the last.
  $py - "$cfg" $d/schedule.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
del c["cbs"]
c["name"] = "warm"
c["schedule"] = {}
patch = json.load(open(sys.argv[2]))
for k, v in patch.items():
    c[k] = v
json.dump(c, open("warm.json", "w"))
PY
  "$bigbatch" train warm.json --out trained > /dev/null 2>&1 || fail "train refused schedule.json"
  $py - $d/schedule.json trained/warm.train/*/metrics.csv <<'PY'
import csv, json, sys
patch = json.load(open(sys.argv[1]))
rows = list(csv.DictReader(open(sys.argv[2])))
stages = patch["schedule"].get("batch_warmup", [])
for r in rows:
    e = int(r["examples"])
    # the batch of the step that ended at this evaluation
    want = next((s["batch"] for s in stages if e - int(r["batch_size"]) < s["until_examples"]), patch["batch_sizes"][0])
    assert int(r["batch_size"]) == want, (r, want)
print("train followed schedule.json over", len(rows), "evaluations")
PY
  # TensorBoard, read by the real package: the curve by examples seen, as
  # cbs.csv has it, and each reference's checkpoints, as their records have
  # them (the resumed run's file included: each step once).
  [ -d "$src/.pydeps/tensorboard" ] || fail "no tensorboard package in $src/.pydeps: run scripts/setup.sh"
  PYTHONPATH="$src/.pydeps" $py - $d runs/e2e_cbs <<'PY'
import csv, json, os, sys
from tensorboard.backend.event_processing import event_accumulator
def scalars(folder):
    acc = event_accumulator.EventAccumulator(folder, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
for d in sys.argv[1:]:
    rows = list(csv.DictReader(open(os.path.join(d, "cbs.csv"))))
    s = scalars(d)
    assert s["cbs/critical_batch"] == [(int(r["examples"]), float(r["critical_batch"])) for r in rows], s
    for b in (4, 256):
        got = s[f"branch_loss/b{b}"]
        assert [g[0] for g in got] == [int(r["examples"]) for r in rows]
        assert all(abs(g[1] - float(r[f"loss_b{b}"])) <= 1e-6 * abs(g[1]) for g, r in zip(got, rows)), got
    for seed in (0, 1):
        ref = os.path.join(d, f"reference_s{seed}")
        r = scalars(ref)
        points = sorted(json.load(open(os.path.join(ref, "checkpoints", f)))["step"]
                        for f in os.listdir(os.path.join(ref, "checkpoints")) if f.endswith(".json"))
        assert [step for step, _ in r["val/loss"]] == points, (r["val/loss"], points)
print("TensorBoard files agree with cbs.csv and the checkpoints")
PY
  "$bigbatch" report $d | grep -q "critical batch size of e2e_cbs" || fail "report of a cbs folder"
  rm -r $d/plots && "$bigbatch" plot $d > /dev/null && [ -s $d/plots/cbs_curve.svg ] || fail "plot of a cbs folder"
  # Bad configs: exit 2 and one line naming the key, before any work.
  $py - "$cfg" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["cbs"]["window"] = 1000
json.dump(c, open("bad_window.json", "w"))
c = json.load(open(sys.argv[1]))
c["cbs"]["tolerence"] = {"absolute": 0.1}
json.dump(c, open("bad_key.json", "w"))
c = json.load(open(sys.argv[1]))
c["cbs"]["reference_lr"] = 0.02
json.dump(c, open("other.json", "w"))
c = json.load(open(sys.argv[1]))
c.setdefault("schedule", {})["scaling"] = "sde"
json.dump(c, open("bad_sde.json", "w"))
PY
  expect_error 2 "cbs.window: must be a multiple of every branch batch" "$bigbatch" cbs bad_window.json --out bad
  expect_error 2 "cbs.tolerence: unknown key" "$bigbatch" cbs bad_key.json --out bad
  expect_error 2 "schedule: a cbs config's branches scale the rate only" "$bigbatch" cbs bad_sde.json --out bad
  [ ! -e bad ] || fail "a refused config wrote a folder"
  expect_error 2 "holds a different cbs config \"e2e_cbs\" (first difference at /cbs/reference_lr)" \
    "$bigbatch" cbs other.json --out reference
  cmp $d/cbs.csv runs/e2e_cbs/cbs.csv || fail "a refused config changed the folder"
  echo "cbs ok"
  ;;
resume)
  "$bigbatch" sweep "$config" --out reference --jobs 1 > /dev/null
  # A real kill in the middle of a sweep ...
  timeout -s KILL 1.2 "$bigbatch" sweep "$config" --out runs --jobs 1 > /dev/null 2>&1 || true
  # (none may have finished on a loaded machine: ls then fails, which must not end the script)
  finished=$( (ls runs/e2e/*/summary.json 2>/dev/null || true) | wc -l)
  echo "killed after $finished of 40 trials"
  "$bigbatch" sweep "$config" --out runs --jobs 1 > resumed.txt 2> resumed.err
  cmp reference/e2e/steps_to_target.csv runs/e2e/steps_to_target.csv || fail "resumed table differs"
  # ... and a kill at the worst moments, staged: a trial without its summary,
  # one with a half-written metrics.csv, a stray temporary file, no tables.
  rm runs/e2e/b32_p1_s0/summary.json runs/e2e/steps_to_target.csv runs/e2e/fit.json
  head -c 40 runs/e2e/b128_p0_s0/metrics.csv > runs/e2e/b128_p0_s0/metrics.csv.tmp.999
  rm runs/e2e/b128_p0_s0/summary.json
  # and a summary.json cut short (a disk that filled up): redone, with one warning.
  head -c 30 runs/e2e/b512_p1_s1/summary.json > cut && mv cut runs/e2e/b512_p1_s1/summary.json
  "$bigbatch" sweep "$config" --out runs --jobs 1 > again.txt 2> again.err
  grep -q "37 of 40 trials already finished" again.err || fail "expected 3 trials redone: $(cat again.err)"
  [ "$(grep -c "warning: runs/e2e/b512_p1_s1/summary.json: not readable JSON; redoing b512_p1_s1" again.err)" -eq 1 ] \
    || fail "expected one warning for the cut summary: $(cat again.err)"
  cmp reference/e2e/steps_to_target.csv runs/e2e/steps_to_target.csv || fail "table differs after redo"
  # The same rows, but for wall_time (column 9); a trial pruned at another
  # point (its batch size's bound was known sooner) has the same rows, cut.
  for t in b32_p1_s0 b128_p0_s0 b512_p1_s1; do
    cut -d, -f1-8,10 reference/e2e/$t/metrics.csv > a.csv
    cut -d, -f1-8,10 runs/e2e/$t/metrics.csv > b.csv
    n=$(( $(wc -l < a.csv) < $(wc -l < b.csv) ? $(wc -l < a.csv) : $(wc -l < b.csv) ))
    cmp <(head -n "$n" a.csv) <(head -n "$n" b.csv) || fail "$t metrics differ"
    if ! grep -q '"status": "pruned"' reference/e2e/$t/summary.json runs/e2e/$t/summary.json; then
      cmp a.csv b.csv || fail "$t metrics differ"
    fi
  done
  [ -z "$(find runs -name '*.tmp.*' -newer again.txt)" ] || fail "a temporary file was left by the rerun"
  [ "$(sort runs/e2e/steps_to_target.csv | uniq -d | wc -l)" -eq 0 ] || fail "duplicated rows"
  # Inside a trial: killed after a checkpoint, the rerun continues from it and
  # ends with the metrics of an uninterrupted run.
  derive long.json 'c["budget"] = {"steps": 20000}; c["checkpoint_every"] = 2000; c["batch_sizes"] = [64]
c["target"] = {"metric": "val_loss", "threshold": 1e-9, "eval_every": 100}'
  trial=e2e.train/b64_p0_s0  # the folder of its one trial under --out
  "$bigbatch" train long.json --out reference > /dev/null 2>&1
  [ ! -e reference/$trial/checkpoint.pt ] || fail "a finished trial kept its checkpoint"
  "$bigbatch" train long.json --out runs > /dev/null 2>&1 &
  pid=$!
  for _ in $(seq 600); do [ -e runs/$trial/checkpoint.pt ] && break; sleep 0.1; done
  kill -9 $pid 2>/dev/null || fail "the trial ended before it was killed"
  wait $pid || true
  [ -e runs/$trial/checkpoint.pt ] || fail "no checkpoint to resume from"
  "$bigbatch" train long.json --out runs > long.txt 2> long.err
  grep -q "resuming b64_p0_s0 from its checkpoint at step [1-9]" long.err || fail "not resumed: $(head -3 long.err)"
  cmp <(cut -d, -f1-8,10 reference/$trial/metrics.csv) <(cut -d, -f1-8,10 runs/$trial/metrics.csv) \
    || fail "the resumed trial's metrics differ"
  [ ! -e runs/$trial/checkpoint.pt ] || fail "the finished trial kept its checkpoint"
  echo "resume ok"
  ;;
jobs)
  # The table does not depend on --jobs: each trial has runner.threads_per_trial
  # threads whatever it is. A small Fashion-MNIST sweep with 3 seeds, one job
  # and two: byte-identical tables and fits.
  derive fm.json 'c["dataset"] = {"name": "fashion_mnist"}; c["model"] = {"type": "mlp", "widths": [32]}
c["schedule"] = {"base_batch": 32, "scaling": "sqrt"}; c["gns"] = {"micro_batches": 0}; c["tensorboard"] = False
c["target"] = {"metric": "val_error", "threshold": 0.3, "eval_every": 10}; c["budget"] = {"steps": 150}
c["batch_sizes"] = [32, 128, 512]; c["search"] = {"lr": [0.01, 0.03]}; c["seeds"] = [0, 1, 2]'
  "$bigbatch" sweep fm.json --out j1 --jobs 1 > j1.txt 2> j1.err || fail "sweep failed: $(tail -3 j1.err)"
  "$bigbatch" sweep fm.json --out j2 --jobs 2 > j2.txt 2> j2.err || fail "sweep failed: $(tail -3 j2.err)"
  cmp j1/e2e/steps_to_target.csv j2/e2e/steps_to_target.csv || fail "the table depends on --jobs"
  cmp j1/e2e/fit.json j2/e2e/fit.json || fail "the fit depends on --jobs"
  cat j2.txt
  $py -c "
import csv
rows = list(csv.DictReader(open('j1/e2e/steps_to_target.csv')))
assert [r['seeds'] for r in rows] == ['3'] * 3, rows
assert sum(r['reached'] == '1' for r in rows) >= 2, rows
print('jobs: same table', [(r['batch_size'], r['steps'], r['steps_low'], r['steps_high']) for r in rows])"
  # More threads than fit: --jobs is lowered, with a note; the thread count is
  # part of the sweep's identity, so a folder is not resumed at another.
  derive fm2.json 'c["runner"] = {"threads_per_trial": 2}' fm.json
  "$bigbatch" sweep fm2.json --out t2 --jobs 2 > t2.txt 2> t2.err || fail "sweep failed: $(tail -3 t2.err)"
  [ "$(nproc)" -gt 2 ] || grep -q "would oversubscribe this machine's cores: running 1 at a time" t2.err \
    || fail "no note of the lowered --jobs: $(cat t2.err)"
  expect_error 2 "first difference at /runner" "$bigbatch" sweep fm2.json --out j1
  # Two sweeps compared: each ratio with its interval over both sweeps' seeds.
  derive slow.json 'c["search"] = {"lr": [0.003, 0.005]}' fm.json
  "$bigbatch" sweep slow.json --out slow --jobs 2 > /dev/null 2>&1 || fail "the slow sweep failed"
  "$bigbatch" report j1/e2e slow/e2e --labels fast,slow | tee cmp.txt
  grep -q "bootstrap interval over both sweeps' seeds" cmp.txt || fail "no interval legend: $(cat cmp.txt)"
  "$bigbatch" report j1/e2e slow/e2e --labels fast,slow --format csv > cmp.csv
  $py - cmp.csv j1/e2e slow/e2e <<'PY'
import csv, os, random, sys
rows = list(csv.DictReader(open(sys.argv[1])))
a = {r["batch_size"]: r for r in csv.DictReader(open(os.path.join(sys.argv[2], "steps_to_target.csv")))}
b = {r["batch_size"]: r for r in csv.DictReader(open(os.path.join(sys.argv[3], "steps_to_target.csv")))}
def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
checked = 0
for r in rows:
    k = r["batch size"]
    if not r["slow / fast"]:
        continue
    ratio, low, high = float(r["slow / fast"]), float(r["slow / fast low"]), float(r["slow / fast high"])
    sa = [float(x) for x in a[k]["seed_steps"].split()]
    sb = [float(x) for x in b[k]["seed_steps"].split()]
    assert abs(ratio - median(sb) / median(sa)) < 0.006, (r, sa, sb)
    # Every resampled ratio lies between these bounds (a re-derivation of the
    # interval's reach, not of its draws).
    lo = median(sorted(sb)[:1] * 3) / median(sorted(sa)[-1:] * 3)
    hi = median(sorted(sb)[-1:] * 3) / median(sorted(sa)[:1] * 3)
    assert lo - 0.006 <= low <= ratio + 0.006 and ratio - 0.006 <= high <= hi + 0.006, (r, lo, hi)
    assert r["slow / fast differs"] == ("1" if low > 1 or high < 1 else "0"), r
    checked += 1
assert checked >= 1, rows
print("ratios ok:", checked)
PY
  ;;
prune)
  # Pruning is exact and the table does not depend on --jobs: the table, the
  # fit and the best trials' curves are the same with pruning on and off, at
  # one job or two (each trial has runner.threads_per_trial threads either
  # way); every trial it stopped could not have made its rate the row.
  "$bigbatch" sweep "$config" --out on --jobs 2 > on.txt 2> on.err
  "$bigbatch" sweep "$config" --out on1 --jobs 1 > /dev/null 2>&1
  "$bigbatch" sweep "$config" --out off --jobs 2 --no-prune > off.txt 2> off.err
  "$bigbatch" sweep "$config" --out off1 --jobs 1 --no-prune > /dev/null 2>&1
  grep -q ", 0 pruned," off.txt || fail "--no-prune pruned: $(tail -1 off.txt)"
  for d in on on1 off1; do
    cmp off/e2e/steps_to_target.csv $d/e2e/steps_to_target.csv || fail "$d: the table differs"
    cmp off/e2e/fit.json $d/e2e/fit.json || fail "$d: the fit differs"
  done
  for d in on on1; do
  $py - $d/e2e off/e2e <<'PY'
import csv, json, os, sys
on, off = sys.argv[1], sys.argv[2]
def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
def strip(path):  # metrics.csv without wall_time
    return [{k: v for k, v in r.items() if k != "wall_time"} for r in csv.DictReader(open(path))]
table = {int(r["batch_size"]): r for r in csv.DictReader(open(os.path.join(on, "steps_to_target.csv")))}
# The unpruned run's rates: (batch, point) -> steps of its seeds (+inf: not reached).
rates = {}
for t in os.listdir(off):
    s = os.path.join(off, t, "summary.json")
    if os.path.exists(s):
        j = json.load(open(s))
        key = (j["batch_size"], int(t.split("_")[1][1:]))
        rates.setdefault(key, []).append(j["steps_to_target"] if j["status"] == "reached" else float("inf"))
pruned = 0
for t in sorted(os.listdir(on)):
    s = os.path.join(on, t, "summary.json")
    if not os.path.exists(s):
        continue
    a, b = json.load(open(s)), json.load(open(os.path.join(off, t, "summary.json")))
    row = table[a["batch_size"]]
    row_point = int(row["trial"].split("_")[1][1:])
    point = int(t.split("_")[1][1:])
    if point == row_point:  # the row's rate: every seed ran to its end, as unpruned
        assert a["status"] != "pruned", t
        assert strip(os.path.join(on, t, "metrics.csv")) == strip(os.path.join(off, t, "metrics.csv")), t
    if a["status"] != "pruned":
        assert a["status"] == b["status"] and a["steps_to_target"] == b["steps_to_target"], (t, a, b)
        continue
    pruned += 1
    # Unpruned, its rate's median does not beat the row's (a tie goes to the earlier rate).
    mine = (median(rates[(a["batch_size"], point)]), point)
    assert mine > (float(row["steps"]), row_point), (t, mine, row)
    # Its evaluations are the unpruned run's, cut short.
    rows_a, rows_b = strip(os.path.join(on, t, "metrics.csv")), strip(os.path.join(off, t, "metrics.csv"))
    assert rows_a == rows_b[:len(rows_a)], t
assert pruned >= 10, pruned
print(on, "exact:", pruned, "of 40 trials pruned, table and fit unchanged")
PY
  done
  grep -q ", [1-9][0-9]* pruned," on.txt || fail "nothing pruned: $(tail -1 on.txt)"
  # The best trials' plots are the same.
  "$bigbatch" plot on/e2e > /dev/null
  "$bigbatch" plot off/e2e > /dev/null
  for f in validation steps_to_target best_lr; do
    cmp on/e2e/plots/$f.json off/e2e/plots/$f.json || fail "the $f plot's points differ"
  done
  # A pruned trial is finished; with pruning off, a rerun completes it.
  n=$(grep -l '"status": "pruned"' on/e2e/*/summary.json | wc -l)
  "$bigbatch" sweep "$config" --out on --jobs 2 > again.txt 2> again.err
  grep -q "40 of 40 trials already finished" again.err || fail "pruned trials were rerun: $(cat again.err)"
  "$bigbatch" sweep "$config" --out on --jobs 2 --no-prune > full.txt 2> full.err
  grep -q "$((40 - n)) of 40 trials already finished" full.err || fail "want $n trials completed: $(cat full.err)"
  [ -z "$(grep -l '"status": "pruned"' on/e2e/*/summary.json)" ] || fail "pruned trials left after --no-prune"
  cmp off/e2e/steps_to_target.csv on/e2e/steps_to_target.csv || fail "the completed sweep's table differs"
  # The search's edges: with rates 0.003 and 0.01 only, the best rate is on an
  # edge somewhere; --extend-search adds one grid step (x 0.01 / 0.003) beyond
  # it for those batch sizes only, keeps the finished trials, and resumes.
  derive edge.json 'c["search"] = {"lr": [0.003, 0.01]}; c["seeds"] = [0]'
  "$bigbatch" sweep edge.json --out edge > edge.txt 2> edge.err
  [ "$(grep -c "warning: the best rate is on the edge of the search at batch sizes" edge.txt edge.err \
        | awk -F: '{s += $2} END {print s}')" -eq 1 ] || fail "want one edge warning: $(cat edge.txt edge.err)"
  grep -q "high" edge.txt || fail "no row marked in the report: $(cat edge.txt)"
  cp edge/e2e/steps_to_target.csv before.csv
  "$bigbatch" plot edge/e2e > /dev/null
  $py - edge/e2e <<'PY'
import csv, json, os, sys
rows = [r for r in csv.DictReader(open(os.path.join(sys.argv[1], "steps_to_target.csv"))) if r["reached"] == "1"]
assert json.load(open(os.path.join(sys.argv[1], "plots", "best_lr.json")))["edge"] == [r["edge"] for r in rows]
PY
  "$bigbatch" sweep edge.json --out edge --extend-search > extend.txt 2> extend.err
  grep -q "10 of 10 trials already finished" extend.err || fail "finished trials redone: $(cat extend.err)"
  $py - edge/e2e before.csv <<'PY'
import csv, json, os, sys
d = sys.argv[1]
before = list(csv.DictReader(open(sys.argv[2])))
points = json.load(open(os.path.join(d, "extensions.json")))["points"]
step = 0.01 / 0.003
first = {}
for p in points:
    first.setdefault(p["batch_size"], p)
for r in before:
    b = int(r["batch_size"])
    lr = {"b%d_p0_s0" % b: 0.003, "b%d_p1_s0" % b: 0.01}[r["trial"]]
    if r["edge"]:
        want = 0.003 / step if r["edge"] == "low" else 0.01 * step
        assert abs(first[b]["lr"] - want) < 1e-12 * want, (b, first[b], want)
        assert os.path.exists(os.path.join(d, "b%d_x0_s0" % b, "summary.json")), b
    else:
        assert b not in first, (b, first)
print("extended:", [(p["batch_size"], round(p["lr"], 5)) for p in points])
PY
  # Batched trials (--batch-trials): every trial's folder as an unbatched
  # trial's, each row's steps within fp32 rounding's reach of the unbatched
  # table's (a borderline evaluation may flip), pruning exact within a group.
  "$bigbatch" sweep "$config" --out batched --jobs 2 --batch-trials > batched.txt 2> batched.err
  $py - batched/e2e off/e2e <<'PY'
import csv, json, os, sys
b, u = sys.argv[1], sys.argv[2]
tb = {r["batch_size"]: r for r in csv.DictReader(open(os.path.join(b, "steps_to_target.csv")))}
tu = {r["batch_size"]: r for r in csv.DictReader(open(os.path.join(u, "steps_to_target.csv")))}
assert tb.keys() == tu.keys()
for k in tb:
    assert tb[k]["reached"] == tu[k]["reached"] == "1", (k, tb[k], tu[k])
    sb, su = float(tb[k]["steps"]), float(tu[k]["steps"])
    assert abs(sb - su) <= max(10, 0.2 * su), (k, sb, su)
names = sorted(t for t in os.listdir(u) if t.startswith("b"))
assert sorted(t for t in os.listdir(b) if t.startswith("b")) == names
for t in names:
    files = sorted(os.listdir(os.path.join(b, t)))
    assert files == ["config.json", "events.out.tfevents.bigbatch", "metrics.csv", "summary.json"], (t, files)
    assert json.load(open(os.path.join(b, t, "config.json"))) == json.load(open(os.path.join(u, t, "config.json"))), t
print("batched ok:", {k: (tb[k]["steps"], tu[k]["steps"]) for k in tb})
PY
  m=$(ls -d edge/e2e/b*_s0 | wc -l)
  "$bigbatch" sweep edge.json --out edge > resumed.txt 2> resumed.err
  grep -q "$m of $m trials already finished" resumed.err || fail "the extension's trials are not kept: $(cat resumed.err)"
  echo "prune ok"
  ;;
tensorboard)
  # Every trial's events read back by the real tensorboard package (installed
  # into .pydeps by scripts/setup.sh) and checked against its metrics.csv.
  [ -d "$src/.pydeps/tensorboard" ] || fail "no tensorboard package in $src/.pydeps: run scripts/setup.sh"
  tb() { PYTHONPATH="$src/.pydeps" $py "$src/tests/experiments/tensorboard_read.py" "$@"; }
  derive lamb.json 'c["optimizer"] = {"name": "lamb"}; c["search"] = {"lr": [0.01, 0.03]}; c["batch_sizes"] = [32, 512]'
  "$bigbatch" sweep lamb.json --out runs --jobs 2 > /dev/null
  tb runs/e2e --trust-ratios
  # Batched trials write the same files, trust ratios included.
  "$bigbatch" sweep lamb.json --out batched --jobs 2 --batch-trials > /dev/null
  tb batched/e2e --trust-ratios
  # Muon: its update RMS for the hidden matrix alone (the MLP's middle layer;
  # the input layer and the head are its AdamW group's), and no trust ratios.
  derive muon.json 'c["optimizer"] = {"name": "muon"}; c["model"]["widths"] = [32, 32]; c["search"] = {"lr": [0.01, 0.03]}
c["batch_sizes"] = [32, 512]'
  "$bigbatch" sweep muon.json --out muon --jobs 2 > /dev/null
  tb muon/e2e --muon-update-rms 3.weight
  # A trial killed after a checkpoint: the resumed run's events hold each step
  # once, as its metrics.csv does.
  derive long.json 'c["budget"] = {"steps": 20000}; c["checkpoint_every"] = 2000; c["batch_sizes"] = [64]
c["target"] = {"metric": "val_loss", "threshold": 1e-9, "eval_every": 100}; c["optimizer"] = {"name": "lars"}'
  "$bigbatch" train long.json --out killed > /dev/null 2>&1 &
  pid=$!
  # Killed once it has written events after its first checkpoint (the event
  # file grew twice after checkpoint.pt appeared: one evaluation may be the
  # checkpoint's own step, the next is past it), so that there are events
  # for the resumed run to drop; polled, not slept for.
  t=killed/e2e.train/b64_p0_s0
  for _ in $(seq 1200); do [ -e $t/checkpoint.pt ] && break; sleep 0.02; done
  grows $t/events.out.tfevents.bigbatch
  grows $t/events.out.tfevents.bigbatch
  kill -9 $pid 2>/dev/null || fail "the trial ended before it was killed"
  [ ! -e $t/summary.json ] || fail "the trial ended before it was killed"
  wait $pid || true
  "$bigbatch" train long.json --out killed > /dev/null 2> long.err
  grep -q "resuming b64_p0_s0 from its checkpoint" long.err || fail "not resumed: $(head -3 long.err)"
  tb killed/e2e.train --trust-ratios --trials-only
  # Off: no event files; turning it back on redoes no finished trial.
  derive off.json 'c["tensorboard"] = False; c["batch_sizes"] = [512]; c["seeds"] = [0]'
  "$bigbatch" sweep off.json --out quiet > /dev/null
  [ -z "$(find quiet -name 'events.out.tfevents*')" ] || fail "event files written with tensorboard off"
  derive on.json 'c["batch_sizes"] = [512]; c["seeds"] = [0]'
  "$bigbatch" sweep on.json --out quiet > /dev/null 2> on.err
  grep -q "4 of 4 trials already finished" on.err || fail "switching tensorboard on redid trials: $(cat on.err)"
  echo "PASS tensorboard"
  ;;
bad_configs)
  mkdir -p folder.json
  expect_error 2 "folder.json: a folder, not a config file" "$bigbatch" sweep folder.json
  touch afile
  expect_error 2 "--out: afile/e2e: cannot make this folder" "$bigbatch" sweep "$config" --out afile
  derive unknown.json 'c["optimizer"]["momentun"] = 0.9'
  expect_error 2 "unknown.json: optimizer.momentun: unknown key" "$bigbatch" sweep unknown.json
  derive type.json 'c["budget"]["steps"] = "many"'
  expect_error 2 "type.json: budget.steps: expected an integer, got string" "$bigbatch" sweep type.json
  derive negative.json 'c["search"]["lr"] = [0.1, -0.01]'
  expect_error 2 "negative.json: search.lr[1]: must be > 0, got -0.01" "$bigbatch" sweep negative.json
  derive large.json 'c["batch_sizes"] = [8, 100000]'
  expect_error 2 "batch_sizes: 100000 is larger than the training set (8192 examples)" "$bigbatch" sweep large.json
  derive fmnist.json 'c["dataset"] = {"name": "fashion_mnist"}'
  BIGBATCH_FASHION_MNIST_DIR=$work/nowhere expect_error 2 "dataset-fashion-mnist" "$bigbatch" sweep fmnist.json
  derive escape.json 'c["name"] = "../outside"'
  expect_error 2 'name: "../outside" is not a valid name' "$bigbatch" sweep escape.json
  derive namenum.json 'c["name"] = {"sweep": 1}; c["variants"] = {"a": {}}'
  expect_error 2 "namenum.json: name: expected a string, got object" "$bigbatch" sweep namenum.json
  derive variant.json 'c["variants"] = {"/abs": {}}'
  expect_error 2 'variants: "/abs" is not a valid name' "$bigbatch" sweep variant.json
  derive schedule.json 'c["schedule"]["decay"] = {"type": "step", "milestones": [30, 20]}'
  expect_error 2 "schedule.decay.milestones: must be strictly increasing" "$bigbatch" sweep schedule.json
  derive workload.json 'c["model"] = {"type": "transformer"}'
  expect_error 2 'workload.json: model.type: unknown "transformer" (registered: gpt, linear, mlp, python, resnet, resnet18, simple_cnn, torchscript)' \
    "$bigbatch" sweep workload.json
  derive script.json 'c["model"] = {"type": "torchscript", "path": "nowhere/net.pt"}'
  expect_error 2 "script.json: model.path: nowhere/net.pt: cannot open (No such file or directory)" \
    "$bigbatch" sweep script.json
  echo "not a module" > garbage.pt
  derive garbage.json 'c["model"] = {"type": "torchscript", "path": "garbage.pt"}'
  expect_error 2 "model.path: garbage.pt: not a TorchScript module (" "$bigbatch" sweep garbage.json
  # The Python executor's flag and records (docs/python.md "Sweeps of any nn.Module"; its
  # trials are tests/python/test_executor.py's): refused before any work, one line each.
  expect_error 2 "--executor: expected two file descriptors R,W" "$bigbatch" sweep "$config" --executor 3
  expect_error 2 "--executor: file descriptor 97 is not open" "$bigbatch" sweep "$config" --executor 97,98
  derive pydata.json 'c["dataset"] = {"name": "python", "train_size": 64, "val_size": 8, "id": "mine"}'
  expect_error 2 'dataset "python": the user'"'"'s own, held by the Python process' "$bigbatch" sweep pydata.json
  derive pydata0.json 'c["dataset"] = {"name": "python", "train_size": 0, "val_size": 8, "id": "mine"}'
  expect_error 2 "dataset.train_size: must be >= 1, got 0" "$bigbatch" sweep pydata0.json
  derive pymodel.json 'c["model"] = {"type": "python", "class": "mine.Net", "digest": "abc"}'
  expect_error 2 'model "python": the user'"'"'s own' "$bigbatch" sweep pymodel.json
  expect_error 2 "--jobs: the trial executor trains one trial at a time, got 2" \
    "$bigbatch" sweep "$config" --jobs 2 --executor 0,1
  # bigbatch data: the splits as a file of tensors (read back by bigbatch.datasets).
  "$bigbatch" data "$config" --save splits.pt || fail "bigbatch data exited $?"
  [ "$(head -c 2 splits.pt)" = "PK" ] || fail "bigbatch data: splits.pt is not a torch zip archive"
  expect_error 2 "model.type" "$bigbatch" data workload.json --save no.pt
  [ ! -e no.pt ] || fail "bigbatch data wrote no.pt for a config it refused"
  derive device.json 'c["device"] = "tpu"'
  expect_error 2 'device.json: device: unknown value "tpu" (one of: cpu, cuda)' "$bigbatch" sweep device.json
  expect_error 2 "" "$bigbatch" train "$config" --backend mpi
  if ! "$bigbatch" train "$config" --steps 1 --device cuda --out cuda > /dev/null 2>&1; then
    # Without a GPU (or a CUDA LibTorch) a CUDA trial is refused with one line, exit 1.
    expect_error 1 'device "cuda": no CUDA device is visible' "$bigbatch" train "$config" --steps 1 --device cuda --out cuda
  fi
  expect_error 2 "missing.json: cannot read: No such file or directory" "$bigbatch" sweep missing.json
  expect_error 2 "" "$bigbatch" sweep "$config" --jobs zero
  expect_error 2 "--jobs: must be >= 1, got 0" "$bigbatch" sweep "$config" --jobs 0 --out jobs0
  expect_error 2 "--jobs: must be >= 1, got 0" "$bigbatch" cbs "$src/tests/experiments/e2e_cbs.json" --jobs 0 --out jobs0
  expect_error 2 "" "$bigbatch" frobnicate
  # A count below 1 is refused before anything runs (--nproc 0 used to train as one process).
  expect_error 2 "--nproc: must be >= 1, got 0" "$bigbatch" train "$config" --nproc 0 --out nproc0
  expect_error 2 "--nproc: must be >= 1, got -2" "$bigbatch" sweep "$config" --nproc=-2 --out nproc0
  expect_error 2 "--nnodes: must be >= 1, got 0" "$bigbatch" cbs "$src/tests/experiments/e2e_cbs.json" --nnodes 0 --out nproc0
  [ ! -e nproc0 ] || fail "a refused count made its folder"
  expect_error 2 "--batch-trials excludes --no-batch-trials" "$bigbatch" sweep "$config" --batch-trials --no-batch-trials --out both
  [ ! -e both ] || fail "a refused command line made its folder"
  # A different config into an existing sweep folder is refused, and leaves it alone.
  derive small.json 'c["batch_sizes"] = [512]; c["seeds"] = [0]'
  # Through another name (as a user's program over cli_main is): the hint names it.
  ln -s "$bigbatch" mine
  ./mine sweep small.json --out runs > small.txt 2>&1
  grep -qx "plots: ./mine plot runs/e2e" small.txt || fail "the plots hint does not name ./mine: $(tail -1 small.txt)"
  before=$(cat runs/e2e/sweep.json runs/e2e/steps_to_target.csv | md5sum)
  derive other.json 'c["batch_sizes"] = [512]; c["seeds"] = [0]; c["target"]["threshold"] = 0.25'
  expect_error 2 "holds a different config for sweep \"e2e\" (first difference at /target/threshold)" \
    "$bigbatch" sweep other.json --out runs
  [ "$before" = "$(cat runs/e2e/sweep.json runs/e2e/steps_to_target.csv | md5sum)" ] || fail "folder changed"
  [ ! -e nowhere ] && [ ! -e ../outside ] || fail "wrote outside the output folder"
  ;;
full_disk)
  # A disk that fills up during a sweep: the write that fails names its file
  # and the system's reason (exit 1, one line), and every file written
  # before stays whole. A tmpfs of 96 KiB where mounting is allowed (root),
  # else a file-size limit (SIGXFSZ ignored, so the write gets EFBIG).
  mkdir disk
  if mount -t tmpfs -o size=96k tmpfs disk 2> /dev/null; then
    trap 'umount "$work/disk"' EXIT
    reason="No space left on device"
  else
    trap '' XFSZ
    ulimit -f 2  # KiB: the first event file outgrows it
    reason="File too large"
  fi
  rc=0
  "$bigbatch" sweep "$config" --out disk > out.txt 2> err.txt || rc=$?
  [ "$rc" -eq 1 ] || fail "a full disk: exit $rc, want 1: $(tail -2 err.txt)"
  last=$(tail -n 1 err.txt)
  case $last in
    "bigbatch: "*disk/e2e*": $reason"* | "bigbatch: "*"$reason"*disk/e2e*) ;;
    *) fail "a full disk: the last line '$last' does not name the file and '$reason'" ;;
  esac
  $py - disk/e2e <<'PY'
import json, os, sys
whole = 0
for root, _, files in os.walk(sys.argv[1]):
    for f in files:
        assert ".tmp." not in f, os.path.join(root, f) + ": a temporary left behind"
        if f.endswith(".json"):
            json.load(open(os.path.join(root, f)))  # no half file
            whole += 1
print("a full disk: the error names the file and the reason;", whole, "JSON files written before are whole")
PY
  echo "$last"
  ;;
cifar)
  # ResNet-8 on CIFAR-format files made here (no data can be downloaded):
  # sweep, cbs and train end to end with augmentation on a loader thread.
  $py "$src/tests/experiments/make_cifar.py" c10 --train 1500 --test 200 --seed 1
  cat > cifar.json <<'JSON'
{"name": "cifar", "dataset": {"name": "cifar10", "path": "c10", "validation": 300},
 "model": {"type": "resnet", "depth": 8, "width": 8},
 "optimizer": {"name": "sgd", "momentum": 0.9, "nesterov": true},
 "schedule": {"scaling": "none"},
 "target": {"metric": "val_error", "threshold": 0.3, "eval_every": 10},
 "budget": {"steps": 150}, "batch_sizes": [16, 64], "search": {"lr": [0.05]}}
JSON
  "$bigbatch" sweep cifar.json --out runs --jobs 2 > sweep.txt 2> sweep.err || fail "sweep failed: $(tail -3 sweep.err)"
  cat sweep.txt
  $py - runs/cifar <<'PY'
import csv, json, os, sys
d = sys.argv[1]
rows = list(csv.DictReader(open(os.path.join(d, "steps_to_target.csv"))))
assert [r["reached"] for r in rows] == ["1", "1"], rows
for t in ("b16_p0_s0", "b64_p0_s0"):
    s = json.load(open(os.path.join(d, t, "summary.json")))
    assert s["data"]["loader_threads"] == 1, s["data"]
    assert 0 <= s["data"]["wait_fraction"] < 1, s["data"]
    assert json.load(open(os.path.join(d, "sweep.json")))["dataset"]["split_seed"] == 0
PY
  derive cbs.json 'c["name"] = "cifar_cbs"; c["seeds"] = [0]; del c["batch_sizes"], c["search"]
c["cbs"] = {"reference_batch": 16, "reference_lr": 0.05, "checkpoints": [320, 960],
            "branch_batches": [16, 32, 64], "window": 320, "tolerance": {"relative": 0.05}}' cifar.json
  "$bigbatch" cbs cbs.json --out runs > cbs.txt 2> cbs.err || fail "cbs failed: $(tail -3 cbs.err)"
  [ -s runs/cifar_cbs/cbs.csv ] || fail "no cbs.csv"
  "$bigbatch" train cifar.json --out runs --batch-size 32 --lr 0.05 --steps 20 > train.txt 2> train.err ||
    fail "train failed: $(tail -3 train.err)"
  grep -q "after 20 steps" train.txt || fail "train said: $(cat train.txt)"
  # An image folder of PNGs (two classes, a colour each) with one corrupt file:
  # trained through the CLI, the corrupt one skipped, warned about and counted.
  $py - photos <<'PY'
import os, random, struct, sys, zlib
def png(path, pixel):
    raw = b"".join(b"\0" + b"".join(bytes(pixel(x, y)) for x in range(16)) for y in range(16))
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 16, 16, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
rng = random.Random(0)
for c, base in (("blue", (20, 40, 200)), ("red", (200, 30, 30))):
    os.makedirs(os.path.join(sys.argv[1], c), exist_ok=True)
    for i in range(24):
        noise = [rng.randint(-40, 40) for _ in range(3)]
        png(os.path.join(sys.argv[1], c, "%02d.png" % i),
            lambda x, y: [max(0, min(255, v + n + rng.randint(-20, 20))) for v, n in zip(base, noise)])
open(os.path.join(sys.argv[1], "red", "broken.png"), "wb").write(b"\x89PNG\r\n\x1a\nnot really")
PY
  cat > folder.json <<'JSON'
{"name": "folder", "dataset": {"name": "image_folder", "path": "photos", "size": 16, "resize": 16,
                               "validation_fraction": 0.25},
 "model": {"type": "simple_cnn", "variant": "narrow"}, "optimizer": {"name": "sgd", "momentum": 0.9},
 "schedule": {"scaling": "none"}, "target": {"metric": "val_error", "threshold": 0.1, "eval_every": 5},
 "budget": {"steps": 60}, "batch_sizes": [8], "search": {"lr": [0.02]}}
JSON
  "$bigbatch" sweep folder.json --out runs > folder.txt 2> folder.err || fail "folder sweep failed: $(tail -3 folder.err)"
  grep -q "warning: dataset: skipping photos/red/broken.png: not a decodable JPEG or PNG image" folder.err ||
    fail "no warning for the corrupt image: $(cat folder.err)"
  $py - runs/folder/b8_p0_s0/summary.json <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["status"] == "reached", s
assert s["data"]["images"] == 49 and s["data"]["skipped_images"] == 1, s["data"]
assert s["data"]["skipped"] == ["photos/red/broken.png"], s["data"]
PY
  expect_error 2 "dataset.path: nowhere: cannot open (No such file or directory)" \
    "$bigbatch" sweep <(sed 's/"c10"/"nowhere"/' cifar.json) --out missing
  echo "PASS cifar"
  ;;
lm)
  # The language-model workload end to end on a tiny corpus made here: a
  # one-trial sweep of a small GPT to a loose val_loss target, the data's
  # report, 2 data-parallel ranks against one process, cbs, SentencePiece
  # through the CLI, and bad token files (exit 2, one line).
  $py - corpus.txt <<'PY'
import random, sys
rng = random.Random(0)
names = ["adam", "eve", "noah", "moses", "aaron", "david", "ruth", "saul"]
verbs = ["begat", "saw", "blessed", "called", "spake unto", "went with"]
lines = []
for i in range(2500):
    lines.append("%d %s %s %s." % (i % 30 + 1, rng.choice(names), rng.choice(verbs), rng.choice(names)))
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
  cat > lm.json <<'JSON'
{"name": "lm", "dataset": {"name": "text", "path": "corpus.txt", "context": 16, "validation_windows": 64},
 "model": {"type": "gpt", "layers": 1, "width": 32, "heads": 2},
 "optimizer": {"name": "lamb", "weight_decay": 0.01}, "schedule": {"scaling": "none"},
 "target": {"metric": "val_loss", "threshold": 1.6, "eval_every": 10},
 "budget": {"steps": 300}, "batch_sizes": [32], "search": {"lr": [0.02]}}
JSON
  "$bigbatch" sweep lm.json --out runs > sweep.txt 2> sweep.err || fail "sweep failed: $(tail -3 sweep.err)"
  cat sweep.txt
  $py - runs/lm <<'PY'
import csv, json, os, sys
d = sys.argv[1]
rows = list(csv.DictReader(open(os.path.join(d, "steps_to_target.csv"))))
assert [r["reached"] for r in rows] == ["1"], rows
s = json.load(open(os.path.join(d, "b32_p0_s0", "summary.json")))
assert s["data"]["tokenizer"] == "char" and s["data"]["context"] == 16, s["data"]
assert s["data"]["train_tokens"] + s["data"]["validation_tokens"] == len(open("corpus.txt").read()), s["data"]
m = list(csv.DictReader(open(os.path.join(d, "b32_p0_s0", "metrics.csv"))))
first = float(m[0]["val_loss"])
assert 0 < float(m[0]["val_error"]) <= 1 and first > 1.6, m[0]
print("reached after", s["steps_to_target"], "steps; first val_loss", first, "last", m[-1]["val_loss"])
PY
  # 2 ranks x 16 = one process at 32: the same metrics (the GPT's gradients all-reduced).
  port=$(free_port)
  "$bigbatch" train lm.json --batch-size 32 --steps 20 --out one > /dev/null 2>&1 || fail "one process failed"
  "$bigbatch" train lm.json --batch-size 32 --steps 20 --out two --nproc 2 --master-port $port > two.txt 2>&1 ||
    fail "2 ranks failed: $(tail -3 two.txt)"
  $py - one/lm.train/b32_p0_s0/metrics.csv two/lm.train/b32_p0_s0/metrics.csv <<'PY'
import csv, sys
a, b = (list(csv.DictReader(open(p))) for p in sys.argv[1:3])
assert len(a) == len(b) == 2, (len(a), len(b))
for x, y in zip(a, b):
    for k in ("train_loss", "val_loss", "val_error"):
        assert abs(float(x[k]) - float(y[k])) <= 1e-5 * max(1.0, abs(float(x[k]))), (k, x[k], y[k])
print("2 ranks match 1 process")
PY
  # The critical batch size on it: a reference run and its branches.
  derive lm_cbs.json 'c["name"] = "lm_cbs"; c["seeds"] = [0]; del c["batch_sizes"], c["search"]
c["cbs"] = {"reference_batch": 16, "reference_lr": 0.02, "checkpoints": [320, 1280],
            "branch_batches": [16, 64], "window": 640, "tolerance": {"relative": 0.05}}' lm.json
  "$bigbatch" cbs lm_cbs.json --out runs --no-plots > cbs.txt 2> cbs.err || fail "cbs failed: $(tail -3 cbs.err)"
  [ "$(wc -l < runs/lm_cbs/cbs.csv)" -ge 3 ] || fail "cbs.csv: $(cat runs/lm_cbs/cbs.csv)"
  # SentencePiece: trained once on the corpus, cached beside it, then trained on.
  derive spm.json 'c["dataset"].update(tokenizer="sentencepiece", vocab_size=300)' lm.json
  "$bigbatch" train spm.json --steps 5 --out runs > spm.txt 2> spm.err || fail "sentencepiece failed: $(tail -3 spm.err)"
  ls corpus.txt.bpe300-*.model > /dev/null || fail "no cached SentencePiece model beside the corpus"
  $py -c "import json; s = json.load(open('runs/lm.train/b32_p0_s0/summary.json')); assert s['data']['tokenizer'].startswith('sentencepiece'), s['data']; assert 259 < s['data']['vocabulary'] <= 300, s['data']"
  # Token files: a token past the vocabulary, a wrong magic number, a truncated file.
  $py - <<'PY'
import struct
tokens = [i % 40 for i in range(400)]
open("u16.bin", "wb").write(struct.pack("<%dH" % len(tokens), *tokens))
header = struct.pack("<256i", *([20240520, 1, len(tokens)] + [0] * 253))
open("ok.bin", "wb").write(header + struct.pack("<%dH" % len(tokens), *tokens))
open("magic.bin", "wb").write(struct.pack("<256i", *([12345, 1, 4] + [0] * 253)) + b"\0" * 8)
open("short.bin", "wb").write(header + struct.pack("<%dH" % 100, *tokens[:100]))
PY
  derive u16.json 'c["dataset"] = {"name": "text", "path": "u16.bin", "format": "uint16", "vocab_size": 30, "context": 16}' lm.json
  expect_error 2 "u16.bin: token 30 at position 30 is outside the vocabulary of 30" "$bigbatch" train u16.json --steps 1 --out bad
  derive magic.json 'c["dataset"] = {"name": "text", "path": "magic.bin", "format": "llmc", "context": 16}' lm.json
  expect_error 2 "magic.bin: magic number 12345, not llm.c's 20240520" "$bigbatch" train magic.json --steps 1 --out bad
  derive short.json 'c["dataset"] = {"name": "text", "path": "short.bin", "format": "llmc", "context": 16}' lm.json
  expect_error 2 "short.bin: the header counts 400 tokens" "$bigbatch" train short.json --steps 1 --out bad
  derive ok.json 'c["dataset"] = {"name": "text", "path": "ok.bin", "format": "llmc", "vocab_size": 40, "context": 16}' lm.json
  "$bigbatch" train ok.json --steps 3 --batch-size 8 --out runs > ok.txt 2>&1 || fail "llm.c file failed: $(tail -3 ok.txt)"
  ;;
workers)
  # Two plain processes on one sweep folder: the table of one process, every
  # trial finished by exactly one of them (one "done" claim slot each, one
  # line in one of their logs).
  "$bigbatch" sweep "$config" --out one --jobs 1 > /dev/null 2>&1
  "$bigbatch" sweep "$config" --out two --jobs 1 > a.txt 2> a.err &
  a=$!
  "$bigbatch" sweep "$config" --out two --jobs 1 > b.txt 2> b.err || fail "worker b: $(tail -3 b.err)"
  wait $a || fail "worker a: $(tail -3 a.err)"
  cmp one/e2e/steps_to_target.csv two/e2e/steps_to_target.csv || fail "two workers' table differs from one's"
  cmp one/e2e/fit.json two/e2e/fit.json || fail "two workers' fit differs from one's"
  done_slots=$(grep -l '^done ' two/e2e/claims/* | sed 's/\.[0-9]*$//' | sort)
  [ "$(echo "$done_slots" | wc -l)" -eq 40 ] || fail "want 40 committed trials: $done_slots"
  [ -z "$(echo "$done_slots" | uniq -d)" ] || fail "a trial committed twice: $(echo "$done_slots" | uniq -d)"
  ran=$(cat a.err b.err | sed -n 's/^\[[0-9]*\/[0-9]*\] \(b[0-9]*_p[0-9]*_s[0-9]*\): .*/\1/p' | sort)
  [ "$(echo "$ran" | wc -l)" -eq 40 ] && [ -z "$(echo "$ran" | uniq -d)" ] || fail "trials run: $ran"
  echo "two workers: $(grep -c '' <(sed -n 's/^\[[0-9]*\/[0-9]*\] //p' a.err)) and" \
       "$(grep -c '' <(sed -n 's/^\[[0-9]*\/[0-9]*\] //p' b.err)) trials, one table"
  # SIGTERM (a preemption, a time limit): the running trial checkpoints and
  # is given back; exit 75, one line; the same command goes on from the
  # checkpoint and ends with the metrics of an uninterrupted run.
  derive long.json 'c["budget"] = {"steps": 6000}; c["checkpoint_every"] = 1000; c["batch_sizes"] = [64]; c["search"] = {"lr": [0.01]}; c["model"]["widths"] = [256, 256]
c["seeds"] = [0]; c["target"] = {"metric": "val_loss", "threshold": 1e-9, "eval_every": 500}'
  trial=e2e/b64_p0_s0
  "$bigbatch" sweep long.json --out ref > /dev/null 2>&1
  "$bigbatch" sweep long.json --out sig > /dev/null 2> sig.err &
  pid=$!
  for _ in $(seq 600); do grep -q "step [1-9][0-9]*/6000" sig.err 2>/dev/null && break; sleep 0.05; done
  # Stopped where it is (a fast machine would otherwise finish the trial
  # before the signal): the trial is running whatever this machine's speed,
  # and its claim stays fresh (the lease is 120 s).
  kill -STOP $pid || fail "the sweep ended before its first step was seen: $(tail -3 sig.err)"
  # `report` on a sweep still running its first round: how far it is.
  "$bigbatch" report sig/e2e > progress.txt || fail "report while running"
  grep -qx "sig/e2e: in progress: 0 trial(s) finished, 1 running, 1 started; the table is written when the first round ends" \
    progress.txt || fail "report while running: $(cat progress.txt)"
  kill -TERM $pid
  kill -CONT $pid
  rc=0
  wait $pid || rc=$?
  [ "$rc" -eq 75 ] || fail "SIGTERM: exit $rc, want 75: $(tail -3 sig.err)"
  grep -q "^bigbatch: stopped by SIGTERM: 1 running trial(s) given back, checkpointed unless batched" sig.err \
    || fail "no line about the stop: $(tail -3 sig.err)"
  [ -e sig/$trial/checkpoint.pt ] && [ ! -e sig/$trial/summary.json ] || fail "no checkpoint left, or a summary"
  grep -q '^released ' sig/e2e/claims/b64_p0_s0.2 || fail "the claim was not given back"
  "$bigbatch" report sig/e2e | grep -q "0 trial(s) finished, 0 running, 1 started" || fail "report after the stop"
  "$bigbatch" sweep long.json --out sig > /dev/null 2> again.err || fail "resume: $(tail -3 again.err)"
  grep -q "resuming b64_p0_s0 from its checkpoint at step [1-9]" again.err || fail "not resumed: $(head -3 again.err)"
  cmp <(cut -d, -f1-8,10 ref/$trial/metrics.csv) <(cut -d, -f1-8,10 sig/$trial/metrics.csv) \
    || fail "the stopped and resumed trial's metrics differ"
  # A sweep killed outright and started again on this machine takes its
  # trial back at once (its process is gone), not after the lease.
  "$bigbatch" sweep long.json --out kill > /dev/null 2> kill.err &
  pid=$!
  for _ in $(seq 600); do [ -e kill/$trial/checkpoint.pt ] && break; sleep 0.05; done
  kill -9 $pid || fail "the sweep ended before it was killed"
  wait $pid || true
  # At once: the line names the gone process as the reason, where a wait for
  # the lease would say "silent for ... s, lease 120 s" (claims.cpp).
  "$bigbatch" sweep long.json --out kill > /dev/null 2> kill2.err || fail "after kill -9: $(tail -3 kill2.err)"
  grep -q "taking over trial b64_p0_s0 from worker .* (its process on this machine is gone)" kill2.err \
    || fail "no takeover: $(head -3 kill2.err)"
  cmp <(cut -d, -f1-8,10 ref/$trial/metrics.csv) <(cut -d, -f1-8,10 kill/$trial/metrics.csv) \
    || fail "the killed and resumed trial's metrics differ"
  # Cores: a worker holding every core of this machine leaves none for a
  # second, which refuses in one line (exit 2) before loading any data.
  cores=$(nproc)
  "$bigbatch" sweep long.json --out hog --jobs "$cores" > /dev/null 2> hog.err &
  pid=$!
  for _ in $(seq 600); do [ -e "$BIGBATCH_CORE_LEDGER/$pid" ] && break; sleep 0.05; done
  kill -STOP $pid || fail "the worker holding every core ended before the second started"  # it holds them while stopped
  expect_error 2 "no core of this machine's $cores is free for a trial of 1 thread(s): other bigbatch workers hold them (pid $pid: $cores)" \
    "$bigbatch" sweep "$config" --out other
  [ ! -e other/e2e/claims ] || fail "a refused worker claimed trials"
  kill -TERM $pid
  kill -CONT $pid
  wait $pid || true
  expect_error 2 "--lease: must be a number of seconds > 0, got 0" "$bigbatch" sweep "$config" --out other --lease 0
  grep -qx "bigbatch: --lease: must be a number of seconds > 0, got 0" err.txt || fail "lease message: $(cat err.txt)"
  echo "workers ok"
  ;;
quickstart)
  # The shipped configs parse; one quickstart trial runs a few steps on Fashion-MNIST.
  # The CIFAR configs read data/cifar-10-batches-bin: generated files stand in.
  $py "$src/tests/experiments/make_cifar.py" data/cifar-10-batches-bin --train 5200 --test 100
  "$src/scripts/kjv.sh" data/kjv.txt  # the language-model configs' corpus
  for c in "$src"/experiments/configs/*.json; do
    # The CIFAR configs hold 5000 training images out to evaluate on: the
    # step's evaluation then took 40 s of ResNet-44 here. 100 of them, the
    # rest of the config as shipped (Cbs.ShippedConfigsParse and
    # SweepConfig.ShippedConfigsParse read each file as it is).
    if grep -q '"validation": 5000' "$c"; then
      derive "$(basename "$c")" 'c["dataset"]["validation"] = 100' "$c"
      c=$(basename "$c")
    fi
    if grep -q '"cbs"' "$c"; then  # a cbs config (parsed in Cbs.ShippedConfigsParse): not a sweep
      expect_error 2 "cbs: this is a cbs config: run it with \`bigbatch cbs\`" "$bigbatch" train "$c" --out parse
      continue
    fi
    extra=()  # a compression comparison: its fp32 variant (the others need 2 ranks: CLI.compression)
    if grep -q '"compression"' "$c"; then extra=(--variant none); fi
    "$bigbatch" train "$c" --steps 1 --out parse "${extra[@]}" > /dev/null 2>&1 \
      || fail "$c does not run: $("$bigbatch" train "$c" --steps 1 --out parse "${extra[@]}" 2>&1 | tail -1)"
    # The optimizer comparisons: every optimizer's variant steps (the first runs above).
    for v in $($py -c 'import json, sys; c = json.load(open(sys.argv[1])); print(*(v for v in c.get("variants", {}) if v in ("muon", "lion", "lamb", "sgd", "schedule_free", "soap", "shampoo")))' "$c"); do
      "$bigbatch" train "$c" --steps 1 --out parse --variant "$v" > /dev/null 2>&1 \
        || fail "$c, variant $v, does not run: $("$bigbatch" train "$c" --steps 1 --out parse --variant "$v" 2>&1 | tail -1)"
    done
  done
  "$bigbatch" train "$src/experiments/configs/quickstart.json" --steps 5 --batch-size 64 --out runs
  $py -c "import json; s = json.load(open('runs/quickstart.train/b64_p0_s0/summary.json')); assert s['steps'] == 5, s; print('quickstart trial ok', s['status'], s['best_metric'])"
  ;;
data_parallel)
  # 2 ranks (Gloo on 127.0.0.1) x 256 = one process at 512: the same metrics.
  port=$(free_port)
  "$bigbatch" train "$config" --batch-size 512 --lr 0.03 --steps 40 --out one > /dev/null 2>&1
  "$bigbatch" train "$config" --batch-size 512 --lr 0.03 --steps 40 --out two --nproc 2 --master-port $port | tee two.txt
  grep -q "data-parallel over 2 ranks" two.txt || fail "not data-parallel"
  # Each rank has the config's runner.threads_per_trial intra-op threads (1),
  # as each trial of a sweep does.
  want=1
  grep -qE ", $want intra-op threads? per rank\)" two.txt || fail "threads per rank, want $want: $(cat two.txt)"
  $py - one/e2e.train/b512_p0_s0/metrics.csv two/e2e.train/b512_p0_s0/metrics.csv <<'PY'
import csv, sys
a, b = (list(csv.DictReader(open(p))) for p in sys.argv[1:3])
assert len(a) == len(b) and a, (len(a), len(b))
for x, y in zip(a, b):
    for k in ("step", "examples", "batch_size"):
        assert x[k] == y[k], (k, x[k], y[k])
    for k in ("train_loss", "val_loss", "val_error"):
        assert abs(float(x[k]) - float(y[k])) <= 1e-5 * max(1.0, abs(float(x[k]))), (k, x[k], y[k])
print("2 ranks match 1 process over", len(a), "evaluations")
PY
  # A data-parallel sweep: rank 0 alone writes; the table has one row per batch size.
  derive dp.json 'c["batch_sizes"] = [32, 512]; c["seeds"] = [0]; c["search"] = {"lr": [0.03]}'
  # (--batch-trials does not apply to it: one line says so.)
  "$bigbatch" sweep dp.json --out runs --nproc 2 --master-port $(free_port) --batch-trials > sweep.txt 2> sweep.err
  grep -q "note: no batched trials (a data-parallel sweep): each trial runs alone" sweep.err \
    || fail "no note about batching: $(cat sweep.err)"
  [ "$(wc -l < runs/e2e/steps_to_target.csv)" -eq 3 ] || fail "table: $(cat runs/e2e/steps_to_target.csv)"
  [ -z "$(find runs -name '*.tmp.*')" ] || fail "temporary files left"
  # A rank killed from outside: the launcher stops the other and fails, fast.
  derive long.json 'c["target"]["threshold"] = 0.0001; c["budget"] = {"steps": 1000000}'
  "$bigbatch" train long.json --batch-size 64 --out long --nproc 2 --master-port $(free_port) --timeout 5 \
    > /dev/null 2> long.err &
  launcher=$!
  # Both ranks training (rank 0's event file grew by an evaluation after
  # its first record), however long starting them took here; then the
  # newest rank is killed.
  events=long/e2e.train/b64_p0_s0/events.out.tfevents.bigbatch
  for _ in $(seq 1200); do [ -s $events ] && break; sleep 0.05; done
  grows $events
  [ "$(pgrep -c -P $launcher)" -eq 2 ] || fail "want 2 ranks training: $(tail -3 long.err)"
  pkill -KILL -n -P $launcher || fail "no rank to kill"
  killed=$SECONDS
  rc=0
  wait $launcher || rc=$?
  cat long.err | tail -3
  [ "$rc" -ne 0 ] || fail "the launcher exited 0 after a rank was killed"
  # A watchdog, not a speed: the launcher stops the other rank within its
  # 10 s grace (launch.cpp), where a missed death would hang until ctest's limit.
  [ $((SECONDS - killed)) -lt 60 ] || fail "the launcher took $((SECONDS - killed)) s to notice"
  grep -q "exited with status" long.err || fail "no message about the dead rank: $(cat long.err)"
  # A batch the world does not divide is a bad argument.
  expect_error 2 "is not divisible by the world size 2" "$bigbatch" train "$config" --batch-size 9 --nproc 2 --master-port $(free_port)
  # cbs data-parallel: every reference, branch and comparison run over 2
  # ranks gives the curve one process gives.
  cbs=$src/tests/experiments/e2e_cbs.json
  "$bigbatch" cbs "$cbs" --out cbs_one --compare --no-plots > /dev/null 2>&1
  "$bigbatch" cbs "$cbs" --out cbs_two --compare --no-plots --nproc 2 --master-port $(free_port) > /dev/null 2> cbs.err \
    || fail "data-parallel cbs: $(tail -3 cbs.err)"
  $py - cbs_one/e2e_cbs cbs_two/e2e_cbs <<'PY'
import csv, os, sys
one, two = (list(csv.DictReader(open(os.path.join(d, "cbs.csv")))) for d in sys.argv[1:])
for a, b in zip(one, two):
    assert (a["examples"], a["critical_batch"]) == (b["examples"], b["critical_batch"]), (a, b)
    for k in a:
        if k.startswith("loss_b") or k == "reference_val_loss":
            assert abs(float(a[k]) - float(b[k])) <= 1e-4 * abs(float(a[k])), (k, a[k], b[k])
assert open(os.path.join(sys.argv[1], "schedule.json")).read() == open(os.path.join(sys.argv[2], "schedule.json")).read()
print("data-parallel cbs: the same curve and schedule")
PY
  ;;
compression)
  # Gradient compression in data-parallel trials (distributed/compression.h).
  port=$(free_port)
  # Bad parameters: one line, exit 2, before any training.
  derive bad.json 'c["distributed"] = {"compression": {"name": "topk", "ratio": 0}}'
  expect_error 2 "distributed.compression.ratio: must be in (0, 1], got 0" "$bigbatch" train bad.json --nproc 2 --master-port $port
  derive bad.json 'c["distributed"] = {"compression": {"name": "randomk", "ratio": 1.5}}'
  expect_error 2 "distributed.compression.ratio: must be in (0, 1], got 1.5" "$bigbatch" sweep bad.json --nproc 2 --master-port $port
  derive bad.json 'c["distributed"] = {"compression": {"name": "powersgd", "rank": 0}}'
  expect_error 2 "distributed.compression.rank: must be >= 1, got 0" "$bigbatch" train bad.json --nproc 2 --master-port $port
  derive bad.json 'c["distributed"] = {"compression": {"name": "zip"}}'
  expect_error 2 'distributed.compression.name: unknown value "zip"' "$bigbatch" train bad.json --nproc 2 --master-port $port
  derive bad.json 'c["distributed"] = {"compression": {"name": "topk", "rank": 2}}'
  expect_error 2 "distributed.compression.rank" "$bigbatch" train bad.json --nproc 2 --master-port $port
  derive bad.json 'c["distributed"] = {"compression": {"name": "qsgd", "levels": 200}}'
  expect_error 2 "distributed.compression.levels: must be in [1, 127], got 200" "$bigbatch" train bad.json --nproc 2 --master-port $port
  derive bad.json 'c["distributed"] = {"bucket_mb": 0}'
  expect_error 2 "distributed.bucket_mb: must be in (0, 4096], got 0" "$bigbatch" train bad.json --nproc 2 --master-port $port
  derive topk.json 'c["distributed"] = {"compression": {"name": "topk", "ratio": 0.05}}'
  expect_error 2 "distributed.compression: topk compresses the gradient exchange of a data-parallel run" "$bigbatch" train topk.json
  # "none" is the fp32 exchange of a config without the key: the same run, bit for bit.
  derive none.json 'c["distributed"] = {"compression": {"name": "none"}, "bucket_mb": 25}'
  "$bigbatch" train "$config" --batch-size 512 --lr 0.03 --steps 40 --out plain --nproc 2 --master-port $(free_port) > /dev/null
  "$bigbatch" train none.json --batch-size 512 --lr 0.03 --steps 40 --out none --nproc 2 --master-port $(free_port) > /dev/null
  $py - plain/e2e.train/b512_p0_s0 none/e2e.train/b512_p0_s0 <<'PY'
import csv, json, os, sys
a, b = (list(csv.DictReader(open(os.path.join(d, "metrics.csv")))) for d in sys.argv[1:3])
assert len(a) == len(b) >= 2, (len(a), len(b))
for x, y in zip(a, b):
    for k in x:
        if k not in ("wall_time", "compress_seconds", "comm_seconds"):
            assert x[k] == y[k], (k, x[k], y[k])
    assert float(x["bytes_sent"]) == int(x["step"]) * 4 * sum([16 * 32, 32, 32 * 4, 4]), x  # W = 2: 4 bytes a parameter
s = json.load(open(os.path.join(sys.argv[1], "summary.json")))
assert s["exchange"]["compression"] == "none" and s["exchange"]["compression_ratio"] == 1, s["exchange"]
print("compression none: the plain exchange, bit for bit;", s["exchange"]["bytes_sent_per_step"], "bytes a step")
PY
  # Every compressor reaches the quickstart target over 2 ranks at batch 256,
  # sending fewer bytes a step than fp32 by at least the ratio of its code
  # (DGC less: its sparsity warmup sends 25% at first)
  # (LAMB, the quickstart's rate; sign a smaller one, DGC plain SGD: its
  # exchange carries the momentum).
  i=0
  while read -r name params lr optimizer; do
    i=$((i + 1))
    derive "q_$name.json" "c['name'] = 'q_$name'; c.pop('gns'); c['distributed'] = {'compression': $params}
if '$optimizer' != '-': c['optimizer'] = json.loads('$optimizer')" "$src/experiments/configs/quickstart.json"
    "$bigbatch" train "q_$name.json" --batch-size 256 --lr "$lr" --out q --nproc 2 --master-port $(free_port) > "q_$name.txt" 2>&1 \
      || fail "$name: $(tail -3 "q_$name.txt")"
    grep -q "^gradient exchange: $name, .* sent a step per rank" "q_$name.txt" || fail "no exchange line: $(tail -2 "q_$name.txt")"
    $py - "q/q_$name.train/b256_p0_s0" "$name" <<'PY'
import csv, json, os, sys
d, name = sys.argv[1:3]
s = json.load(open(os.path.join(d, "summary.json")))
assert s["status"] == "reached", (name, s["status"], s["best_metric"])
x = s["exchange"]
assert x["bytes_to_target"] == x["bytes_sent"] and x["bytes_sent"] > 0, x
want = {"none": 1, "fp16": 2, "bf16": 2, "topk": 50, "randomk": 2, "dgc": 5, "sign": 30, "terngrad": 15, "qsgd": 3.9, "powersgd": 20}[name]
assert x["compression_ratio"] >= want, (name, x["compression_ratio"], want)
rows = list(csv.DictReader(open(os.path.join(d, "metrics.csv"))))
assert float(rows[-1]["bytes_sent"]) == x["bytes_sent"], (rows[-1], x)
assert open(os.path.join(d, "events.out.tfevents.bigbatch"), "rb").read().count(b"exchange/bytes_sent") == len(rows)
print(f"{name}: reached at step {s['steps_to_target']}, {x['bytes_sent'] / 1e6:.2f} MB sent, ratio {x['compression_ratio']:.1f}")
PY
  done <<'LIST'
none {"name":"none"} 0.01 -
fp16 {"name":"fp16"} 0.01 -
bf16 {"name":"bf16"} 0.01 -
topk {"name":"topk","ratio":0.01} 0.01 -
randomk {"name":"randomk","ratio":0.5} 0.01 -
dgc {"name":"dgc","ratio":0.01,"warmup_steps":100} 0.1 {"name":"sgd","momentum":0}
sign {"name":"sign"} 0.003 -
terngrad {"name":"terngrad"} 0.01 -
qsgd {"name":"qsgd"} 0.01 -
powersgd {"name":"powersgd","rank":2} 0.01 -
LIST
  # A compressed sweep's report shows the bytes to target beside steps and examples.
  derive sw.json 'c["batch_sizes"] = [32, 512]; c["seeds"] = [0]; c["search"] = {"lr": [0.03]}; c["distributed"] = {"compression": {"name": "topk", "ratio": 0.05}}'
  "$bigbatch" sweep sw.json --out runs --nproc 2 --master-port $(free_port) > /dev/null 2>&1 || fail "compressed sweep"
  "$bigbatch" report runs/e2e > report.txt
  cat report.txt
  grep -q "bytes sent" report.txt || fail "no bytes column in the report"
  $py -c "
import csv; r = list(csv.DictReader(open('runs/e2e/steps_to_target.csv')))
assert all(float(x['bytes']) > 0 for x in r if x['reached'] == '1'), r"
  ;;
local_sgd)
  # Local SGD and DiLoCo in data-parallel trials (distributed/local_sgd.h).
  # Bad keys: one line, exit 2, before any training.
  port=$(free_port)
  derive bad.json 'c["distributed"] = {"sync": {"type": "local_sgd", "every": 0}}'
  expect_error 2 "distributed.sync.every: must be >= 1 (steps), got 0" "$bigbatch" train bad.json --nproc 2 --master-port $port
  derive bad.json 'c["distributed"] = {"sync": {"type": "diloco", "every": 4, "fragments": 3}}'
  expect_error 2 "distributed.sync.fragments: must be >= 1 and divide every (4), got 3" "$bigbatch" sweep bad.json --nproc 2 --master-port $port
  derive bad.json 'c["distributed"] = {"sync": {"type": "local_sgd", "every": 4, "outer": {"lr": 0.7}}}'
  expect_error 2 "distributed.sync.outer: local_sgd averages the models; an outer step is diloco's" "$bigbatch" train bad.json --nproc 2 --master-port $port
  derive bad.json 'c["distributed"] = {"sync": {"type": "diloco", "every": 4, "outer": {"momentum": 1}}}'
  expect_error 2 "distributed.sync.outer.momentum: must be in [0, 1), got 1" "$bigbatch" train bad.json --nproc 2 --master-port $port
  derive bad.json 'c["distributed"] = {"sync": {"type": "gossip", "every": 4}}'
  expect_error 2 'distributed.sync.type: unknown value "gossip"' "$bigbatch" train bad.json --nproc 2 --master-port $port
  derive bad.json 'c["optimizer"] = {"name": "lamb"}; c["distributed"] = {"sync": {"type": "diloco", "every": 4}, "shard": "states"}'
  expect_error 2 'distributed.shard: the ranks of diloco keep their own optimizer states' "$bigbatch" train bad.json --nproc 2 --master-port $port
  derive bad.json 'c["distributed"] = {"sync": {"type": "diloco", "every": 4}}; c["checkpoint_every"] = 50'
  expect_error 2 'checkpoint_every: not with distributed.sync diloco' "$bigbatch" sweep bad.json --nproc 2 --master-port $port
  # One step between synchronizations is synchronous data parallelism: the
  # same validation curve to rounding (the parameters' difference rounds once
  # more than the averaged gradient's step), one synchronization a step.
  # (A target never reached: every run goes its 40 or 44 steps.)
  derive plain.json 'c["target"]["threshold"] = 1e-9'
  derive h1.json 'c["target"]["threshold"] = 1e-9; c["distributed"] = {"sync": {"type": "local_sgd", "every": 1}}'
  "$bigbatch" train plain.json --batch-size 512 --lr 0.03 --steps 40 --out plain --nproc 2 --master-port $(free_port) > /dev/null
  "$bigbatch" train h1.json --batch-size 512 --lr 0.03 --steps 40 --out h1 --nproc 2 --master-port $(free_port) > h1.txt
  grep -q "^local_sgd every 1 steps, 40 synchronizations: none, " h1.txt || fail "no synchronization line: $(cat h1.txt)"
  $py - plain/e2e.train/b512_p0_s0 h1/e2e.train/b512_p0_s0 <<'PY'
import csv, json, os, sys
a, b = (list(csv.DictReader(open(os.path.join(d, "metrics.csv")))) for d in sys.argv[1:3])
assert len(a) == len(b) >= 2, (len(a), len(b))
for x, y in zip(a, b):
    assert abs(float(x["val_loss"]) - float(y["val_loss"])) <= 1e-5 * float(x["val_loss"]), (x, y)
    assert x["syncs"] == y["syncs"] == x["step"], (x["syncs"], y["syncs"])
    assert x["bytes_sent"] == y["bytes_sent"], (x["bytes_sent"], y["bytes_sent"])  # one fp32 all-reduce a step
s = json.load(open(os.path.join(sys.argv[2], "summary.json")))["exchange"]
assert s["sync"] == "local_sgd" and s["every"] == 1 and s["syncs"] == 40 and s["compression_ratio"] == 1, s
print("local SGD at H = 1: synchronous data parallelism's curve;", a[-1]["val_loss"], b[-1]["val_loss"])
PY
  # DiLoCo every 8 steps in 2 fragments over 2 ranks, 44 steps: fragment 0
  # after steps 8, 16, ..., 40, fragment 1 after 4, 12, ..., 44, and at the
  # end fragment 0 again: 11 rounds, 12 fragment synchronizations of half the
  # 676 parameters (W = 2: 338 x 4 bytes each); one round's peak is half the
  # model's all-reduce.
  derive dl.json 'c["target"]["threshold"] = 1e-9; c["tensorboard"] = True
c["distributed"] = {"sync": {"type": "diloco", "every": 8, "fragments": 2}}'
  "$bigbatch" train dl.json --batch-size 512 --lr 0.03 --steps 44 --out dl --nproc 2 --master-port $(free_port) > dl.txt
  $py - dl/e2e.train/b512_p0_s0 <<'PY'
import csv, json, os, sys
d = sys.argv[1]
s = json.load(open(os.path.join(d, "summary.json")))
x = s["exchange"]
assert s["steps"] == 44 and x["sync"] == "diloco" and x["every"] == 8 and x["fragments"] == 2, x
assert x["outer"] == {"lr": 0.7, "momentum": 0.9, "nesterov": True}, x["outer"]
assert x["syncs"] == 11 and x["fragment_syncs"] == 12, x
assert x["bytes_sent"] == 12 * 338 * 4 and x["peak_sync_bytes"] == 338 * 4, x
assert x["dense_bytes_per_step"] == 676 * 4, x
rows = list(csv.DictReader(open(os.path.join(d, "metrics.csv"))))
# Between the two fragments a round every 4 steps: t // 4 by step t.
assert [int(r["syncs"]) for r in rows] == [int(r["step"]) // 4 for r in rows], [(r["step"], r["syncs"]) for r in rows]
assert all(float(r["outer_norm"]) > 0 for r in rows), rows
events = open(os.path.join(d, "events.out.tfevents.bigbatch"), "rb").read()
assert events.count(b"sync/outer_norm") == len(rows) and events.count(b"exchange/syncs") == len(rows)
print("diloco: 11 rounds, 12 fragment synchronizations,", x["bytes_sent"], "bytes; peak", x["peak_sync_bytes"])
PY
  # Delayed gradients (asynchronous SGD's staleness, simulated): tau = 0 is
  # the plain run bit for bit, in one process and over 2 ranks; uniform
  # staleness is the same run twice, its histogram counting every step.
  derive dz.json 'c["distributed"] = {"sync": {"type": "delayed", "tau": -1}}'
  expect_error 2 "distributed.sync.tau: must be >= 0 (steps), got -1" "$bigbatch" train dz.json
  derive dz.json 'c["distributed"] = {"sync": {"type": "delayed", "tau": 2}, "shard": "states"}; c["optimizer"] = {"name": "lamb"}'
  expect_error 2 "distributed.shard: delayed keeps the past parameters whole on every rank" "$bigbatch" train dz.json --nproc 2 --master-port $(free_port)
  derive d0.json 'c["target"]["threshold"] = 1e-9; c["distributed"] = {"sync": {"type": "delayed", "tau": 0}}'
  derive du.json 'c["target"]["threshold"] = 1e-9; c["distributed"] = {"sync": {"type": "delayed", "tau": 4, "draw": "uniform", "staleness_aware": True}}'
  "$bigbatch" train plain.json --batch-size 64 --lr 0.03 --steps 30 --out one > /dev/null
  "$bigbatch" train d0.json --batch-size 64 --lr 0.03 --steps 30 --out d0 > /dev/null
  "$bigbatch" train du.json --batch-size 64 --lr 0.03 --steps 30 --out du > /dev/null
  "$bigbatch" train du.json --batch-size 64 --lr 0.03 --steps 30 --out du2 > /dev/null
  "$bigbatch" train d0.json --batch-size 512 --lr 0.03 --steps 40 --out d0r --nproc 2 --master-port $(free_port) > /dev/null
  $py - plain/e2e.train/b512_p0_s0 d0r/e2e.train/b512_p0_s0 <<'PY'
import csv, os, sys
a, b = (list(csv.DictReader(open(os.path.join(d, "metrics.csv")))) for d in sys.argv[1:3])
assert len(a) == len(b) >= 2, (len(a), len(b))
for x, y in zip(a, b):
    assert all(x[k] == y[k] for k in x if k not in ("wall_time", "compress_seconds", "comm_seconds")), (x, y)
print("delayed, tau 0, over 2 ranks: synchronous data parallelism bit for bit")
PY
  $py - one/e2e.train/b64_p0_s0 d0/e2e.train/b64_p0_s0 du/e2e.train/b64_p0_s0 du2/e2e.train/b64_p0_s0 <<'PY'
import csv, json, os, sys
one, d0, du, du2 = (list(csv.DictReader(open(os.path.join(d, "metrics.csv")))) for d in sys.argv[1:5])
for a, b in ((one, d0), (du, du2)):
    assert len(a) == len(b) == 6, (len(a), len(b))
    for x, y in zip(a, b):
        assert all(x[k] == y[k] for k in x if k != "wall_time"), (x, y)
assert any(x["val_loss"] != y["val_loss"] for x, y in zip(one, du)), "tau 4 trained as tau 0"
s = json.load(open(os.path.join(sys.argv[3], "summary.json")))["staleness"]
assert s["tau"] == 4 and s["draw"] == "uniform" and s["staleness_aware"] and s["steps"] == 30, s
assert len(s["histogram"]) == 5 and sum(s["histogram"]) == 30 and s["histogram"][0] >= 1, s
assert abs(s["mean"] - sum(k * n for k, n in enumerate(s["histogram"])) / 30) < 1e-12, s
z = json.load(open(os.path.join(sys.argv[2], "summary.json")))["staleness"]
assert z["histogram"] == [30] and z["mean"] == 0, z
print("delayed: tau 0 the plain run bit for bit; uniform tau <= 4 reproducible, histogram", s["histogram"])
PY
  # A sweep with the synchronization as a dimension: the table and report
  # carry bytes and synchronizations to the target.
  derive sw.json 'c["batch_sizes"] = [128, 512]; c["seeds"] = [0]; c["search"] = {"lr": [0.03]}
c["variants"] = {"sync": {}, "local4": {"distributed": {"sync": {"type": "local_sgd", "every": 4}}},
                 "diloco8": {"distributed": {"sync": {"type": "diloco", "every": 8}}}}'
  "$bigbatch" sweep sw.json --out runs --nproc 2 --master-port $(free_port) > sweep.txt 2> sweep.err \
    || fail "local SGD sweep: $(tail -3 sweep.err)"
  "$bigbatch" report runs/e2e/diloco8 > report.txt
  cat report.txt
  grep -q "syncs" report.txt || fail "no syncs column in the report"
  $py - runs/e2e <<'PY'
import csv, json, os, sys
d = sys.argv[1]
for v, every in (("sync", 1), ("local4", 4), ("diloco8", 8)):
    rows = list(csv.DictReader(open(os.path.join(d, v, "steps_to_target.csv"))))
    assert len(rows) == 2 and all(r["reached"] == "1" for r in rows), rows
    for r in rows:
        if r["reached"] != "1":
            continue
        s = json.load(open(os.path.join(d, v, r["trial"], "summary.json")))
        x = s["exchange"]
        # Synchronous: a synchronization a step; local: every H steps (the
        # target is read at evaluations, every 5 steps: the rounds by then).
        assert float(r["syncs"]) == x["syncs_to_target"] == s["steps_to_target"] // every, (v, r, x)
        assert float(r["bytes"]) == x["bytes_to_target"] > 0, (v, r, x)
    print(v, [(r["batch_size"], r["steps"], r["syncs"], r["bytes"]) for r in rows])
PY
  ;;
env_precision)
  unset BIGBATCH_SLOW_MATH_BELOW  # the warning as a user gets it
  # No verdict here depends on how fast this machine multiplies: each run's
  # warning is checked against the rates that same process measured and
  # recorded (summary.json's machine.math: its fraction of the peak, the
  # threshold it was judged against, and the verdict), and the slow and the
  # fast case are forced with a threshold above any fraction (2: no product
  # reaches twice the multiply-add peak; 1000 leaves room for a peak loop the
  # other core slowed) and below every one (0).
  # follows DIR ERR [WANT]: DIR's summary.json records a verdict that follows
  # its fraction against its threshold (and is WANT, "slow" or "ok", where
  # given), and ERR holds the warning, once, exactly when the verdict is slow.
  follows() {
    $py - "$1/summary.json" "$2" "${3:-}" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["machine"]["math"]
err, want = open(sys.argv[2]).read(), sys.argv[3]
f, below = m["fraction_of_peak"], m["slow_below"]
assert m["slow"] == (f is not None and f < below), m
assert not want or m["slow"] == (want == "slow"), (want, m)
warned = err.count("warning: matrix products run at")
assert warned == (1 if m["slow"] else 0), (warned, m, err)
print(f"{sys.argv[1]}: {f:.2f} of the peak against {below}: {'slow, warned' if m['slow'] else 'ok, no warning'}")
PY
  }
  # bigbatch env: its report, as text and JSON, and the math check in it.
  "$bigbatch" env > env.txt
  cat env.txt
  for line in "LibTorch: " "BLAS: " "threads: " "matrix product, 1 thread: " "math check: "; do
    grep -q "^$line" env.txt || fail "bigbatch env has no line '$line'"
  done
  "$bigbatch" env --json > env.json
  $py - env.json <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
c = m["math"]
assert c["sgemm_gflops_1_thread"] > 0 and m["logical_cores"] > 0 and m["blas"], m
# The peak at the widest width the CPU reports (MathCheck's own test bounds
# the product's rate by it, with the repeats a loaded core needs).
isa = m["isa"]
widest = "avx512f" if "avx512f" in isa else "avx2+fma" if "avx2" in isa and "fma" in isa else "sse2"
assert c["fma_peak_gflops_1_thread"] is None or (c["fma_peak_gflops_1_thread"] > 0 and c["fma_peak_isa"] == widest), m
assert c["slow_below"] == 0.25, c  # kSlowMathFraction, unset BIGBATCH_SLOW_MATH_BELOW
assert c["slow"] == (c["fraction_of_peak"] is not None and c["fraction_of_peak"] < c["slow_below"]), c
print("env --json:", m["blas"], c["fraction_of_peak"])
PY
  # Forced slow: one line, once, before the trial, naming bigbatch env; the
  # trial's summary.json records the check.
  BIGBATCH_SLOW_MATH_BELOW=1000 "$bigbatch" train "$config" --steps 10 --out forced > forced.txt 2> forced.err
  follows forced/e2e.train/b8_p0_s0 forced.err slow
  grep -q "bigbatch env says more" forced.err || fail "the warning names bigbatch env: $(cat forced.err)"
  # Forced fast, and as measured with the default threshold.
  BIGBATCH_SLOW_MATH_BELOW=0 "$bigbatch" train "$config" --steps 10 --out never > /dev/null 2> never.err
  follows never/e2e.train/b8_p0_s0 never.err ok
  "$bigbatch" train "$config" --steps 10 --out plain > /dev/null 2> plain.err
  follows plain/e2e.train/b8_p0_s0 plain.err
  expect_error 2 'BIGBATCH_SLOW_MATH_BELOW: expected a fraction >= 0, got "fast"' \
    env BIGBATCH_SLOW_MATH_BELOW=fast "$bigbatch" train "$config" --steps 10 --out bad_env
  derive one.json 'c["batch_sizes"] = [128]; c["seeds"] = [0]; c["search"] = {"lr": [0.03]}; c["budget"] = {"steps": 20}'
  "$bigbatch" sweep one.json --out sweep > /dev/null 2>&1 || fail "sweep"
  $py -c "import json; s = json.load(open('sweep/e2e/sweep.json')); assert s['machine']['math']['sgemm_gflops_1_thread'] > 0, s"
  "$bigbatch" sweep one.json --out sweep > /dev/null 2>&1 || fail "a resumed sweep refused its own folder (the machine is not part of its identity)"
  # Where the BLAS is OpenBLAS (Debian's LibTorch 1.13), its generic kernels
  # forced by its own variable: bigbatch env names them, and the warning, as
  # measured and forced, names the variable as the remedy. (Whether generic
  # kernels fall under the threshold depends on the CPU: 16% of the peak on
  # one AMD EPYC, 32% on another.)
  if grep -q '"blas": "OpenBLAS' env.json; then
    OPENBLAS_CORETYPE=Prescott "$bigbatch" env > prescott.txt
    grep -qi "^BLAS: OpenBLAS .*(Prescott kernels)" prescott.txt || fail "Prescott kernels not named: $(cat prescott.txt)"
    OPENBLAS_CORETYPE=Prescott "$bigbatch" train "$config" --steps 10 --out prescott > /dev/null 2> prescott.err
    follows prescott/e2e.train/b8_p0_s0 prescott.err
    OPENBLAS_CORETYPE=Prescott BIGBATCH_SLOW_MATH_BELOW=1000 "$bigbatch" train "$config" --steps 10 --out prescott_forced \
      > /dev/null 2> prescott_forced.err
    follows prescott_forced/e2e.train/b8_p0_s0 prescott_forced.err slow
    grep -q "OPENBLAS_CORETYPE=Prescott is set: unset it" prescott_forced.err || fail "no remedy: $(cat prescott_forced.err)"
    echo "OpenBLAS with Prescott kernels: $(grep '^math check' prescott.txt)"
  fi

  # Mixed precision: a bf16 variant beside fp32 in one sweep, its summaries and columns.
  derive mixed.json 'c["batch_sizes"] = [128]; c["seeds"] = [0]; c["search"] = {"lr": [0.03]}; c["variants"] = {"fp32": {}, "bf16": {"precision": "bf16"}}'
  "$bigbatch" sweep mixed.json --out mixed > mixed.txt 2>&1 || fail "the bf16 sweep: $(tail -3 mixed.txt)"
  $py - mixed/e2e <<'PY'
import csv, json, os, sys
d = sys.argv[1]
fp32 = json.load(open(os.path.join(d, "fp32", "b128_p0_s0", "summary.json")))
bf16 = json.load(open(os.path.join(d, "bf16", "b128_p0_s0", "summary.json")))
assert "precision" not in fp32 and bf16["precision"] == {"name": "bf16", "loss_scale": None, "skipped_steps": None}, bf16
assert json.load(open(os.path.join(d, "bf16", "sweep.json")))["precision"] == "bf16"
assert "precision" not in json.load(open(os.path.join(d, "fp32", "sweep.json")))
rows = list(csv.DictReader(open(os.path.join(d, "bf16", "b128_p0_s0", "metrics.csv"))))
assert rows and rows[-1]["loss_scale"] == "" and rows[-1]["skipped_steps"] == "", rows[-1]
for s in (fp32, bf16):
    assert s["status"] == "reached", s
print("bf16 beside fp32: steps to target", bf16["steps_to_target"], "against", fp32["steps_to_target"])
PY
  derive fp8.json 'c["precision"] = "fp8"'
  expect_error 2 "precision" "$bigbatch" train fp8.json --steps 1 --out fp8
  grep -q "fp8" err.txt || fail "the refusal names the value: $(cat err.txt)"
  derive fp16.json 'c["precision"] = "fp16"'
  if "$bigbatch" train fp16.json --steps 10 --out fp16 > fp16.txt 2> fp16.err; then
    $py -c "import json; p = json.load(open('fp16/e2e.train/b8_p0_s0/summary.json'))['precision']; assert p['name'] == 'fp16' and p['loss_scale'] == 65536, p; print('fp16 on the CPU:', p)"
  else
    grep -q "precision: fp16 on device cpu needs LibTorch 2.5 or later" fp16.err || fail "fp16: $(cat fp16.err)"
    echo "fp16 refused on this LibTorch: $(cat fp16.err)"
  fi
  ;;
sharded)
  # Optimizer state sharded across 2 ranks (distributed.shard, docs/distributed.md).
  # Refused: an optimizer without a sharded form, stage "gradients" with a
  # compressor, and sharding a world of one; one line each, exit 2.
  derive sgd.json 'c["distributed"] = {"shard": "states"}'
  expect_error 2 'shard "states": sgd has no sharded form' "$bigbatch" sweep sgd.json --nproc 2 --master-port $(free_port)
  derive topk.json 'c["optimizer"] = {"name": "lamb"}; c["distributed"] = {"shard": "gradients", "compression": {"name": "topk"}}'
  expect_error 2 'distributed.shard: "gradients" reduce-scatters the gradients itself' "$bigbatch" sweep topk.json --nproc 2 --master-port $(free_port)
  derive one.json 'c["optimizer"] = {"name": "lamb"}; c["distributed"] = {"shard": "states"}'
  expect_error 2 'distributed.shard: "states" shards the optimizer across the ranks' "$bigbatch" sweep one.json
  # A sweep with the shard as a dimension: 71172 parameters in 9 chunks, so
  # each rank holds part of the weights. Two ranks shard bit for bit, so the
  # three tables are the same table; and Muon, whole matrices to ranks, two
  # tables that are one.
  derive shard.json 'c["optimizer"] = {"name": "lamb", "weight_decay": 0.01}; c["model"]["widths"] = [256, 256]
c["batch_sizes"] = [64, 512]; c["seeds"] = [0]; c["search"] = {"lr": [0.01]}; c["budget"] = {"steps": 300}
c["variants"] = {"none": {}, "states": {"distributed": {"shard": "states"}}, "gradients": {"distributed": {"shard": "gradients"}},
  "muon": {"optimizer": {"name": "muon"}}, "muon_gradients": {"optimizer": {"name": "muon"}, "distributed": {"shard": "gradients"}}}'
  "$bigbatch" sweep shard.json --out runs --nproc 2 --master-port $(free_port) > sweep.txt 2> sweep.err \
    || fail "sharded sweep: $(tail -3 sweep.err)"
  $py - runs/e2e <<'PY'
import csv, glob, json, os, sys
d = sys.argv[1]
tables = {v: list(csv.DictReader(open(os.path.join(d, v, "steps_to_target.csv")))) for v in ("none", "states", "gradients")}
keys = ("batch_size", "steps", "examples", "best_lr", "reached")
rows = {v: [tuple(r[k] for k in keys) for r in t] for v, t in tables.items()}
assert len(rows["none"]) == 2 and all(r[4] == "1" for r in rows["none"]), rows["none"]
assert rows["states"] == rows["none"] and rows["gradients"] == rows["none"], rows
muon = {v: [tuple(r[k] for k in keys) for r in csv.DictReader(open(os.path.join(d, v, "steps_to_target.csv")))]
        for v in ("muon", "muon_gradients")}
assert len(muon["muon"]) == 2 and muon["muon_gradients"] == muon["muon"], muon
for v in ("none", "states", "gradients"):
    for s in glob.glob(os.path.join(d, v, "*", "summary.json")):
        summary = json.load(open(s))
        if v == "none":
            assert "shard" not in summary, s
            continue
        shard = summary["shard"]
        assert shard["stage"] == v and shard["ranks"] == 2, shard
        # LAMB keeps 8 bytes per parameter; the ranks share them.
        assert sum(shard["state_bytes"]) == 8 * 71172 and min(shard["state_bytes"]) > 0, shard
        assert all(b > 0 for b in shard["peak_rss_bytes"]), shard
        steps = shard["step_bytes"]
        if v == "states":
            assert steps["all_reduce"] > 0 and steps["reduce_scatter"] == 0 and steps["all_gather"] > 0, steps
        else:
            assert steps["all_reduce"] == 0 and steps["reduce_scatter"] > 0 and steps["all_gather"] > 0, steps
print("shard none, states, gradients: the same table;", rows["none"], "; muon:", muon["muon"])
PY
  # Their TensorBoard layer scalars are gathered from every rank's shard (a
  # rank steps only its own tensors): LAMB's trust ratios and Muon's update
  # RMS, the unsharded trials' (two ranks step alike bit for bit).
  [ -d "$src/.pydeps/tensorboard" ] || fail "no tensorboard package in $src/.pydeps: run scripts/setup.sh"
  PYTHONPATH="$src/.pydeps:$src/tests/experiments" $py - runs/e2e <<'PY'
import os, sys
from tensorboard_read import scalars_of
d = sys.argv[1]
def layer(variant):
    runs = sorted(t for t in os.listdir(os.path.join(d, variant))
                  if os.path.isfile(os.path.join(d, variant, t, "metrics.csv")))
    return {t: {tag: v for tag, v in scalars_of(os.path.join(d, variant, t)).items()
                if tag.startswith(("trust_ratio/", "muon_update_rms/"))} for t in runs}
for plain, sharded, tag in (("none", "states", "trust_ratio/"), ("none", "gradients", "trust_ratio/"),
                            ("muon", "muon_gradients", "muon_update_rms/")):
    a, b = layer(plain), layer(sharded)
    assert a and a == b, (plain, sharded, a, b)
    assert all(any(t.startswith(tag) for t in s) for s in b.values()), (sharded, tag, b)
print("sharded trials' layer scalars: the unsharded ones")
PY
  # A sharded trial killed after a checkpoint (every rank's shard in rank 0's
  # file) continues from it and ends with the metrics of an uninterrupted run.
  # The kill lands once the first checkpoint (step 200) is seen, polled every
  # 0.1 s, with 800 steps to go (some 7 s here).
  derive long.json 'c["optimizer"] = {"name": "lamb", "weight_decay": 0.01}; c["model"]["widths"] = [256, 256]
c["distributed"] = {"shard": "gradients"}; c["budget"] = {"steps": 1000}; c["checkpoint_every"] = 200
c["batch_sizes"] = [64]; c["target"] = {"metric": "val_loss", "threshold": 1e-9, "eval_every": 100}'
  trial=e2e.train/b64_p0_s0
  "$bigbatch" train long.json --out reference --nproc 2 --master-port $(free_port) > /dev/null 2>&1
  "$bigbatch" train long.json --out runs --nproc 2 --master-port $(free_port) > /dev/null 2>&1 &
  launcher=$!
  for _ in $(seq 600); do [ -e runs/$trial/checkpoint.pt ] && break; sleep 0.1; done
  pkill -KILL -n -P $launcher || fail "the trial ended before a rank was killed"
  wait $launcher || true
  [ -e runs/$trial/checkpoint.pt ] || fail "no checkpoint to resume from"
  "$bigbatch" train long.json --out runs --nproc 2 --master-port $(free_port) > long.txt 2> long.err
  grep -q "resuming b64_p0_s0 from its checkpoint at step [1-9]" long.err || fail "not resumed: $(head -3 long.err)"
  cmp <(cut -d, -f1-8,10 reference/$trial/metrics.csv) <(cut -d, -f1-8,10 runs/$trial/metrics.csv) \
    || fail "the resumed sharded trial's metrics differ"
  echo "sharded resume ok"
  ;;
*) fail "unknown scenario $scenario" ;;
esac
echo "PASS $scenario"
