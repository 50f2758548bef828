#!/usr/bin/env bash
# Builds bigbatch against the LibTorch of PyPI's torch==VERSION wheel (its CPU
# libraries) in ./build-torch-VERSION and runs the whole suite there through ctest.
# Where nvcc is found (/usr/local/cuda), that build also compiles the CUDA
# kernels and, against this wheel's c10/cuda and c10d headers, the C++ that
# only a BIGBATCH_CUDA build uses (cmake/cuda_compile_check.cmake).
#
# With --cuda: configures a BIGBATCH_CUDA=ON build against the wheel's own
# CUDA TorchConfig.cmake and the CUDA toolkit (/usr/local/cuda), in
# ./build-torch-VERSION-cuda, and compiles every object that build has that
# the CPU build has not: the CUDA kernels, the dispatch point, the NCCL process
# group, the CUDA graph test and the CUDA benchmark. Nothing is linked or run
# (that needs the nvidia-* wheels' libraries and a GPU): this is the check to
# make before a GPU session, so that none of it is spent on compile errors.
# Usage: scripts/check_torch.sh [--cuda] VERSION [extra cmake arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=0
if [ "${1:-}" = --cuda ]; then cuda=1; shift; fi
version=${1:?"usage: scripts/check_torch.sh [--cuda] VERSION (e.g. 2.11.0) [cmake arguments...]"}
shift
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.ccache}"
export CCACHE_BASEDIR="$PWD"

if ((cuda)); then
  scripts/packages.sh
  /usr/bin/python3 scripts/fetch_torch.py "$version" ".torch/$version-cuda" --cuda
  build=build-torch-$version-cuda
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBIGBATCH_CUDA=ON \
    -DTorch_DIR="$PWD/.torch/$version-cuda/torch/share/cmake/Torch" "$@"
  objects=$(ninja -C "$build" -t targets all | grep -o '^[^:]*\(cuda_graph_test\|bm_cuda_optimizers\)\.cpp\.o')
  cmake --build "$build" --parallel 2 --target bigbatch_kernels_cuda bigbatch_optimizers bigbatch_distributed
  # shellcheck disable=SC2086
  ninja -C "$build" -j 2 $objects
  echo "check_torch: the BIGBATCH_CUDA=ON objects compile against torch $version's CUDA LibTorch (not linked, not run)"
  exit 0
fi

scripts/setup.sh --torch "$version" "$@"
ctest --test-dir "build-torch-$version" --output-on-failure --parallel 2 --timeout 900
