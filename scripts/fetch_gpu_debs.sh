#!/usr/bin/env bash
# Run here (Debian 12, network): downloads into ./.debs (git-ignored) the
# Debian packages the GPU machine lacks and scripts/gpu.sh unpacks there:
# GoogleTest, Google Benchmark, nlohmann/json, CLI11, zlib headers, Gloo's
# headers (c10d's ProcessGroupGloo.hpp needs them; PyPI's wheels lack them), ninja and
# the embedded Fashion-MNIST, and the King James Bible with its program (the
# language-model corpus, scripts/kjv.sh), and SentencePiece's spm_train with
# its library (the LM tests train a tokenizer). Idempotent. Into
# ./.debs/wheels: the Python package's build backend and pytest (pure-Python
# wheels, with what they need on Pythons before 3.11), which gpu.sh's python
# stage installs there offline.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .debs
cd .debs
packages=(libgtest-dev libgmock-dev googletest libbenchmark-dev libbenchmark1debian
          nlohmann-json3-dev libcli11-dev zlib1g-dev ninja-build dataset-fashion-mnist
          bible-kjv bible-kjv-text libgloo-dev sentencepiece libsentencepiece0)
for p in "${packages[@]}"; do
  ls "${p}"_*.deb >/dev/null 2>&1 || apt-get download "$p"
done
ls -1 *.deb
if [ ! -e wheels/.complete ]; then
  /usr/bin/python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: -d wheels \
    scikit-build-core==0.11.6 pytest==8.4.2
  # What they need on a Python before 3.11, as pure-Python wheels (any Python there).
  /usr/bin/python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: -d wheels --no-deps \
    --platform any --python-version 3.9 --implementation py --abi none tomli exceptiongroup typing-extensions
  touch wheels/.complete
fi
ls -1 wheels
