"""The Python trial executor (bigbatch.sweep with train_data): a model that
TorchScript refuses swept on a DataLoader, resumed and plotted; a trial's
training against a loop written out here; an interrupted sweep going on
where it stopped; a Python and a C++ worker finishing one folder into one
table; the user's errors as failed trials, and what it refuses up front."""
import copy
import csv
import dataclasses
import json
import subprocess

import pytest
import torch

import bigbatch
from bigbatch import runner

from test_runner import can_plot


@dataclasses.dataclass
class Output:
    logits: torch.Tensor


class Net(torch.nn.Module):
    """A dataclass output and **kwargs: TorchScript refuses both."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))

    def forward(self, x, **kwargs):
        return Output(self.body(x))


def ce(out, y):
    return torch.nn.functional.cross_entropy(out.logits, y)


def wrong(out, y):
    return (out.logits.argmax(-1) != y).float().mean()


def mixture(seed=0):
    """Ten overlapping Gaussian classes in 20 dimensions: 2048 to train, 512 to validate."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(10, 20, generator=g) * 2

    def split(n):
        y = torch.randint(10, (n,), generator=g)
        return torch.utils.data.TensorDataset(means[y] + torch.randn(n, 20, generator=g), y)

    return split(2048), split(512)


def net():
    torch.manual_seed(0)
    return Net()


def config(**overrides):
    c = {"name": "py_exec", "optimizer": {"name": "lamb"},
         "target": {"metric": "val_error", "threshold": 0.3, "eval_every": 5}, "budget": {"epochs": 2},
         "batch_sizes": [32, 128], "search": {"lr_range": {"min": 0.005, "max": 0.05, "trials": 2}}, "seeds": [0]}
    c.update(overrides)
    return c


def train_by_hand(model, opt, train, val, steps, every, seed, before_step=None, after_step=None,
                  evaluated=None):
    """What the executor does, written out: batches of 32 drawn in order from
    one permutation of the 2048 examples per epoch (seeded by `seed`), a step
    each, and every `every` steps the validation loss of `evaluated` (the
    model by default) over the 512 examples in chunks of 256. The losses."""
    evaluated = evaluated or model
    g = torch.Generator().manual_seed(seed)
    order, at, want = torch.randperm(2048, generator=g), 0, []
    x_val, y_val = val.tensors
    for step in range(1, steps + 1):
        if before_step:
            before_step(step)
        if at + 32 > 2048:
            order, at = torch.randperm(2048, generator=g), 0
        i = order[at:at + 32]
        at += 32
        opt.zero_grad()
        ce(model(train.tensors[0][i]), train.tensors[1][i]).backward()
        opt.step()
        if after_step:
            after_step(step)
        if step % every == 0:
            with torch.no_grad():
                want.append(sum(float(ce(evaluated(x_val[k:k + 256]), y_val[k:k + 256])) * len(y_val[k:k + 256])
                                for k in range(0, 512, 256)) / 512)
    return want


def summaries(folder):
    return {p.parent.name: json.loads(p.read_text()) for p in folder.glob("b*_s*/summary.json")}


def test_a_model_torchscript_refuses_sweeps_resumes_and_plots(tmp_path):
    with pytest.raises(Exception):  # what the C++ runner's path would need
        torch.jit.script(Net())
    train, val = mixture()
    loader = torch.utils.data.DataLoader(train, batch_size=7, num_workers=1)  # its workers kept, its size not
    plots = can_plot()
    rows = bigbatch.sweep(config(), model=net(), out=tmp_path, train_data=loader, val_data=val, loss=ce,
                          error=wrong, metrics={"top1_loss": ce}, plots=plots)
    folder = tmp_path / "py_exec"
    assert [r["batch_size"] for r in rows] == [32, 128]
    assert all(r["reached"] == 1 and r["steps"] > 0 for r in rows)
    done = summaries(folder)
    assert len(done) == 4
    for name, s in done.items():
        assert s["data"]["executor"]["name"] == "python" and s["data"]["loader_threads"] == 1
        assert s["status"] in ("reached", "pruned", "not_reached"), (name, s)
    resolved = json.loads((folder / "sweep.json").read_text())
    assert resolved["dataset"] == {"name": "python", "train_size": 2048, "val_size": 512, "id": "TensorDataset"}
    assert resolved["model"]["type"] == "python" and resolved["model"]["class"].endswith("Net")
    # The C++ runner's files: metrics.csv's columns (the metric after them), the event file.
    with open(folder / "b32_p0_s0" / "metrics.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert list(table[0])[:6] == ["step", "epoch", "examples", "train_loss", "val_loss", "val_error"]
    assert list(table[0])[-1] == "val_top1_loss"
    assert [int(r["step"]) for r in table] == list(range(5, 5 * len(table) + 1, 5))
    assert all(int(r["batch_size"]) == 32 and int(r["examples"]) == 32 * int(r["step"]) for r in table)
    assert float(table[-1]["val_top1_loss"]) == pytest.approx(float(table[-1]["val_loss"]), rel=1e-6)
    assert (folder / "b32_p0_s0" / "events.out.tfevents.bigbatch").stat().st_size > 0
    # Resumed: nothing trains again, the table is the same.
    before = (folder / "b32_p0_s0" / "metrics.csv").read_bytes()
    assert bigbatch.sweep(config(), model=net(), out=tmp_path, train_data=loader, val_data=val, loss=ce,
                          error=wrong, metrics={"top1_loss": ce}, plots=False) == rows
    assert (folder / "b32_p0_s0" / "metrics.csv").read_bytes() == before
    # Another model's weights are another sweep: refused, the folder kept.
    other = net()
    with torch.no_grad():
        other.body[0].weight.add_(1)
    with pytest.raises(ValueError, match="holds a different sweep|different"):
        bigbatch.sweep(config(), model=other, out=tmp_path, train_data=loader, val_data=val, loss=ce,
                       error=wrong, plots=False)
    assert (folder / "b32_p0_s0" / "metrics.csv").read_bytes() == before
    if not plots:
        pytest.skip("no matplotlib for the plots")
    assert (folder / "plots" / "steps_to_target.png").stat().st_size > 0


@pytest.mark.parametrize("name", ["lamb", "adamw"])
def test_a_trial_trains_as_the_loop_written_out_here(tmp_path, name):
    """LAMB's two groups (the biases without decay or trust ratio; torch's
    AdamW's without decay), the
    rate of the schedule (linear scaling from base_batch 16: twice the base
    at 32, reached by a linear warmup over 40 steps from the unscaled rate,
    Goyal et al.), batches drawn in order from one permutation per epoch
    seeded by the trial's seed: the validation loss at each evaluation."""
    train, val = mixture()
    c = config(optimizer={"name": name}, batch_sizes=[32], search={"lr": [0.004]}, seeds=[3], budget={"steps": 80},
               schedule={"base_batch": 16, "scaling": "linear", "warmup": {"length": 40}},
               target={"metric": "val_loss", "threshold": 1e-9, "eval_every": 40})
    bigbatch.sweep(c, model=net(), out=tmp_path, train_data=train, val_data=val, loss=ce, error=wrong,
                   plots=False, args=["--no-prune"])
    trial = tmp_path / "py_exec" / "b32_p0_s3"
    with open(trial / "metrics.csv", newline="") as f:
        got = [float(r["val_loss"]) for r in csv.DictReader(f)]
    options = json.loads((trial / "config.json").read_text())["optimizer"]  # the runner's defaults, written out
    assert options.pop("name") == name and options["weight_decay"] > 0
    options = {k: bigbatch._ops.decode(v, 0.0) for k, v in options.items()}

    torch.manual_seed(3)
    model = copy.deepcopy(net())
    weights = [p for p in model.parameters() if p.dim() >= 2]
    biases = [p for p in model.parameters() if p.dim() < 2]
    if name == "lamb":
        opt = bigbatch.optim.LAMB([{"params": weights}, {"params": biases, "weight_decay": 0.0, "adapt": False}],
                                  lr=0.008, **options)
    else:
        opt = torch.optim.AdamW([{"params": weights}, {"params": biases, "weight_decay": 0.0}], lr=0.008, **options)
    def warmup(step):
        for group in opt.param_groups:
            group["lr"] = 0.004 + (0.008 - 0.004) * (step - 1) / 40 if step - 1 < 40 else 0.008

    want = train_by_hand(model, opt, train, val, steps=80, every=40, seed=3, before_step=warmup)
    assert got == pytest.approx(want, rel=1e-6, abs=1e-7)


class Stop(BaseException):
    """What a Ctrl-C would be: not the trial's error, the whole sweep's end."""


def test_an_interrupted_sweep_goes_on_where_it_stopped(tmp_path, capfd):
    train, val = mixture()

    def stopping(out, y):  # at the first batch of 128: the trials of 32 are done
        if out.logits.shape[0] == 128:
            raise Stop()
        return ce(out, y)

    # (Loader workers hold the pipe to the program: the stop must end them.)
    workers = torch.utils.data.DataLoader(train, num_workers=1)
    with pytest.raises(Stop):
        bigbatch.sweep(config(), model=net(), out=tmp_path / "a", train_data=workers, val_data=val, loss=stopping,
                       error=wrong, plots=False)
    finished = summaries(tmp_path / "a" / "py_exec")
    assert sorted(finished) == ["b32_p0_s0", "b32_p1_s0"]
    capfd.readouterr()
    rows = bigbatch.sweep(config(), model=net(), out=tmp_path / "a", train_data=train, val_data=val, loss=ce,
                          error=wrong, plots=False)
    assert f"{len(finished)} of 4 trials already finished" in capfd.readouterr().err
    # As one run without the stop: the same trials, the same results.
    whole = bigbatch.sweep(config(), model=net(), out=tmp_path / "b", train_data=train, val_data=val, loss=ce,
                           error=wrong, plots=False)
    assert rows == whole
    for name, s in summaries(tmp_path / "b" / "py_exec").items():
        again = summaries(tmp_path / "a" / "py_exec")[name]
        assert (again["status"], again["steps"], again["best_metric"]) == (s["status"], s["steps"], s["best_metric"])


def test_a_python_and_a_cpp_worker_finish_one_folder_into_one_table(tmp_path):
    c = config(dataset={"name": "gaussian_mixture", "train_size": 2048, "val_size": 512}, seeds=[0, 1])
    train, val = bigbatch.datasets(c)
    assert len(train) == 2048 and len(val) == 512 and train.tensors[0].shape == (2048, 20)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    file = tmp_path / "net.pt"
    torch.jit.save(torch.jit.script(model), str(file))
    c["model"] = {"type": "torchscript", "path": str(file)}

    def stopping(out, y):  # at the first batch of 128: the trials of 32 are done
        if out.shape[0] == 128:
            raise Stop()
        return torch.nn.functional.cross_entropy(out, y)

    with pytest.raises(Stop):  # Python trains the first trials, then stops
        bigbatch.sweep(c, model=model, out=tmp_path, train_data=train, val_data=val, loss=stopping, plots=False)
    by_python = set(summaries(tmp_path / "py_exec"))
    assert by_python and all(name.startswith("b32_") for name in by_python)  # (the queue's order decides which)
    rows = bigbatch.sweep(c, out=tmp_path, plots=False)  # the bigbatch program trains the rest
    done = summaries(tmp_path / "py_exec")
    assert len(done) == 8
    executors = {name: s["data"].get("executor", {}).get("name", "c++") for name, s in done.items()}
    # (A trial Python pruned may be redone by the program, whose queue looks again at pruned trials.)
    assert {n for n, e in executors.items() if e == "python"} <= by_python
    assert "python" in executors.values()
    assert "c++" in executors.values()
    assert [r["batch_size"] for r in rows] == [32, 128] and all(r["seeds"] == 2 for r in rows)
    report = subprocess.run([runner.cli(), "report", str(tmp_path / "py_exec")], capture_output=True, text=True,
                            check=True).stdout
    assert report.splitlines()[0].split()[:2] == ["batch", "steps"]


def metrics_but_wall_time(folder):
    with open(folder / "metrics.csv", newline="") as f:
        return [{k: v for k, v in r.items() if k != "wall_time"} for r in csv.DictReader(f)]


def test_a_horizon_branched_here_equals_its_run_alone(tmp_path):
    """A wsd run of 120 steps (cooldown 24, the rate scaled linearly from
    batch 16) with an EMA and a horizon at 60
    steps (stable 48, cooldown 12): their rates first part at step 49 (u =
    1/12 of the horizon's cooldown), between two evaluations. The branch
    equals the horizon's trial run alone, and the trial the run without
    horizons, every metrics.csv cell but wall time; the target, reached on
    the way, does not end either."""
    train, val = mixture()
    never = {"metric": "val_loss", "threshold": 1e-9, "eval_every": 10}  # runs alone stop at their target

    def swept(name, steps, stable, cooldown, target=never, **more):
        c = config(name=name, optimizer={"name": "adamw"}, batch_sizes=[32], search={"lr": [0.004]}, seeds=[1],
                   schedule={"unit": "steps", "base_batch": 16, "scaling": "linear",  # peak: 2x the base rate
                             "decay": {"type": "wsd", "stable": stable, "cooldown": cooldown}},
                   budget={"steps": steps}, target=target, average={"type": "ema", "half_life": 320}, **more)
        bigbatch.sweep(c, model=net(), out=tmp_path, train_data=train, val_data=val, loss=ce, error=wrong,
                       plots=False, args=["--no-prune"])
        return tmp_path / name / "b32_p0_s1"

    trial = swept("branched", 120, 96, 24, target={"metric": "val_error", "threshold": 0.5, "eval_every": 10},
                  horizons=[60])
    branch = trial / "horizon_1"
    assert json.loads((branch / "branched.json").read_text()) == {"step": 49}
    reached = [json.loads((f / "summary.json").read_text()) for f in (trial, branch)]
    assert [(s["status"], s["steps"]) for s in reached] == [("reached", 120), ("reached", 60)]
    assert reached[0]["steps_to_target"] == reached[1]["steps_to_target"] < 49
    with open(branch / "metrics.csv", newline="") as f:
        times = [float(r["wall_time"]) for r in csv.DictReader(f)]
    assert times == sorted(times)  # the branch's clock goes on from the trial's
    assert metrics_but_wall_time(branch) == metrics_but_wall_time(swept("alone", 60, 48, 12))
    assert metrics_but_wall_time(trial) == metrics_but_wall_time(swept("plain", 120, 96, 24))
    with open(tmp_path / "branched" / "horizons.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [(r["horizon"], r["steps"], r["branch_steps"]) for r in table] == [("60", "60", "11"), ("120", "120", "120")]


def test_the_users_errors_fail_their_trial_and_bad_requests_are_refused(tmp_path):
    train, val = mixture()

    def broken(out, y):
        if out.logits.shape[0] == 128:
            raise RuntimeError("shapes do not match (a user's bug)")
        return ce(out, y)

    rows = bigbatch.sweep(config(), model=net(), out=tmp_path, train_data=train, val_data=val, loss=broken,
                          error=wrong, plots=False)
    done = summaries(tmp_path / "py_exec")
    assert {s["status"] for n, s in done.items() if n.startswith("b128")} == {"failed"}
    assert all("RuntimeError: shapes do not match" in s["error"] for n, s in done.items() if n.startswith("b128"))
    assert [r["batch_size"] for r in rows if r["reached"]] == [32]
    with pytest.raises(ValueError, match=r"noise: gradient noise is the C\+\+ trainer's"):
        bigbatch.sweep(config(name="n", noise={"type": "annealed"}), model=net(), out=tmp_path, train_data=train,
                       val_data=val, loss=ce, error=wrong)
    with pytest.raises(ValueError, match="val_data is needed"):
        bigbatch.sweep(config(name="v"), model=net(), out=tmp_path, train_data=train)
    with pytest.raises(ValueError, match="val_error needs an error"):
        bigbatch.sweep(config(name="e"), model=net(), out=tmp_path, train_data=train, val_data=val, loss=ce,
                       error=None)
    with pytest.raises(ValueError, match="map-style dataset"):
        bigbatch.sweep(config(name="i"), model=net(), out=tmp_path, train_data=iter([]), val_data=val)
    # An error in every trial's setup (LARS's momentum correction, refused here): each fails with it.
    rows = bigbatch.sweep(config(name="m", optimizer={"name": "lars", "momentum_correction": True}), model=net(),
                          out=tmp_path, train_data=train, val_data=val, loss=ce, error=wrong, plots=False)
    done = summaries(tmp_path / "m")
    assert len(done) == 4 and {s["status"] for s in done.values()} == {"failed"}
    assert all("momentum_correction" in s["error"] for s in done.values()) and not any(r["reached"] for r in rows)
    # The program alone cannot train what only this process holds.
    python_only = config(name="p", dataset={"name": "python", "train_size": 2048, "val_size": 512, "id": "x"})
    with pytest.raises(ValueError, match=r"dataset \"python\": the user's own"):
        bigbatch.sweep(python_only, out=tmp_path)


def test_the_configs_own_dataset_trains_a_module_of_the_users(tmp_path):
    """bigbatch.datasets' splits keep the config's "dataset"; a plain module
    (no TorchScript file) is recorded as "python"."""
    c = config(dataset={"name": "gaussian_mixture", "train_size": 2048, "val_size": 512})
    train, val = bigbatch.datasets(c)
    rows = bigbatch.sweep(c, model=net(), out=tmp_path, train_data=train, val_data=val, loss=ce, error=wrong,
                          plots=False)
    resolved = json.loads((tmp_path / "py_exec" / "sweep.json").read_text())
    assert resolved["dataset"]["name"] == "gaussian_mixture" and resolved["model"]["type"] == "python"
    assert all(r["reached"] == 1 for r in rows)
