#!/usr/bin/env bash
# Installs the Debian packages bigbatch needs (scripts/packages.sh), then
# configures and builds it with ccache and at most 2 compile jobs.
# Usage: scripts/setup.sh [--torch VERSION | --libtorch DIR] [extra cmake arguments...]
#   (default)         Debian's LibTorch 1.13, in ./build
#   --torch VERSION   the LibTorch of PyPI's torch==VERSION wheel (its CPU
#                     libraries, fetched once into ./.torch/VERSION by
#                     scripts/fetch_torch.py), in ./build-torch-VERSION
#   --libtorch DIR    any other LibTorch with its own CMake package: an unpacked
#                     libtorch zip, or a CUDA machine's pip-installed torch
#                     (DIR = python -c 'import torch; print(torch.utils.cmake_prefix_path)'),
#                     in ./build-libtorch
set -euo pipefail
cd "$(dirname "$0")/.."

torch_args=() build=build
case ${1:-} in
  --torch)
    version=${2:?"setup: --torch needs a version, e.g. --torch 2.15.0"}
    shift 2
    build=build-torch-$version ;;
  --libtorch)
    dir=${2:?"setup: --libtorch needs the folder that holds LibTorch's CMake files"}
    shift 2
    [ -d "$dir" ] || { echo "setup: --libtorch: no folder '$dir'" >&2; exit 2; }
    torch_args=(-DCMAKE_PREFIX_PATH="$(cd "$dir" && pwd)")
    build=build-libtorch ;;
esac

scripts/packages.sh
scripts/pydeps.sh

if [ -n "${version:-}" ]; then
  # Debian's python3 (its pip), not a pyenv or venv one that PATH may list first.
  /usr/bin/python3 scripts/fetch_torch.py "$version" ".torch/$version"
  torch_args=(-DTorch_DIR="$PWD/.torch/$version/cmake")
fi

export CCACHE_DIR="${CCACHE_DIR:-$HOME/.ccache}"
export CCACHE_BASEDIR="$PWD"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${torch_args[@]}" "$@"
cmake --build "$build" --parallel 2
