#!/usr/bin/env bash
# Makes ./.pyenv, the Python environment the Python package is built and
# tested in: a venv of Debian's python3 with PyPI's torch pinned in
# scripts/torch_version (its CUDA libraries come as its dependencies: PyPI has
# no CPU-only torch wheel), the build backend (scikit-build-core), pytest, and
# the independent references the tests compare against (timm's LAMB and LARS,
# the authors' Schedule-Free reference optimizers from PyPI's schedulefree,
# pytorch-optimizer's SOAP and ScalableShampoo).
# Idempotent: a finished environment holds .pyenv/.complete naming the pins,
# and a second run with the same pins does nothing. The wheels are cached in
# .torch/wheels/VERSION/pyenv, so a rebuilt environment downloads nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(cat scripts/torch_version)
pins="torch==$version scikit-build-core==0.11.6 pytest==8.4.2 timm==1.0.22 numpy==2.3.5 schedulefree==1.4.1 pytorch-optimizer==4.1.0"
if [ -f .pyenv/.complete ] && [ "$(cat .pyenv/.complete)" = "$pins" ]; then exit 0; fi
echo "pyenv: making .pyenv with $pins"
rm -rf .pyenv
/usr/bin/python3 -m venv .pyenv
cache=".torch/wheels/$version/pyenv"
mkdir -p "$cache"
# The torch wheel scripts/fetch_torch.py downloaded is not fetched again.
.pyenv/bin/python -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
  --find-links ".torch/wheels/$version" --find-links "$cache" -d "$cache" $pins
.pyenv/bin/python -m pip install --quiet --disable-pip-version-check --no-index \
  --find-links ".torch/wheels/$version" --find-links "$cache" $pins
echo "$pins" > .pyenv/.complete
