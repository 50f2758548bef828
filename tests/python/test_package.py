"""The installed package as pip sees it: its requirement pins the exact torch
it was built against, its wheel serves any Python 3, it carries its license,
an import under another torch is refused before the library loads, and a
build folder configured by another environment's torch builds against that
one."""
import importlib.metadata
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

import torch

from bigbatch import _ops


def test_the_requirement_is_the_torch_built_against():
    public = torch.__version__.split("+")[0]
    assert importlib.metadata.requires("bigbatch") == [f"torch=={public}"]
    assert _ops.TORCH_VERSION == torch.__version__


def test_the_wheel_is_tagged_for_any_python_3_and_carries_the_license():
    dist = importlib.metadata.distribution("bigbatch")
    tags = [line.split(": ", 1)[1] for line in dist.read_text("WHEEL").splitlines() if line.startswith("Tag: ")]
    assert tags and all(t.startswith("py3-none-") for t in tags), tags
    assert "Apache License" in dist.metadata["License"] and "Version 2.0" in dist.metadata["License"]


def test_an_import_under_another_torch_is_refused_naming_both_versions():
    code = "import torch; torch.__version__ = '2.7.0'; import bigbatch"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: bigbatch was built against torch ") and "2.7.0" in last, proc.stderr
    assert _ops.TORCH_VERSION in last, proc.stderr


def test_local_labels_of_one_release_are_the_same_torch():
    _ops.check_torch("2.15.0+cpu", "2.15.0+cu132")
    _ops.check_torch("2.15.0", "2.15.0+cu132")


REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("ninja") is None, reason="no cmake or ninja")
def test_a_build_folder_is_keyed_to_the_torch_of_the_python_configuring_it(tmp_path):
    """pip's build folder (build-python/<tag>) outlives an environment: one
    configured by this Python's torch, then by a Python whose torch is
    another version, compiles against the second's headers (every compile
    line changes, so every object is rebuilt) and records it."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import torch\ntorch.__version__ = '2.99.0+other'\n")
    python = other / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={other} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    build = tmp_path / "build"

    def configure(py):
        proc = subprocess.run(["cmake", "-S", str(REPO), "-B", str(build), "-G", "Ninja", "-DBIGBATCH_PYTHON=ON",
                               "-DBIGBATCH_BUILD_TESTS=OFF", "-DBIGBATCH_BUILD_EXPERIMENTS=OFF",
                               "-DBIGBATCH_BUILD_BENCHMARKS=OFF", f"-DPython3_EXECUTABLE={py}"],
                              capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=""))
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        includes = set(re.findall(r"torch-([^/ ]+)/torch/include", (build / "build.ninja").read_text()))
        built = re.search(r'TORCH_VERSION = "([^"]+)"', (build / "python" / "_build_info.py").read_text()).group(1)
        return proc.stdout, includes, built

    _, includes, built = configure(sys.executable)
    assert includes == {torch.__version__} and built == torch.__version__
    out, includes, built = configure(python)
    assert includes == {"2.99.0+other"} and built == "2.99.0+other"
    assert "every object is rebuilt" in out
    assert torch.__version__ not in (build / "CMakeCache.txt").read_text()  # nothing cached of the first
