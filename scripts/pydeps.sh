#!/usr/bin/env bash
# Installs the Python packages the tests need from PyPI that Debian does not
# package, into ./.pydeps (pip --target, for Debian's /usr/bin/python3; a test
# puts it on PYTHONPATH). Idempotent: nothing is fetched when the pinned
# versions are there.
#   tensorboard: its event reader checks the event files bigbatch writes.
set -euo pipefail
cd "$(dirname "$0")/.."
tensorboard_pin=2.21.0
if [ ! -d ".pydeps/tensorboard-$tensorboard_pin.dist-info" ]; then
  echo "pydeps: installing tensorboard==$tensorboard_pin into .pydeps"
  rm -rf .pydeps
  /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --no-warn-conflicts \
    --target .pydeps "tensorboard==$tensorboard_pin"
fi
