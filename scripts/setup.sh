#!/usr/bin/env bash
# Installs the Debian packages bigbatch needs (only those missing), then
# configures and builds it in ./build with ccache and at most 2 compile jobs.
# Usage: scripts/setup.sh [extra cmake arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."

# libopenblas0-openmp: Debian's LibTorch calls the system BLAS, which is the
# slow reference one until an optimized one is installed (15x on the MLPs here);
# the OpenMP build follows each thread's OpenMP setting, as ATen does.
packages=(build-essential cmake ninja-build ccache git
          libtorch-dev libgloo-dev libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev
          libopenblas0-openmp python3-matplotlib
          zlib1g-dev dataset-fashion-mnist)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

export CCACHE_DIR="${CCACHE_DIR:-$HOME/.ccache}"
export CCACHE_BASEDIR="$PWD"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build --parallel 2
