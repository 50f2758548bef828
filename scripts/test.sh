#!/usr/bin/env bash
# Sets up, builds, and runs the whole test suite through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.ccache}"
ctest --test-dir build --output-on-failure --parallel 2 --timeout 900
