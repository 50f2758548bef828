#!/usr/bin/env bash
# Benchmark, not a test: a sweep (default: the quickstart) run three ways on
# this machine, each from scratch, timed in one run of this script:
#   one worker of 2 threads per trial (runner.threads_per_trial 2, --jobs 1);
#   one process, --jobs 2 of 1 thread;
#   two worker processes of 1 thread on one sweep folder (claims.h).
# Prints the wall times, the pair's against --jobs 2, and whether the tables
# are the same. Usage: scripts/bench_workers.sh [CONFIG] (after scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-experiments/configs/quickstart.json}
bigbatch=build/experiments/bigbatch
out=$(mktemp -d /tmp/bench_workers.XXXXXX)
trap 'rm -rf "$out"' EXIT
export BIGBATCH_CORE_LEDGER=$out/.cores  # this run's workers only
name=$(/usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["name"])' "$config")
/usr/bin/python3 - "$config" "$out/threads2.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.setdefault("runner", {})["threads_per_trial"] = 2
json.dump(c, open(sys.argv[2], "w"))
PY
seconds() { date +%s.%N; }
t0=$(seconds)
"$bigbatch" sweep "$out/threads2.json" --out "$out/one" --jobs 1 > /dev/null 2>&1
t1=$(seconds)
"$bigbatch" sweep "$config" --out "$out/jobs" --jobs 2 > /dev/null 2>&1
t2=$(seconds)
"$bigbatch" sweep "$config" --out "$out/pair" --jobs 1 > "$out/a.log" 2>&1 &
a=$!
"$bigbatch" sweep "$config" --out "$out/pair" --jobs 1 > "$out/b.log" 2>&1
wait $a
t3=$(seconds)
same() { cmp -s "$out/$1/$name/steps_to_target.csv" "$out/$2/$name/steps_to_target.csv" && echo same || echo different; }
ran() { sed -n 's/^\[[0-9]*\/[0-9]*\] \(b[0-9]*_p[0-9]*_s[0-9]*\): .*/\1/p' "$out/$1.log" | wc -l; }
/usr/bin/python3 - "$t0" "$t1" "$t2" "$t3" <<PY
import sys
t0, t1, t2, t3 = map(float, sys.argv[1:])
one, jobs, pair = t1 - t0, t2 - t1, t3 - t2
print(f"$name on $(nproc) cores, $(date -u +%F)")
print(f"| run | wall time |")
print(f"|---|---:|")
print(f"| one worker, 2 threads per trial | {one:.1f} s |")
print(f"| one process, --jobs 2 of 1 thread | {jobs:.1f} s |")
print(f"| two workers of 1 thread, one folder ($(ran a) + $(ran b) trials) | {pair:.1f} s |")
print(f"pair / --jobs 2: {pair / jobs:.3f}; pair / one worker of 2 threads: {pair / one:.3f}")
PY
echo "tables: pair vs --jobs 2: $(same pair jobs); pair vs one worker of 2 threads: $(same pair one)"
