#!/usr/bin/env bash
# The main job: set up, build, then train on the embedded Fashion-MNIST with LAMB.
# Arguments go to the program (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/experiments/bigbatch-fmnist-lamb "$@"
