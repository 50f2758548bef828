#!/usr/bin/env bash
# Runs a sweep config and plots it, for the scripts that set up and run one
# (main.sh, lm.sh). Usage: scripts/sweep_and_plot.sh CONFIG [SWEEP ARGS...]
# The arguments go to `bigbatch sweep`; without --jobs it gets one job per
# core (each trial has the config's runner.threads_per_trial threads).
set -euo pipefail
cd "$(dirname "$0")/.."
config=$1
shift
name=$(/usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["name"])' "$config")
out=runs
jobs=(--jobs "$(nproc)")
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  case ${args[i]} in
    --out) out=${args[i + 1]:-runs} ;;
    --jobs) jobs=() ;;
  esac
done
build/experiments/bigbatch sweep "$config" "${jobs[@]}" "$@"
build/experiments/bigbatch plot "$out/$name"
echo "the $name sweep is in $out/$name/, its plots in $out/$name/plots/"
