#!/usr/bin/env bash
# The main job: set up, build, run the quickstart sweep (batch size against
# steps to target on the embedded Fashion-MNIST) and plot it.
# Extra arguments go to `bigbatch sweep` (e.g. --out DIR, --jobs N).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/sweep_and_plot.sh experiments/configs/quickstart.json "$@"
