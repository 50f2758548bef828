#!/usr/bin/env bash
# The quickstart sweep on current LibTorch (./build, the main build) against
# Debian's LibTorch 1.13 (./build-debian: scripts/setup.sh --main --debian)
# on this machine, one run each, one after the other: 1.13 as installed,
# 1.13 with OpenBLAS's generic kernels (OPENBLAS_CORETYPE=Prescott: what its
# OpenBLAS picks on the Sapphire Rapids Xeons it does not know), current
# LibTorch in fp32, and in bf16. Prints each run's wall time, the ratios to
# the main build's, the math check of each, and the steps-to-target tables
# side by side. docs/benchmarks.md "Current LibTorch against 1.13" has a run.
# Usage: scripts/bench_quickstart.sh [OUT]   (default: runs-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs-bench}
config=experiments/configs/quickstart.json
main=build/experiments/bigbatch debian=build-debian/experiments/bigbatch
for b in "$main" "$debian"; do
  [ -x "$b" ] || { echo "bench_quickstart: no $b (scripts/setup.sh --main, scripts/setup.sh --main --debian)" >&2; exit 2; }
done
# OUT is emptied first: only a folder this script made (its marker inside) or a new one.
if [ -e "$out" ] && [ ! -e "$out/.bench_quickstart" ]; then
  echo "bench_quickstart: $out exists and is not a folder of this script's (no $out/.bench_quickstart): choose another OUT" >&2
  exit 2
fi
rm -rf "$out"
mkdir -p "$out"
touch "$out/.bench_quickstart"
/usr/bin/python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["precision"] = "bf16"; json.dump(c, open(sys.argv[2], "w"))' \
  "$config" "$out/quickstart_bf16.json"
declare -A seconds
run() {  # run NAME BIGBATCH CONFIG [ENV...]
  local name=$1 bigbatch=$2 cfg=$3 start
  shift 3
  echo "== $name: $(env "$@" "$bigbatch" env | grep -E '^(LibTorch|BLAS|math check)' | tr '\n' ';')"
  start=$(date +%s.%N)
  env "$@" "$bigbatch" sweep "$cfg" --jobs "$(nproc)" --out "$out/$name" > "$out/$name.log" 2>&1
  seconds[$name]=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {print b - a}')
  echo "   $(grep '^sweep ' "$out/$name.log")"
}
run debian "$debian" "$config"
run debian_prescott "$debian" "$config" OPENBLAS_CORETYPE=Prescott
run main "$main" "$config"
run main_bf16 "$main" "$out/quickstart_bf16.json"
echo "== wall time, and as a multiple of the main build's (fp32)"
for name in debian debian_prescott main main_bf16; do
  awk -v n="$name" -v t="${seconds[$name]}" -v m="${seconds[main]}" 'BEGIN {printf "%-16s %7.1f s  %5.2fx\n", n, t, t / m}'
done
"$main" report "$out"/{debian,debian_prescott,main,main_bf16}/quickstart --labels debian,debian_prescott,main,main_bf16
