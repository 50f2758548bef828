"""The sweep runner from Python (docs/python.md): bigbatch.sweep runs the
`bigbatch` program's sweep (experiments/, the same folders, resumption,
tables and plots as the command line) on a config, with a PyTorch model of
the user's when one is given: trained here, on the user's data, by the
Python trial executor (executor.py) when train_data is given, else scripted
for the C++ runner; bigbatch.plot draws a sweep folder's plots."""
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
import threading
import warnings

import torch

__all__ = ["sweep", "plot", "datasets", "cli"]

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


def _run(args, task=None):
    """Runs the program, its output passed through (a sweep's progress); its
    one-line error (exit code 2: a config or usage error) comes back as a
    ValueError, any other failure as a RuntimeError with its last lines.
    With a `task` (executor.Task), the program's trials are trained here,
    over two pipes, while a thread passes its output through."""
    tail = []

    def pump(stream):
        nonlocal tail
        for line in stream:
            sys.stderr.write(line)
            tail = (tail + [line.rstrip("\n")])[-20:]

    if task is None:
        with subprocess.Popen([cli()] + args, env=_environment(), stderr=subprocess.PIPE, text=True) as proc:
            pump(proc.stderr)
    else:
        from . import executor
        to_here, from_program = os.pipe()
        to_program, from_here = os.pipe()
        try:
            proc = subprocess.Popen([cli()] + args + ["--executor", f"{to_program},{from_program}"],
                                    env=_environment(), stderr=subprocess.PIPE, text=True,
                                    pass_fds=(to_program, from_program))
        except BaseException:
            os.close(to_here)
            os.close(from_here)
            raise
        finally:
            os.close(to_program)
            os.close(from_program)
        channel = executor.Channel(to_here, from_here)
        reader = threading.Thread(target=pump, args=(proc.stderr,), daemon=True)
        reader.start()
        try:
            executor.serve(channel, task)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the program ended first: its exit code and last lines say why, below
        except BaseException:
            channel.close()  # the program gives the trial back and ends
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:  # (something still holds the pipe open)
                proc.kill()
                proc.wait()
            raise
        channel.close()
        proc.wait()
        reader.join()
        proc.stderr.close()
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


def _state_digest(module, h):
    """Each parameter's and buffer's name, dtype, shape and bytes, into `h`."""
    for name, t in sorted(module.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h


def _weights_digest(scripted):
    """A digest of what a trial starts from that is the same in every
    process (torch.jit.save's bytes are not: its archive holds a fresh
    serialization id): each parameter's and buffer's name, dtype, shape and
    bytes, and each module's name, type and code."""
    h = _state_digest(scripted, hashlib.sha256())
    for name, m in scripted.named_modules():
        h.update(f"{name}|{m.original_name}|".encode())
        try:
            h.update(m.code.encode())
        except (RuntimeError, AttributeError):  # a module without forward
            pass
    return h.hexdigest()[:12]


def _read_config(config, who):
    """A config given as a dict (copied, and so checked to be JSON) or as a
    JSON file's path (FileNotFoundError naming it and the system's reason)."""
    if isinstance(config, (str, os.PathLike)):
        path = pathlib.Path(config)
        try:
            return json.loads(path.read_text())
        except OSError as e:
            raise FileNotFoundError(f"{who}: cannot read {path}: {e.strerror}") from e
    return json.loads(json.dumps(config))


def _same_weights(module, part):
    """Whether `part` (a config's "model") is a TorchScript file whose
    parameters and buffers are `module`'s, by name and value."""
    if not isinstance(part, dict) or part.get("type") != "torchscript" or not part.get("path"):
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            loaded = torch.jit.load(part["path"], map_location="cpu")
    except (RuntimeError, OSError, ValueError):
        return False
    digest = lambda m: _state_digest(m, hashlib.sha256()).hexdigest()  # noqa: E731
    return digest(loaded) == digest(module)


def datasets(config):
    """The training and validation splits of a config's dataset (a dict, or
    a JSON file's path), as the C++ runner loads them, as two
    torch.utils.data.TensorDataset: for training the same data here, in a
    sweep whose other workers are the bigbatch program (docs/python.md).
    Each knows the config's "dataset", which bigbatch.sweep then keeps."""
    config = _read_config(config, "bigbatch.datasets")
    with tempfile.TemporaryDirectory() as tmp:
        (pathlib.Path(tmp) / "config.json").write_text(json.dumps(config))
        _run(["data", str(pathlib.Path(tmp) / "config.json"), "--save", str(pathlib.Path(tmp) / "data.pt")])
        splits = torch.load(pathlib.Path(tmp) / "data.pt", weights_only=True)
    out = []
    for k in (0, 2):  # (train input, target, validation input, target)
        d = torch.utils.data.TensorDataset(splits[k], splits[k + 1])
        d.bigbatch_dataset = json.loads(json.dumps(config.get("dataset")))
        out.append(d)
    return tuple(out)


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


def sweep(config, model=None, out="runs", plots=True, args=(), *, train_data=None, val_data=None, loss=None,
          error="argmax", metrics=None, data_id=None):
    """Runs (or resumes) the sweep of `config` (a dict, or a JSON file's path)
    into OUT/<name>/ and returns its steps-to-target rows (steps_to_target.csv)
    as dicts of numbers (None for an empty cell). plots=False skips the
    plots; `args` go to `bigbatch sweep` as they are ("--jobs", "2", ...).

    With `train_data` (a map-style Dataset, or a DataLoader over one, whose
    collate_fn, workers and pinning each trial's loader keeps) and `val_data`
    (a DataLoader, or a Dataset read 256 at a time), the trials train here,
    in this process, on `model` (any nn.Module: no TorchScript), while the
    bigbatch program keeps the sweep (executor.py): the same folders,
    claims, resumption, tables and plots. A batch is (input, target) or a
    dict with "input" and "target". `loss(output, target)` is the batch mean
    (default: cross-entropy for class indices, else the squared error
    summed per example); `error` the fraction wrong ("argmax": 1 - accuracy;
    None for none, as for regression); `metrics` further validation
    metrics by name (metrics.csv's val_<name>). The config's "dataset"
    becomes {"name": "python", the splits' sizes, "id": `data_id` or the
    dataset's class} and its "model" {"type": "python", the class, a digest
    of the weights}: what a resumed sweep compares.

    Without train_data, `model` (scripted here; a ScriptModule as it is)
    replaces the config's model for the C++ runner, on the config's
    dataset. Either way its weights are every trial's starting point."""
    config = _read_config(config, "bigbatch.sweep")
    if not isinstance(config, dict) or not isinstance(config.get("name"), str):
        raise ValueError("bigbatch.sweep: the config needs a \"name\" (string): its folder is OUT/<name>/")
    name = config["name"]
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name) or ".." in name:  # the program's own rule, checked before writing
        raise ValueError(f"bigbatch.sweep: name: letters, digits, '.', '_' and '-' only, and no '..', got '{name}'")
    folder = pathlib.Path(out) / name
    task = None
    if train_data is not None:
        from . import executor
        if model is None:
            raise ValueError("bigbatch.sweep: train_data needs the model to train on it")
        task = executor.Task(model, train_data, val_data, loss=loss, error=error, metrics=metrics)
        target = config.get("target", {}).get("metric", "val_error")
        if task.error is None and target == "val_error":
            raise ValueError("bigbatch.sweep: target.metric val_error needs an error (error=None measures none)")
        # The config's own dataset and TorchScript model stay where they are
        # what this process trains (bigbatch.datasets' splits; the same
        # weights): a C++ worker can then share the folder.
        tag = getattr(task.dataset, "bigbatch_dataset", None)
        if tag is None or tag != config.get("dataset"):
            config["dataset"] = {"name": "python", "train_size": task.train_size, "val_size": task.val_size,
                                 "id": data_id or type(task.dataset).__qualname__}
        if not _same_weights(model, config.get("model")):
            cls = type(model)
            digest = _state_digest(model, hashlib.sha256(cls.__qualname__.encode())).hexdigest()[:12]
            config["model"] = {"type": "python", "class": f"{cls.__module__}.{cls.__qualname__}", "digest": digest}
    elif val_data is not None:
        raise ValueError("bigbatch.sweep: val_data without train_data")
    scripted = _script(model) if model is not None and task is None else None
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
    _run(["sweep", str(config_file), "--out", str(out)] + [str(a) for a in args], task)
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
