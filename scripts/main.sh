#!/usr/bin/env bash
# The main job: set up, build, run the quickstart sweep (batch size against
# steps to target on the embedded Fashion-MNIST) and plot it.
# Extra arguments go to `bigbatch sweep` (e.g. --out DIR, --jobs N).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
out=runs
jobs=(--jobs "$(nproc)")
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  case ${args[i]} in
    --out) out=${args[i + 1]:-runs} ;;
    --jobs) jobs=() ;;
  esac
done
build/experiments/bigbatch sweep experiments/configs/quickstart.json "${jobs[@]}" "$@"
build/experiments/bigbatch plot "$out/quickstart"
echo "main: the quickstart sweep is in $out/quickstart/, its plots in $out/quickstart/plots/"
