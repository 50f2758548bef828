"""The installed package as pip sees it: its requirement pins the exact torch
it was built against, its wheel serves any Python 3, it carries its license,
and an import under another torch is refused before the library loads."""
import importlib.metadata
import subprocess
import sys

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
