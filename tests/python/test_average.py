"""Weight averaging ("average" in a trial config): the C++ trainer's average
(optim::WeightAverage, through the peer program) against
torch.optim.swa_utils' EMA averaging bit for bit, with a fixed decay and
with a half-life in examples over a batch ramp, in fp32 and bf16; LAWA
against the mean of the last k snapshots in float64 and against the Python
executor's LAWA bit for bit; and a swept trial whose averaged evaluation
equals a loop written out here with swa_utils."""
import csv
import copy
import json
import subprocess

import pytest
import torch
from torch.optim import swa_utils

import bigbatch
from bigbatch import executor

from test_executor import ce, config, mixture, net, train_by_hand, wrong


def trajectory(steps=40, seed=0):
    """The parameters of a small MLP after each of `steps` SGD steps with
    momentum on random data (fp32), and each step's batch size (a ramp)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    out, batches = [], []
    for t in range(steps):
        b = 16 if t < steps // 2 else 32
        x, y = torch.randn(b, 6), torch.randint(3, (b,))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        out.append([p.detach().clone() for p in model.parameters()])
        batches.append(b)
    return out, batches


def run_peer(peer_program, tmp_path, spec, steps, batches):
    src, dst = tmp_path / "steps.pt", tmp_path / "averaged.pt"
    torch.save({"steps": steps, "batches": batches}, src)
    proc = subprocess.run([str(peer_program), "average", spec, str(src), str(dst)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return torch.load(dst, weights_only=False)["averaged"]


def swa_utils_ema(steps, decays):
    """torch.optim.swa_utils.AveragedModel with its EMA averaging, updated
    after each step from a module holding that step's values; decays[t] is
    step t's decay."""
    holder = torch.nn.ParameterList([torch.nn.Parameter(p.clone()) for p in steps[0]])
    now = {"t": 0}
    ema = swa_utils.AveragedModel(
        holder, multi_avg_fn=lambda a, c, n: swa_utils.get_ema_multi_avg_fn(decays[now["t"]])(a, c, n))
    for t, values in enumerate(steps):
        with torch.no_grad():
            for p, v in zip(holder, values):
                p.copy_(v)
        now["t"] = t
        ema.update_parameters(holder)
    return [p.detach() for p in ema.module.parameters()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpp_ema_equals_swa_utils_bit_for_bit(peer_program, tmp_path, dtype):
    steps, batches = trajectory()
    steps = [[p.to(dtype) for p in s] for s in steps]
    got = run_peer(peer_program, tmp_path, "ema:0.95", steps, batches)
    want = swa_utils_ema(steps, [0.95] * len(steps))
    assert len(got) == len(want) == 4
    for g, w in zip(got, want):
        assert g.dtype == dtype and torch.equal(g, w)
    assert not torch.equal(want[0], steps[-1][0])  # an average, not the last weights
    # A half-life of 200 examples: d = 2^(-B/200) per step, the batch doubling halfway.
    got = run_peer(peer_program, tmp_path, "ema_half_life:200", steps, batches)
    want = swa_utils_ema(steps, [2.0 ** (-b / 200) for b in batches])
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    # The decay matters: another one differs (the check can fail).
    other = run_peer(peer_program, tmp_path, "ema:0.9", steps, batches)
    assert not torch.equal(other[0], swa_utils_ema(steps, [0.95] * len(steps))[0])


def test_lawa_is_the_mean_of_the_last_k_snapshots(peer_program, tmp_path):
    steps, batches = trajectory(steps=23)
    got = run_peer(peer_program, tmp_path, "lawa:4:5", steps, batches)
    # Snapshots at steps 5, 10, 15, 20 (index t - 1): all four kept.
    kept = [steps[t - 1] for t in (5, 10, 15, 20)]
    for i, g in enumerate(got):
        want = sum(s[i].double() for s in kept) / 4
        assert torch.allclose(g.double(), want, rtol=1e-6, atol=1e-7)
    # The Python executor's LAWA: the same sums in the same order, the same bits.
    module = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    mine = executor._Average({"type": "lawa", "k": 3, "every": 5}, module, task=None, device="cpu")
    for t, values in enumerate(steps):
        with torch.no_grad():
            for p, v in zip(module.parameters(), values):
                p.copy_(v)
        mine.update(t + 1, batches[t])
    cpp = run_peer(peer_program, tmp_path, "lawa:3:5", steps, batches)
    for a, b in zip(mine.averaged(), cpp):
        assert torch.equal(a, b)


def test_a_swept_trial_evaluates_its_average_as_swa_utils_does(tmp_path):
    """The Python executor's EMA (half-life 320 examples at batch 32: d =
    2^(-1/10)) against AveragedModel in a loop written out here; the
    target read on the averaged loss."""
    train, val = mixture()
    c = config(optimizer={"name": "adamw"}, batch_sizes=[32], search={"lr": [0.004]}, seeds=[3],
               budget={"steps": 60}, target={"metric": "val_loss", "threshold": 1e-9, "eval_every": 30},
               average={"type": "ema", "half_life": 320, "target_on": "averaged"})
    bigbatch.sweep(c, model=net(), out=tmp_path, train_data=train, val_data=val, loss=ce, error=wrong,
                   plots=False, args=["--no-prune"])
    trial = tmp_path / "py_exec" / "b32_p0_s3"
    with open(trial / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    got = [float(r["avg_val_loss"]) for r in rows]
    raw = [float(r["val_loss"]) for r in rows]
    summary = json.loads((trial / "summary.json").read_text())
    assert summary["best_metric"] == pytest.approx(min(got), rel=1e-9)  # the averaged loss decides (csv: 10 digits)
    assert summary["best_metric"] != pytest.approx(min(raw), rel=1e-6)
    options = json.loads((trial / "config.json").read_text())["optimizer"]
    options.pop("name")

    torch.manual_seed(3)
    model = copy.deepcopy(net())
    weights = [p for p in model.parameters() if p.dim() >= 2]
    biases = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": weights}, {"params": biases, "weight_decay": 0.0}], lr=0.004,
                            **{k: bigbatch._ops.decode(v, 0.0) for k, v in options.items()})
    ema = swa_utils.AveragedModel(model, multi_avg_fn=swa_utils.get_ema_multi_avg_fn(2.0 ** (-32 / 320)))
    want = train_by_hand(model, opt, train, val, steps=60, every=30, seed=3,
                         after_step=lambda step: ema.update_parameters(model), evaluated=ema.module)
    assert got == pytest.approx(want, rel=1e-6, abs=1e-7)
    assert all(abs(a - b) > 1e-4 for a, b in zip(got, raw))  # the average is not the trained weights
