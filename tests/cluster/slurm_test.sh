#!/usr/bin/env bash
# Sweeps on a real Slurm: Debian's slurm-wlm 22.05 and munge, started for
# this test by scripts/slurm_cluster.sh (a localhost node of 2 CPUs) and
# stopped by it at the end, whatever happens. One ctest entry, which runs
# beside others: its kills and signals land on stopped workers.
#   1. a job array of 3 workers completes a sweep whose table is the one a
#      single process writes;
#   2. a worker killed (SIGKILL) mid-trial: its trial is finished once, by
#      another worker, from its checkpoint;
#   3. a worker sent the preemption signal checkpoints, gives its trial back
#      and exits 75; with --requeue its task comes back by itself and the
#      trial resumes from that checkpoint, each step recorded once;
#   4. `srun -n 2 bigbatch train` is the 2-rank Gloo run of `--nproc 2`;
#   5. bigbatch slurm without sbatch, with an unknown partition, with
#      --workers 0: one line, exit 2, nothing submitted.
# Usage: slurm_test.sh BIGBATCH SOURCE_DIR WORK_DIR
set -euo pipefail
bigbatch=$1 src=$2 work=$3
fail() { echo "FAIL: $*" >&2; exit 1; }
if [ "$(id -u)" -ne 0 ] || ! command -v slurmctld > /dev/null || ! command -v munged > /dev/null; then
  echo "SKIP: needs root and Debian's slurm-wlm and munge (scripts/packages.sh installs them)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work" && cd "$work"
export BIGBATCH_CORE_LEDGER=$work/.cores
# The cluster's folder must be reachable by the munge user: not under /root.
cluster=$(mktemp -d /tmp/bigbatch-slurm.XXXXXX)
chmod 755 "$cluster"
stop_cluster() {
  "$src"/scripts/slurm_cluster.sh stop "$cluster" > /dev/null || true
  rm -rf "$cluster"
}
trap stop_cluster EXIT
"$src"/scripts/slurm_cluster.sh start "$cluster"
# shellcheck disable=SC1091
source "$cluster/env"
config=$src/tests/cluster/slurm_sweep.json
trials="b64_p0_s0 b64_p1_s0 b256_p0_s0 b256_p1_s0"

# wait_job ID [SECONDS]: until squeue lists nothing of the job.
wait_job() {
  local limit=$((${2:-240} * 5))
  for _ in $(seq "$limit"); do
    [ -z "$(squeue -h -j "$1" 2> /dev/null)" ] && return 0
    sleep 0.2
  done
  fail "job $1 still queued after ${2:-240} s: $(squeue -j "$1")"
}
# submit ARGS...: bigbatch slurm's job id.
submit() {
  local out
  out=$("$bigbatch" slurm "$config" "$@") || fail "bigbatch slurm $*: exit $?"
  echo "$out" >&2
  echo "$out" | sed -n 's/^submitted job \([0-9]*\):.*/\1/p'
}
# once DIR: each trial committed exactly once (one "done" claim slot), the
# table of one process, and each trial's metrics as one process's (wall time
# aside), each evaluation once.
once() {
  local d=$1/cluster t
  cmp ref/cluster/steps_to_target.csv "$d/steps_to_target.csv" || fail "$1: the table differs from one process's"
  for t in $trials; do
    [ "$(grep -l '^done ' "$d"/claims/"$t".* | wc -l)" -eq 1 ] || fail "$1: $t committed $(grep -l '^done ' "$d"/claims/"$t".* | wc -l) times"
    cmp <(cut -d, -f1-8,10 ref/cluster/$t/metrics.csv) <(cut -d, -f1-8,10 "$d/$t/metrics.csv") \
      || fail "$1: $t's metrics differ from one process's"
  done
}
# held_by DIR: "TRIAL PID" of a trial whose checkpoint is written and whose
# claim a live worker holds, once there is one. The worker is stopped
# (SIGSTOP) where it is, and found still holding the trial unfinished, so
# that the trial cannot end before the test's signal reaches it, however
# fast this machine runs it: the caller kills it, or continues it.
held_by() {
  local t slot pid
  for _ in $(seq 600); do
    for t in $trials; do
      [ -e "$1/cluster/$t/checkpoint.pt" ] || continue
      slot=$(ls "$1/cluster/claims/$t".* 2> /dev/null | sort -t. -k2 -n | tail -1)
      [ -n "$slot" ] && grep -q '^run ' "$slot" || continue
      pid=$(cut -d: -f2 "$slot")
      kill -STOP "$pid" 2> /dev/null || continue
      if [ "$(ls "$1/cluster/claims/$t".* 2> /dev/null | sort -t. -k2 -n | tail -1)" = "$slot" ] &&
         [ ! -e "$1/cluster/$t/summary.json" ]; then
        echo "$t $pid"
        return 0
      fi
      kill -CONT "$pid"
    done
    sleep 0.1
  done
  fail "no trial of $1 wrote a checkpoint"
}
# usr1_pending PID: a SIGUSR1 waits at the (stopped) process PID: bit 10 of
# its pending signals, the thread's or the process's.
usr1_pending() {
  local mask
  for mask in $(sed -n 's/^\(SigPnd\|ShdPnd\):[[:space:]]*//p' "/proc/$1/status" 2> /dev/null); do
    (( 0x$mask & 0x200 )) && return 0
  done
  return 1
}

"$bigbatch" sweep "$config" --out ref > /dev/null 2>&1
echo "reference: $(tail -n +2 ref/cluster/steps_to_target.csv | cut -d, -f1,2 | tr '\n' ' ')"

# 1. A job array of 3 workers (at most 2 run at once on 2 CPUs).
id=$(submit --out array --workers 3 --lease 4)
wait_job "$id"
once array
[ "$(ls array/cluster/slurm/"${id}"_*.out | wc -l)" -eq 3 ] || fail "want 3 worker logs: $(ls array/cluster/slurm)"
for f in array/cluster/slurm/"${id}"_*.out; do
  grep -q "^sweep cluster: 4 trials" "$f" || fail "$f: the worker did not end its sweep: $(tail -3 "$f")"
done
echo "1. job array of 3 workers: one table, each trial once ($(grep -ch '^\[[0-9]*/[0-9]*\] b' array/cluster/slurm/"${id}"_*.out | tr '\n' ' ')trials per worker)"

# 2. A worker killed outright mid-trial: its batch shell and worker get
# SIGKILL (scancel --batch sends it to the shell's process group); another
# worker takes the trial over and finishes it from its checkpoint.
id=$(submit --out kill --workers 2 --lease 4)
read -r trial pid < <(held_by kill)
task=$(grep -l "^bigbatch worker: pid $pid\$" kill/cluster/slurm/"${id}"_*.out | sed 's/.*_\([0-9]*\)\.out$/\1/')
[ -n "$task" ] || fail "no worker log names pid $pid"
scancel --batch --signal=KILL "${id}_${task}"
wait_job "$id"
once kill
grep -q "taking over trial $trial from worker [^ ]*:$pid:" kill/cluster/slurm/"${id}"_*.out \
  || fail "no worker took $trial over: $(cat kill/cluster/slurm/"${id}"_*.out)"
grep -h "taking over" kill/cluster/slurm/"${id}"_*.out
grep -hq "resuming $trial from its checkpoint at step [1-9]" kill/cluster/slurm/"${id}"_*.out \
  || fail "$trial did not resume from its checkpoint"
echo "2. worker $task killed in $trial: finished once, by the other, from its checkpoint"

# 3. Preemption: the signal Slurm sends ahead of the time limit
# (--signal=B:USR1, here sent at once); with --requeue the task comes back.
id=$(submit --out preempt --workers 1 --lease 4 --requeue)
read -r trial pid < <(held_by preempt)
scancel --batch --signal=USR1 "$id"
# The batch shell passes the signal on to its stopped worker, which then goes on.
for _ in $(seq 600); do usr1_pending "$pid" && break; sleep 0.1; done
usr1_pending "$pid" || fail "the batch shell did not pass USR1 on to worker $pid"
kill -CONT "$pid"
log=preempt/cluster/slurm/${id}_0.out
for _ in $(seq 600); do grep -q "requeued" "$log" 2> /dev/null && break; sleep 0.1; done
grep -q "^bigbatch: stopped by SIGUSR1: 1 running trial(s) given back, checkpointed unless batched" "$log" \
  || fail "the worker did not stop cleanly: $(cat "$log")"
grep -q "^bigbatch worker: requeued" "$log" || fail "the task did not requeue: $(cat "$log")"
# Slurm holds a requeued job for about two minutes (its begin time) before it
# may start again; the test moves that to now rather than wait.
for _ in $(seq 100); do scontrol update JobId="$id" StartTime=now 2> /dev/null && break; sleep 0.1; done
wait_job "$id" 400
once preempt
step=$(sed -n "s/^resuming $trial from its checkpoint at step \([0-9]*\)$/\1/p" "$log")
[ -n "$step" ] || fail "the requeued task did not resume $trial from its checkpoint: $(cat "$log")"
echo "3. preempted in $trial: checkpointed, given back, exit 75, requeued, resumed at step $step"

# 4. srun's tasks as ranks: the 2-rank Gloo run of --nproc 2, bit for bit.
e2e=$src/tests/experiments/e2e_sweep.json
"$bigbatch" train "$e2e" --batch-size 512 --lr 0.03 --steps 40 --out nproc --nproc 2 > nproc.txt 2>&1 \
  || fail "--nproc 2: $(tail -3 nproc.txt)"
srun -n 2 --cpus-per-task=1 "$bigbatch" train "$e2e" --batch-size 512 --lr 0.03 --steps 40 --out srun \
  > srun.txt 2>&1 || fail "srun -n 2: $(tail -5 srun.txt)"
grep -q "data-parallel over 2 ranks" srun.txt || fail "srun's tasks did not form a group: $(cat srun.txt)"
cmp <(cut -d, -f1-8,10-12 nproc/e2e.train/b512_p0_s0/metrics.csv) <(cut -d, -f1-8,10-12 srun/e2e.train/b512_p0_s0/metrics.csv) \
  || fail "srun -n 2 differs from --nproc 2"
echo "4. srun -n 2 bigbatch train: the metrics of --nproc 2"

# 5. Bad input: one line, exit 2, nothing submitted.
expect_error() {
  local want=$1 part=$2 rc=0
  shift 2
  "$@" > out.txt 2> err.txt || rc=$?
  [ "$rc" -eq "$want" ] || fail "$* exited $rc, want $want: $(cat err.txt)"
  grep -qF -- "$part" err.txt || fail "$* said '$(cat err.txt)', want '$part'"
  [ "$(wc -l < err.txt)" -eq 1 ] || fail "$* printed more than one line: $(cat err.txt)"
  echo "ok: exit $rc: $(cat err.txt)"
}
expect_error 2 "sbatch: not found on PATH" env PATH=/nonexistent "$bigbatch" slurm "$config" --out bad
expect_error 2 "sbatch refused the job (exit 1): sbatch: error: invalid partition specified: nosuch" \
  "$bigbatch" slurm "$config" --out bad --partition nosuch
grep -q "nothing submitted" err.txt || fail "the refusal does not say nothing was submitted"
expect_error 2 "--workers: must be >= 1, got 0" "$bigbatch" slurm "$config" --out bad --workers 0
[ -z "$(squeue -h)" ] || fail "something was submitted: $(squeue)"
[ -z "$(ls bad/cluster/slurm 2> /dev/null)" ] || fail "a refused submission left a script: $(ls bad/cluster/slurm)"
echo "PASS slurm"
