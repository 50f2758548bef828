#!/usr/bin/env bash
# The language-model quickstart: set up, build the `bigbatch` program, write the King James Bible
# corpus to data/kjv.txt (scripts/kjv.sh), run the character-level GPT sweep
# (batch size against steps to a val_loss target, a rate search per batch
# size; about 7 minutes on 2 cores) and plot it.
# Extra arguments go to `bigbatch sweep` (e.g. --out DIR, --jobs N).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/packages.sh lm
scripts/setup.sh --main
scripts/kjv.sh data/kjv.txt
scripts/sweep_and_plot.sh experiments/configs/lm_quickstart.json "$@"
