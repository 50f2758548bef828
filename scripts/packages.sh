#!/usr/bin/env bash
# Installs the Debian packages bigbatch needs, only those missing
# (apt-get install -y, with sudo when not root). Idempotent.
# Usage: scripts/packages.sh [main | lm]
#   main   only what the main job needs: build the `bigbatch` program against
#          the LibTorch of PyPI's torch wheel and plot the quickstart sweep
#   lm     the main job's, and the King James Bible the language-model
#          quickstart trains on (scripts/lm.sh)
#   (none) everything the test suite needs too
set -euo pipefail

# The main job's: the compilers and build tools; python3-pip fetches the
# torch wheel whose LibTorch the program is built against (scripts/fetch_torch.py);
# libgloo-dev: the Gloo headers c10d's ProcessGroupGloo.hpp includes, which
# the wheel does not ship; nlohmann-json3-dev, libcli11-dev, zlib1g-dev: the
# runner's JSON, command line and IDX files; dataset-fashion-mnist: the
# quickstart's data; python3-matplotlib: the plots;
# libopencv-imgcodecs-dev, libopencv-imgproc-dev: the image-folder workload's
# JPEG (through libjpeg-turbo) and PNG decoding and its resizing, the two
# OpenCV parts alone (docs/workloads.md "Image workloads" says why), so that
# the program the main job builds is the whole program.
main=(build-essential cmake ninja-build ccache git python3-pip
      libgloo-dev nlohmann-json3-dev libcli11-dev zlib1g-dev
      dataset-fashion-mnist python3-matplotlib libopencv-imgcodecs-dev libopencv-imgproc-dev)
# The test suite's, beyond those:
# libtorch-dev, python3-torch, libopenblas0-openmp: Debian's LibTorch 1.13,
# the compatibility lane (scripts/test.sh), and PyTorch 1.13's torch.optim,
# the other side of the torch.optim cross-check test (its Adam and SGD are
# the same math in every version); Debian's LibTorch calls the system BLAS,
# which is the slow reference one until an optimized one is installed (15x
# on the MLPs here); the OpenMP build follows each thread's OpenMP setting,
# as ATen does.
# libgtest-dev, libgmock-dev, libbenchmark-dev: the tests and benchmarks.
# libboost-context-dev: the fibers of the SIMT executor (kernels/simt) the tests run the CUDA kernels on.
# sentencepiece: the programs (spm_train, spm_encode, ...) of the text
# dataset's BPE tokenizer; bible-kjv (with bible-kjv-text): the King James
# Bible the language-model quickstart trains on (scripts/kjv.sh).
# slurm-wlm, munge, iproute2: the real Slurm (22.05) and its authentication
# daemon the cluster tests start (scripts/slurm_cluster.sh; ss picks its ports).
# python3-venv: the Python package's environment (scripts/pyenv.sh).
tests=(libtorch-dev python3-torch libopenblas0-openmp libgtest-dev libgmock-dev libbenchmark-dev
       libboost-context-dev sentencepiece bible-kjv slurm-wlm munge iproute2 python3-venv)

packages=("${main[@]}")
case ${1:-} in
  main) ;;
  lm) packages+=(bible-kjv) ;;
  "") packages+=("${tests[@]}") ;;
  *) echo "packages: unknown set '$1' (main, lm, or nothing for all)" >&2; exit 2 ;;
esac
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "packages: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
