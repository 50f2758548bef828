#!/usr/bin/env bash
# Installs what bigbatch needs (Debian packages: scripts/packages.sh; the
# Python packages the tests read files with: scripts/pydeps.sh), then
# configures and builds it with ccache and at most 2 compile jobs.
# Usage: scripts/setup.sh [--main] [--torch VERSION | --libtorch DIR | --debian] [extra cmake arguments...]
#  Which LibTorch:
#   (default)         current LibTorch, in ./build: the one of the PyTorch >= 2
#                     that python3 imports, where there is one (linked from
#                     its site-packages into ./.torch/installed by
#                     scripts/fetch_torch.py --installed); else the one of
#                     PyPI's torch wheel pinned in scripts/torch_version (its
#                     CPU libraries, fetched once into ./.torch/VERSION)
#   --torch VERSION   the LibTorch of PyPI's torch==VERSION wheel, in ./build-torch-VERSION
#   --libtorch DIR    any other LibTorch with its own CMake package: an unpacked
#                     libtorch zip, or a CUDA machine's pip-installed torch
#                     (DIR = python -c 'import torch; print(torch.utils.cmake_prefix_path)'),
#                     in ./build-libtorch
#   --debian          Debian's LibTorch 1.13 (libtorch-dev), the test
#                     command's compatibility lane, in ./build-debian
#  What it builds:
#   (default)         everything: libraries, programs, tests, benchmarks
#   --main            the main job's part alone: only the packages it needs,
#                     and only the `bigbatch` program (no tests, no benchmarks)
set -euo pipefail
cd "$(dirname "$0")/.."

main=0
if [ "${1:-}" = --main ]; then main=1; shift; fi
torch_args=() build=build version="" source=default
case ${1:-} in
  --torch)
    version=${2:?"setup: --torch needs a version, e.g. --torch 2.15.0"}
    shift 2
    source=wheel build=build-torch-$version ;;
  --libtorch)
    dir=${2:?"setup: --libtorch needs the folder that holds LibTorch's CMake files"}
    shift 2
    [ -d "$dir" ] || { echo "setup: --libtorch: no folder '$dir'" >&2; exit 2; }
    torch_args=(-DCMAKE_PREFIX_PATH="$(cd "$dir" && pwd)")
    source=dir build=build-libtorch ;;
  --debian)
    shift
    source=debian build=build-debian ;;
esac

if ((main)); then
  scripts/packages.sh main
  # Only the program: the tests' and benchmarks' packages are not installed.
  torch_args+=(-DBIGBATCH_BUILD_TESTS=OFF -DBIGBATCH_BUILD_BENCHMARKS=OFF -DBIGBATCH_SIMT_TESTS=OFF)
else
  scripts/packages.sh
  scripts/pydeps.sh
  torch_args+=(-DBIGBATCH_BUILD_TESTS=ON -DBIGBATCH_BUILD_BENCHMARKS=ON)
fi

if [ "$source" = default ]; then
  # The user's own PyTorch 2.x when python3 has one (fetch_torch.py says why
  # it will not take one, exit 3); else the pinned wheel.
  if command -v python3 >/dev/null && python3 -c 'import torch' 2>/dev/null &&
     /usr/bin/python3 scripts/fetch_torch.py --installed .torch/installed "$(command -v python3)"; then
    torch_args+=(-DTorch_DIR="$PWD/.torch/installed/cmake")
  else
    version=$(cat scripts/torch_version)
    source=wheel
  fi
fi
if [ "$source" = wheel ]; then
  # Debian's python3 (its pip), not a pyenv or venv one that PATH may list first.
  /usr/bin/python3 scripts/fetch_torch.py "$version" ".torch/$version"
  torch_args+=(-DTorch_DIR="$PWD/.torch/$version/cmake")
elif [ "$source" = debian ]; then
  torch_args+=(-DTorch_DIR="$(dirname "$(dpkg -L libtorch-dev | grep -m1 '/TorchConfig.cmake$')")")
fi

# A build folder configured against another LibTorch (./build before the
# main build moved from Debian's 1.13) is configured anew: its cache names
# the other one's libraries.
for arg in "${torch_args[@]}"; do
  case $arg in -DTorch_DIR=*)
    old=$(sed -n 's/^Torch_DIR:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
    if [ -n "$old" ] && [ "$old" != "${arg#-DTorch_DIR=}" ]; then
      echo "setup: $build was configured against the LibTorch in $old: configuring it anew"
      rm -f "$build/CMakeCache.txt"
    fi ;;
  esac
done

export CCACHE_DIR="${CCACHE_DIR:-$HOME/.ccache}"
export CCACHE_BASEDIR="$PWD"
# What ccache needs to cache files compiled with a precompiled header
# (compat/precompiled.h).
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${torch_args[@]}" "$@"
if ((main)); then
  cmake --build "$build" --parallel 2 --target bigbatch_cli
else
  cmake --build "$build" --parallel 2
fi
