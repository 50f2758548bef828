"""Fixtures of the Python package's tests: the C++ peer program
(tests/python/peer.cpp, built in the main build; $BIGBATCH_PYTHON_PEER
overrides) and the tensors the cases step."""
import os
import pathlib
import subprocess

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def peer_program():
    path = pathlib.Path(os.environ.get("BIGBATCH_PYTHON_PEER", ROOT / "build" / "tests" / "python_peer"))
    if not path.exists():
        pytest.fail(f"the C++ peer {path} is missing: build the target python_peer (scripts/test.sh does)")
    return path


@pytest.fixture
def peer(peer_program, tmp_path):
    """peer(case, params, grads, load=None, save=None) -> the C++ program's
    {"params", "skipped", "ratios"} after stepping `case` on `params` with `grads`."""
    def run(case, params, grads, load=None, save=None):
        src, dst = tmp_path / "in.pt", tmp_path / "out.pt"
        torch.save({"params": [p.detach() for p in params], "grads": grads}, src)
        cmd = [str(peer_program), case, str(src), str(dst)]
        if load:
            cmd += ["--load", str(load)]
        if save:
            cmd += ["--save", str(save)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return torch.load(dst, weights_only=False)  # written by the peer (typed containers)
    return run


@pytest.fixture(scope="session", autouse=True)
def cli_program():
    """The bigbatch program bigbatch.sweep runs: the package's own where it
    was installed with it, else the main build's ($BIGBATCH_CLI overrides)."""
    import bigbatch.runner
    if "BIGBATCH_CLI" not in os.environ and not (pathlib.Path(bigbatch.runner.__file__).parent / "bin" / "bigbatch").exists():
        os.environ["BIGBATCH_CLI"] = str(ROOT / "build" / "experiments" / "bigbatch")
    return bigbatch.runner.cli()


def reference(module):
    """The module `module` (timm, torchvision: the references and the
    example's data), or a skip where it is missing, as on a GPU machine;
    CI sets BIGBATCH_REQUIRE_REFERENCES=1, where a missing one fails."""
    if os.environ.get("BIGBATCH_REQUIRE_REFERENCES") == "1":
        import importlib
        return importlib.import_module(module)
    return pytest.importorskip(module)
