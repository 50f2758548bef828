#!/usr/bin/env bash
# Builds and runs tests/consumer in one mode: package (install this build to a
# temporary prefix, then find_package) or subdirectory (add_subdirectory).
# Usage: run.sh MODE SOURCE_DIR BUILD_DIR
set -euo pipefail
mode=$1 src=$2 build=$3
work="$build/consumer-$mode"
rm -rf "$work"
# A core ledger of its own (experiments/cluster/cores.h): a sweep the user runs beside
# the suite would otherwise hold this machine's cores and refuse the example's.
export BIGBATCH_CORE_LEDGER="$work/.cores"
args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DBIGBATCH_SOURCE_DIR="$src" -DBIGBATCH_CONSUMER_MODE="$mode")
if command -v ccache >/dev/null; then args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
# The consumer finds the LibTorch this build used (Debian's, or a --torch wheel's).
torch_dir=$(sed -n 's/^Torch_DIR:[A-Z]*=//p' "$build/CMakeCache.txt")
if [ -n "$torch_dir" ]; then args+=(-DTorch_DIR="$torch_dir"); fi
if [ "$mode" = package ]; then
  cmake --install "$build" --prefix "$work/prefix" >/dev/null
  args+=(-DCMAKE_PREFIX_PATH="$work/prefix" -DBIGBATCH_PUBLIC_HEADERS_DIR="$work/prefix/include/bigbatch")
else  # the build tree's links to the public headers (CMakeLists.txt, BIGBATCH_INCLUDE_ROOT)
  args+=(-DBIGBATCH_PUBLIC_HEADERS_DIR="$work/build/bigbatch/public-include/bigbatch")
fi
cmake -S "$src/tests/consumer" -B "$work/build" "${args[@]}" >/dev/null
# Every public header compiles alone in a consumer, and only those are
# reachable (tests/consumer/CMakeLists.txt).
cmake --build "$work/build" --target include_public >/dev/null
IFS=';' read -r -a internal < "$work/build/include_internal_targets.txt"
for target in "${internal[@]}"; do
  if out=$(cmake --build "$work/build" --target "$target" 2>&1); then
    echo "an internal header is reachable by a consumer: $target" >&2
    exit 1
  fi
  grep -q "No such file or directory" <<<"$out" || { echo "$target failed for another reason:" >&2; echo "$out" >&2; exit 1; }
done
echo "internal headers unreachable: ${#internal[@]}"
cmake --build "$work/build" --parallel 2 --target readme_example
"$work/build/readme_example"
if [ "$mode" = package ]; then  # the docs' examples, once is enough
  cmake --build "$work/build" --parallel 2 --target docs_examples
  "$work/build/docs_examples"
fi
# The example workload, built against this mode's bigbatch::experiments: its
# sweep and cbs end to end (the plots once), each with a table to show.
cmake --build "$work/build" --parallel 2 --target waves >/dev/null
example="$src/examples/sequence_workload"
runs="$work/runs"
"$work/build/sequence_workload/waves" sweep "$example/sweep.json" --out "$runs" --jobs 2 >/dev/null 2>"$work/sweep.log" ||
  { cat "$work/sweep.log" >&2; exit 1; }
grep -q "^512," "$runs/waves/steps_to_target.csv" || { echo "example sweep: no table" >&2; exit 1; }
"$work/build/sequence_workload/waves" cbs "$example/cbs.json" --out "$runs" --jobs 2 >/dev/null 2>"$work/cbs.log" ||
  { cat "$work/cbs.log" >&2; exit 1; }
test -s "$runs/waves_cbs/cbs.csv" || { echo "example cbs: no cbs.csv" >&2; exit 1; }
if [ "$mode" = package ]; then  # the plots, and a data-parallel trial (--nproc runs argv[0] again)
  "$work/build/sequence_workload/waves" plot "$runs/waves" >/dev/null
  test -s "$runs/waves/plots/steps_to_target.png" || { echo "example plot: no steps_to_target.png" >&2; exit 1; }
  "$work/build/sequence_workload/waves" train "$example/sweep.json" --out "$runs" --nproc 2 --steps 20 \
    2>/dev/null | grep -q "data-parallel over 2 ranks" || { echo "example: no data-parallel trial" >&2; exit 1; }
fi
echo "example workload: sweep, cbs$([ "$mode" = package ] && echo ", plot, data-parallel") ran"
