#!/usr/bin/env bash
# Installs the Debian packages bigbatch needs, only those missing
# (apt-get install -y, with sudo when not root). Idempotent.
set -euo pipefail

# libopenblas0-openmp: Debian's LibTorch calls the system BLAS, which is the
# slow reference one until an optimized one is installed (15x on the MLPs here);
# the OpenMP build follows each thread's OpenMP setting, as ATen does.
# libboost-context-dev: the fibers of the SIMT executor (kernels/simt) the tests run the CUDA kernels on.
# libopencv-imgcodecs-dev, libopencv-imgproc-dev: the image-folder workload's
# JPEG (through libjpeg-turbo) and PNG decoding and its resizing, the two
# OpenCV parts alone (docs/workloads.md "Image workloads" says why).
# sentencepiece: the programs (spm_train, spm_encode, ...) of the text
# dataset's BPE tokenizer; bible-kjv (with bible-kjv-text): the King James
# Bible the language-model quickstart trains on (scripts/kjv.sh).
# slurm-wlm, munge, iproute2: the real Slurm (22.05) and its authentication
# daemon the cluster tests start (scripts/slurm_cluster.sh; ss picks its ports).
# python3-torch: PyTorch 1.13's torch.optim, the other side of the
# torch.optim cross-check test; python3-pip fetches the --torch wheels.
packages=(build-essential cmake ninja-build ccache git
          libtorch-dev libgloo-dev libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev
          libopenblas0-openmp python3-matplotlib python3-torch python3-pip libboost-context-dev
          zlib1g-dev dataset-fashion-mnist libopencv-imgcodecs-dev libopencv-imgproc-dev
          sentencepiece bible-kjv slurm-wlm munge iproute2)
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
