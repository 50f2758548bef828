#!/usr/bin/env bash
# The main job: set up what it needs, build the `bigbatch` program against
# current LibTorch (scripts/setup.sh --main), run the quickstart sweep (batch
# size against steps to target on the embedded Fashion-MNIST) and plot it.
# Extra arguments go to `bigbatch sweep` (e.g. --out DIR, --jobs N).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --main
scripts/sweep_and_plot.sh experiments/configs/quickstart.json "$@"
