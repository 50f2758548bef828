#!/usr/bin/env bash
# Counts the reading walks of docs/architecture.md on the code as it is:
#   lamb    one LAMB step (LAMB::step, CPU tensors, fused) down to the element math
#   cuda    the same step on the CUDA runner, its device code on the SIMT executor
#   sweep   one trial of `bigbatch sweep` (Fashion-MNIST, LAMB), from main to its files
# A Debug build (./build-walk: -O0 -g, the kernels too) runs each under gdb
# with a breakpoint at every function of the repository (scripts/walk/record.py);
# the first entry into each function, with the repository frames of its
# stack, makes a call tree, which scripts/walk/analyze.py reads depth first
# as a reader would: each function once, back to the caller after each.
# Printed per walk: functions, files, hops (a move from one file to another),
# returns (a hop into a file visited before), the files entered most.
# Needs gdb and lizard (PyPI; installed into ./.walkdeps).
# Usage: scripts/walk.sh [lamb|cuda|sweep|all] [-v|-t]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
which=${1:-all}
detail=${2:-}
case $which in lamb | cuda | sweep | all) ;; *) echo "walk.sh: unknown walk '$which'" >&2; exit 2 ;; esac
command -v gdb > /dev/null || { echo "walk.sh: needs gdb (apt-get install gdb)" >&2; exit 2; }
if [ ! -d .walkdeps/lizard ]; then
  /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --target .walkdeps lizard==1.24.3
fi
export WALK_LIZARD=$root/.walkdeps WALK_REPO=$root
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.ccache}" CCACHE_BASEDIR="$root"
build=build-walk
export WALK_BUILD=$root/$build
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DBIGBATCH_BUILD_BENCHMARKS=OFF > /dev/null
cmake --build "$build" --parallel 2 --target bigbatch_cli bigbatch-fmnist-lamb simt_optimizers_tests > /dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
lamb_step='(LAMB::step|LayerwiseOptimizer<bigbatch::optim::LAMBOptions.*::step)\('

# record OUT PROGRAM ARGS...: the first entries of a program's run, as JSON.
record() {
  local out=$1
  shift
  (cd "$work" && WALK_OUT=$out gdb -q -batch -nx -ex "set pagination off" -ex "set confirm off" \
    -ex "source $root/scripts/walk/record.py" -ex starti -ex "python arm()" -ex "python run_to_exit()" \
    --args "$@" > "$out.log" 2>&1)
}
analyze() {
  echo "== $1"
  shift
  /usr/bin/python3 scripts/walk/analyze.py "$root" "$@" $detail
}

if [ "$which" = lamb ] || [ "$which" = all ]; then
  record "$work/lamb.json" "$root/$build/experiments/bigbatch-fmnist-lamb" --epochs 1 --batch-size 27500
  analyze "one LAMB step (CPU runner)" "$work/lamb.json" "$lamb_step"
fi
if [ "$which" = cuda ] || [ "$which" = all ]; then
  # The executor stands in for the CUDA runtime: its own files are not read.
  ASAN_OPTIONS=detect_leaks=0 WALK_SKIP='/kernels/simt/' record "$work/cuda.json" \
    "$root/$build/tests/simt_optimizers_tests" '--gtest_filter=*MatchesFloat64ReferenceInFp32_CUDA/LAMB_defaults'
  analyze "one LAMB step (CUDA runner)" "$work/cuda.json" "$lamb_step" --device
fi
if [ "$which" = sweep ] || [ "$which" = all ]; then
  cat > "$work/walk.json" << 'EOF'
{"name": "walk", "dataset": {"name": "fashion_mnist"}, "model": {"type": "mlp", "widths": [256, 256]},
 "optimizer": {"name": "lamb", "weight_decay": 0.01}, "schedule": {"base_batch": 256, "scaling": "sqrt"},
 "target": {"metric": "val_error", "threshold": 0.16, "eval_every": 10}, "budget": {"steps": 20},
 "gns": {"micro_batches": 2, "beta": 0.99}, "batch_sizes": [256], "search": {"lr": [0.01]}, "seeds": [0]}
EOF
  record "$work/sweep.json" "$root/$build/experiments/bigbatch" sweep "$work/walk.json" --out "$work/runs"
  # A sweep that stopped early (no free core, no data) would count a shorter
  # walk without a word: its tables are the proof it ran to the end.
  [ -f "$work/runs/walk/steps_to_target.csv" ] ||
    { echo "walk.sh: the sweep did not run to its tables; its walk is not the one described" >&2; exit 1; }
  analyze "one trial of bigbatch sweep" "$work/sweep.json" '^main'
fi
