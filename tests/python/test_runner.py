"""bigbatch.sweep and bigbatch.plot: a PyTorch model's sweep through the
bigbatch program, its folder, resumption and plots, and a config error as a
ValueError with the program's one-line message."""
import importlib.util
import json
import subprocess

import pytest
import torch

import bigbatch


def config(**overrides):
    c = {"name": "py_sweep", "dataset": {"name": "gaussian_mixture", "train_size": 2048, "val_size": 512},
         "optimizer": {"name": "lamb"}, "target": {"metric": "val_error", "threshold": 0.3, "eval_every": 5},
         "budget": {"epochs": 2}, "batch_sizes": [32, 128],
         "search": {"lr_range": {"min": 0.005, "max": 0.05, "trials": 2}}, "seeds": [0]}
    c.update(overrides)
    return c


def can_plot():
    """Whether the plots can be drawn: matplotlib in this Python or in
    /usr/bin/python3, the two bigbatch.sweep tries (CI has Debian's)."""
    if importlib.util.find_spec("matplotlib") is not None:
        return True
    return subprocess.run(["/usr/bin/python3", "-c", "import matplotlib"], capture_output=True).returncode == 0


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def test_a_python_model_sweeps_resumes_and_plots(tmp_path):
    plots = can_plot()
    rows = bigbatch.sweep(config(), model=model(), out=tmp_path, plots=plots)
    folder = tmp_path / "py_sweep"
    assert [r["batch_size"] for r in rows] == [32, 128]
    assert all(r["reached"] == 1 and r["steps"] > 0 for r in rows)
    assert len(list(folder.glob("b*_p*_s0"))) == 4  # two rates at each of two batch sizes
    (weights,) = folder.glob("model-*.pt")
    resolved = json.loads((folder / "sweep.json").read_text())
    assert resolved["model"] == {"type": "torchscript", "path": str(weights.resolve())}
    if plots:
        assert (folder / "plots" / "steps_to_target.png").stat().st_size > 0
    # The weights are every trial's start: the scripted file holds the model's own.
    loaded = torch.jit.load(str(weights))
    assert torch.equal(loaded.state_dict()["0.weight"], model()[0].weight.detach())
    # A second call resumes: every trial is done, the table is the same.
    before = (folder / "b32_p0_s0" / "metrics.csv").read_bytes()
    assert bigbatch.sweep(config(), model=model(), out=tmp_path, plots=False) == rows
    assert (folder / "b32_p0_s0" / "metrics.csv").read_bytes() == before
    if not plots:
        pytest.skip("no matplotlib for the plots")
    (folder / "plots" / "steps_to_target.svg").unlink()
    assert bigbatch.plot(folder) == folder / "plots"
    assert (folder / "plots" / "steps_to_target.svg").stat().st_size > 0


def test_a_config_error_is_a_value_error_with_the_programs_message(tmp_path):
    with pytest.raises(ValueError, match=r"batch_sizes\[0\].*must be .*got 0"):
        bigbatch.sweep(config(batch_sizes=[0, 64]), model=model(), out=tmp_path)
    with pytest.raises(ValueError, match=r"needs a \"name\""):
        bigbatch.sweep({"batch_sizes": [8]}, out=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"cannot read .*missing.json"):
        bigbatch.sweep(tmp_path / "missing.json", out=tmp_path)


def test_a_model_that_does_not_script_is_refused_before_the_run(tmp_path):
    class Untyped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(20, 10)

        def forward(self, x, *rest):  # varargs: TorchScript refuses
            return self.fc(x)

    with pytest.raises(ValueError, match="cannot be scripted"):
        bigbatch.sweep(config(), model=Untyped(), out=tmp_path)
    assert not list((tmp_path / "py_sweep").glob("b*"))


def test_a_sweep_resumes_in_another_process(tmp_path):
    """The model's file is named by its weights and code, not by
    torch.jit.save's bytes (which differ between processes): a second
    process finds the same file and the same config, and resumes."""
    import sys
    script = (
        "import json, sys, torch, bigbatch\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))\n"
        f"c = json.loads({json.dumps(json.dumps(config(batch_sizes=[64])))})\n"
        "rows = bigbatch.sweep(c, model=m, out=sys.argv[1], plots=False)\n"
        "print(json.dumps(rows))\n")
    metrics = tmp_path / "py_sweep" / "b64_p0_s0" / "metrics.csv"
    runs = []
    for _ in range(2):
        runs.append(subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True))
        assert runs[-1].returncode == 0, runs[-1].stderr
        if len(runs) == 1:
            first = (metrics.read_bytes(), metrics.stat().st_mtime_ns)
    assert runs[0].stdout.splitlines()[-1] == runs[1].stdout.splitlines()[-1]
    assert len(list((tmp_path / "py_sweep").glob("model-*.pt"))) == 1
    assert (metrics.read_bytes(), metrics.stat().st_mtime_ns) == first  # not trained again


def test_a_name_that_would_leave_the_output_folder_is_refused_before_writing(tmp_path):
    with pytest.raises(ValueError, match=r"name: letters, digits"):
        bigbatch.sweep(config(name="../elsewhere"), model=model(), out=tmp_path / "runs")
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "runs").exists()
