"""The sweep runner from Python (docs/python.md): bigbatch.sweep runs the
`bigbatch` program's sweep (experiments/, the same folders, resumption,
tables and plots as the command line) on a config, with a PyTorch model of
the user's when one is given, scripted for the C++ runner; bigbatch.plot
draws a sweep folder's plots."""
import csv
import hashlib
import importlib.util
import io
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import warnings

import torch

__all__ = ["sweep", "plot", "cli"]

_HERE = pathlib.Path(__file__).resolve().parent


def cli():
    """The bigbatch program: $BIGBATCH_CLI, else the one installed with the package."""
    path = os.environ.get("BIGBATCH_CLI") or str(_HERE / "bin" / "bigbatch")
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"bigbatch: no bigbatch program at {path}: install the package with its CLI "
                                "(the default; BIGBATCH_PYTHON_CLI=OFF leaves it out) or set BIGBATCH_CLI")
    return path


def _environment():
    env = dict(os.environ)
    script = _HERE / "plot_sweep.py"
    if "BIGBATCH_PLOT_SCRIPT" not in env and script.exists():
        env["BIGBATCH_PLOT_SCRIPT"] = str(script)
    if "BIGBATCH_PYTHON" not in env:  # the plots need matplotlib: this Python's if it has it
        if importlib.util.find_spec("matplotlib") is not None:
            env["BIGBATCH_PYTHON"] = os.path.realpath(__import__("sys").executable)
    return env


def _run(args):
    """Runs the program, its output passed through (a sweep's progress); its
    one-line error (exit code 2: a config or usage error) comes back as a
    ValueError, any other failure as a RuntimeError with its last lines."""
    tail = []
    with subprocess.Popen([cli()] + args, env=_environment(), stderr=subprocess.PIPE, text=True) as proc:
        for line in proc.stderr:
            sys.stderr.write(line)
            tail = (tail + [line.rstrip("\n")])[-20:]
    if proc.returncode == 2:
        lines = [line for line in tail if line.strip()]
        raise ValueError(lines[-1] if lines else f"bigbatch {args[0]}: exit code 2")
    if proc.returncode != 0:
        raise RuntimeError(f"bigbatch {' '.join(args)} failed with exit code {proc.returncode}:\n" + "\n".join(tail))


def _write(path, data):
    """Writes `data` (bytes) to `path` through a temporary file renamed over
    it: a killed run leaves no half file, and two runs do not share one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def _weights_digest(scripted):
    """A digest of what a trial starts from that is the same in every
    process (torch.jit.save's bytes are not: its archive holds a fresh
    serialization id): each parameter's and buffer's name, dtype, shape and
    bytes, and each module's name, type and code."""
    h = hashlib.sha256()
    for name, t in sorted(scripted.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    for name, m in scripted.named_modules():
        h.update(f"{name}|{m.original_name}|".encode())
        try:
            h.update(m.code.encode())
        except (RuntimeError, AttributeError):  # a module without forward
            pass
    return h.hexdigest()[:12]


def _script(model):
    if isinstance(model, torch.jit.ScriptModule):
        return model
    try:
        with warnings.catch_warnings():  # TorchScript is deprecated in Python, and what the C++ runner loads
            warnings.simplefilter("ignore", FutureWarning)
            return torch.jit.script(model)
    except Exception as e:  # noqa: BLE001 - TorchScript's errors are of several types
        raise ValueError(f"bigbatch.sweep: the model cannot be scripted for the C++ runner ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}); pass torch.jit.trace(model, example) instead") from e


def sweep(config, model=None, out="runs", plots=True, args=()):
    """Runs (or resumes) the sweep of `config` (a dict, or a JSON file's path)
    into OUT/<name>/ and returns its steps-to-target rows (steps_to_target.csv)
    as dicts of numbers (None for an empty cell). `model`, an nn.Module (scripted here; a ScriptModule as it is),
    replaces the config's model: its weights are every trial's starting point,
    saved in the sweep folder as model-<hash>.pt. plots=False skips the
    plots; `args` go to `bigbatch sweep` as they are ("--jobs", "2", ...)."""
    if isinstance(config, (str, os.PathLike)):
        path = pathlib.Path(config)
        try:
            config = json.loads(path.read_text())
        except OSError as e:
            raise FileNotFoundError(f"bigbatch.sweep: cannot read {path}: {e.strerror}") from e
    else:
        config = json.loads(json.dumps(config))  # a copy, and a check that it is JSON
    if not isinstance(config, dict) or not isinstance(config.get("name"), str):
        raise ValueError("bigbatch.sweep: the config needs a \"name\" (string): its folder is OUT/<name>/")
    name = config["name"]
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name) or ".." in name:  # the program's own rule, checked before writing
        raise ValueError(f"bigbatch.sweep: name: letters, digits, '.', '_' and '-' only, and no '..', got '{name}'")
    folder = pathlib.Path(out) / name
    scripted = _script(model) if model is not None else None
    folder.mkdir(parents=True, exist_ok=True)
    if scripted is not None:
        file = folder / f"model-{_weights_digest(scripted)}.pt"
        if not file.exists():  # the same weights and code: the same file, so a sweep resumes
            buffer = io.BytesIO()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                torch.jit.save(scripted, buffer)
            _write(file, buffer.getvalue())
        config["model"] = {"type": "torchscript", "path": str(file.resolve())}
    config_file = folder.parent / f".{name}.config.json"
    _write(config_file, json.dumps(config, indent=2).encode())
    _run(["sweep", str(config_file), "--out", str(out)] + [str(a) for a in args])
    with open(folder / "steps_to_target.csv", newline="") as f:
        rows = [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]
    if plots:
        try:
            plot(folder)
        except (RuntimeError, ValueError) as e:  # the sweep's results stand without their plots
            warnings.warn(f"bigbatch.sweep: the plots failed: {e}", stacklevel=2)
    return rows


def _number(text):
    """A table cell as Python reads it: int, float, None for an empty cell, else the text."""
    if text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def plot(*folders, out=None, labels=None):
    """Writes each sweep folder's plots (into FOLDER/plots) and, given several
    folders, the figures comparing them (into `out`, which the comparison
    needs), as `bigbatch plot` does. Returns the folder of the last figures."""
    if not folders:
        raise ValueError("bigbatch.plot: no sweep folder given")
    args = ["plot"] + [str(f) for f in folders]
    if out is not None:
        args += ["--out", str(out)]
    if labels:
        args += ["--labels"] + [str(label) for label in labels]
    _run(args)
    return pathlib.Path(out) if out is not None else pathlib.Path(folders[0]) / "plots"
