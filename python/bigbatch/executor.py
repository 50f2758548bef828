"""The Python trial executor (docs/python.md "Sweeps of any nn.Module"):
trains the trials of a sweep on the user's nn.Module and data, in this
process, while the bigbatch program keeps the sweep (claims, order,
pruning, stop rules, every trial file, the tables): the program sends a
trial with its rates and batch sizes per step, says how far to train before
each evaluation, and decides from each evaluation whether the trial goes on.
The protocol is in experiments/sweep/executor.h. No TorchScript: any module
that trains in eager PyTorch sweeps."""
import collections
import copy
import json
import math
import os
import platform
import time

import torch

from . import _ops
from . import optim as _optim


class Channel:
    """One JSON object per line, over two pipes' file descriptors."""

    def __init__(self, read_fd, write_fd):
        self._in = os.fdopen(read_fd, "r", encoding="utf-8", newline="\n")
        self._out = os.fdopen(write_fd, "w", encoding="utf-8", newline="\n")

    def send(self, message):
        self._out.write(json.dumps(message, allow_nan=False) + "\n")
        self._out.flush()

    def receive(self):
        """The next message; None once the program has closed its end."""
        line = self._in.readline()
        return json.loads(line) if line else None

    def close(self):
        for f in (self._out, self._in):
            try:
                f.close()
            except OSError:
                pass


def _finite_or_none(x):
    return x if x is not None and math.isfinite(x) else None


# ------------------------------------------------------------ the task ----

def default_loss(output, target):
    """As the C++ runner's task: cross-entropy for class indices (over the
    last dimension; a sequence's positions averaged), else the squared error
    summed over an example's values; the mean over the batch."""
    if not target.is_floating_point():
        return torch.nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]).float(), target.reshape(-1))
    return (output.float() - target.float()).pow(2).reshape(output.shape[0], -1).sum(1).mean()


def argmax_error(output, target):
    """The fraction misclassified: argmax over the last dimension against the class indices."""
    return (output.argmax(-1) != target).float().mean()


class Task:
    """What the executor trains: the module (a copy per trial, from the
    weights it had when the sweep was asked for), the training set with the
    user's DataLoader settings, the validation loader, the loss and the
    validation metrics (each a batch mean, weighted by batch size over the
    split)."""

    def __init__(self, model, train_data, val_data, loss=None, error="argmax", metrics=None):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"bigbatch.sweep: model must be a torch.nn.Module, got {type(model).__name__}")
        self.template = copy.deepcopy(model)
        loader = train_data if isinstance(train_data, torch.utils.data.DataLoader) else None
        self.dataset = loader.dataset if loader is not None else train_data
        if isinstance(self.dataset, torch.utils.data.IterableDataset) or not hasattr(self.dataset, "__getitem__"):
            raise ValueError("bigbatch.sweep: train_data must be a map-style dataset (or a DataLoader over one): "
                             "the sweep draws each step's batch of the trial's size by index")
        try:
            self.train_size = len(self.dataset)
        except TypeError as e:
            raise ValueError("bigbatch.sweep: train_data's dataset has no len()") from e
        self.loader_options = {}
        if loader is not None:  # the user's settings, but the batches, which each trial's sizes make
            self.loader_options = {"collate_fn": loader.collate_fn, "num_workers": loader.num_workers,
                                   "pin_memory": loader.pin_memory, "worker_init_fn": loader.worker_init_fn,
                                   "timeout": loader.timeout,
                                   "multiprocessing_context": loader.multiprocessing_context}
            if loader.num_workers > 0:
                self.loader_options["prefetch_factor"] = loader.prefetch_factor
        if val_data is None:
            raise ValueError("bigbatch.sweep: val_data is needed with train_data: each evaluation measures it")
        self.val_loader = (val_data if isinstance(val_data, torch.utils.data.DataLoader)
                           else torch.utils.data.DataLoader(val_data, batch_size=256))
        try:
            self.val_size = len(self.val_loader.dataset)
        except TypeError as e:
            raise ValueError("bigbatch.sweep: val_data's dataset has no len()") from e
        self.loss = loss or default_loss
        self.error = argmax_error if error == "argmax" else error
        if self.error is not None and not callable(self.error):
            raise ValueError(f"bigbatch.sweep: error must be \"argmax\", a callable or None, got {error!r}")
        self.metrics = dict(metrics or {})
        for name, fn in self.metrics.items():
            if not isinstance(name, str) or not name.replace("_", "").isalnum() or not callable(fn):
                raise ValueError(f"bigbatch.sweep: metrics: each a name (letters, digits, '_') and a callable, "
                                 f"got {name!r}")


# ------------------------------------------------------ the optimizer ----

def _plain_rule(module):
    """The C++ runner's plain parameters (no decay, no trust ratio): those
    of 0 or 1 dimensions and embedding tables."""
    tables = {id(m.weight) for m in module.modules() if isinstance(m, torch.nn.Embedding)}
    return lambda p: p.dim() < 2 or id(p) in tables


def make_optimizer(spec, module, lr):
    """The optimizer a trial config's "optimizer" names, over the groups the
    C++ runner makes (experiments/optim): torch's SGD, Adam and AdamW, or
    bigbatch's (the same C++ optimizer the runner steps)."""
    keys = {k: v for k, v in spec.items() if k != "name"}
    name = spec["name"]
    plain = _plain_rule(module)
    torch_classes = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    if name in torch_classes:  # the runner's keys are torch's own (experiments/optim/sgd.cpp, adam.cpp)
        decayed = [p for p in module.parameters() if p.requires_grad and not plain(p)]
        others = [p for p in module.parameters() if p.requires_grad and plain(p)]
        groups = [g for g in ({"params": decayed}, {"params": others, "weight_decay": 0.0}) if g["params"]]
        return torch_classes[name](groups, lr=lr, **keys)
    classes = {kind.lower(): getattr(_optim, kind) for kind in _ops.ops.kinds()}
    if name not in classes:
        raise ValueError(f"optimizer.name: '{name}' is not one the Python executor knows "
                         f"(sgd, adam, adamw, {', '.join(classes)})")
    if keys.pop("momentum_correction", False):
        raise ValueError("optimizer.momentum_correction: the Python executor's LARS has no momentum correction; "
                         "leave it out or run the sweep with the C++ trainer")
    defaults = _ops.loads(_ops.ops.default_options(classes[name]._kind))
    keys = {k: _ops.decode(v, defaults.get(k)) for k, v in keys.items()}
    if name == "muon":
        groups = _optim.muon_param_groups(module, **keys)
    else:
        groups = _optim.layerwise_param_groups(module, plain, **keys)
    return classes[name](groups, lr=lr, **keys)


# ------------------------------------------------------------- a trial ----

class _Batches(torch.utils.data.Sampler):
    """The trial's batches by index: step t's of the size the schedule gives
    it, drawn in order from a permutation of the training set per epoch (a
    new one when the epoch has fewer left than the batch), seeded by the
    trial's seed."""

    def __init__(self, n, sizes, budget, seed, start=0):
        self.n, self.sizes, self.budget, self.seed, self.start = n, sizes, budget, seed, start

    def __len__(self):
        return self.budget - self.start

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        order, at, k = torch.randperm(self.n, generator=g), 0, 0
        for t in range(self.budget):
            while k + 1 < len(self.sizes) and self.sizes[k + 1][0] <= t:
                k += 1
            b = self.sizes[k][1]
            if at + b > self.n:
                order, at = torch.randperm(self.n, generator=g), 0
            if t >= self.start:  # (a branch's: the batches after its point)
                yield order[at:at + b].tolist()
            at += b


def _batch_at(sizes, step):
    """The batch size of step `step` (from 0) of a trial's [[first step, size], ...]."""
    return next(b for first, b in reversed(sizes) if first <= step)


def _to(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to(v, device) for k, v in batch.items()}
    return batch


def _split(batch):
    """(input, target) of a batch: a pair, or a dict with "input" and "target"."""
    if isinstance(batch, dict):
        return batch["input"], batch["target"]
    if isinstance(batch, (list, tuple)) and len(batch) == 2:
        return batch[0], batch[1]
    raise ValueError("bigbatch.sweep: a batch must be (input, target) or a dict with \"input\" and \"target\", "
                     f"got {type(batch).__name__}")


def _evaluate(task, module, device):
    """The validation split's mean loss, error and metrics, in eval mode."""
    was = module.training
    module.eval()
    n, loss, error, metrics = 0, 0.0, 0.0, {k: 0.0 for k in task.metrics}
    with torch.no_grad():
        for batch in task.val_loader:
            x, y = _split(_to(batch, device))
            out = module(x)
            b = len(y)
            loss += float(task.loss(out, y)) * b
            if task.error is not None:
                error += float(task.error(out, y)) * b
            for k, fn in task.metrics.items():
                metrics[k] += float(fn(out, y)) * b
            n += b
    module.train(was)
    if n == 0:
        raise ValueError("bigbatch.sweep: val_data gave no examples")
    return loss / n, (error / n if task.error is not None else None), {k: v / n for k, v in metrics.items()}


# Training rows BatchNorm statistics are recomputed from at an average,
# in batches of _NORM_ROWS: the C++ trainer's kNormStatisticsRows, kNormRows.
_NORM_STATISTICS_ROWS, _NORM_ROWS = 2048, 256


class _Average:
    """A trial's "average" (docs/experiments.md "Weight averaging"): EMA
    through torch.optim.swa_utils.AveragedModel (buffers following the
    trained module's, its use_buffers=False), with d = 2^(-B/h) per step for
    a half-life h in examples; or LAWA, the mean of the last k snapshots
    taken every `every` steps, summed oldest first and divided by their
    count, as the C++ trainer's optim::WeightAverage. Evaluated with
    BatchNorm statistics recomputed at the average by swa_utils.update_bn
    over the first 2048 training examples, as the C++ trainer does."""

    def __init__(self, spec, module, task, device):
        self.spec, self.module, self.task, self.device = spec, module, task, device
        self.decay = spec.get("decay")
        if spec["type"] == "ema":
            self.holder = torch.optim.swa_utils.AveragedModel(
                module, multi_avg_fn=lambda a, c, n: torch.optim.swa_utils.get_ema_multi_avg_fn(self.decay)(a, c, n))
        else:
            self.holder = torch.optim.swa_utils.AveragedModel(module)  # its parameters set from the snapshots
            self.snapshots = collections.deque(maxlen=int(spec["k"]))
        self.ready = False

    def branch(self, module):
        """A copy following `module` (a copy of this one's), for a horizon
        branched off the trial: the average so far, its own from now on."""
        other = copy.copy(self)
        other.module = module
        other.holder = copy.deepcopy(self.holder)
        if self.spec["type"] == "ema":
            other.holder.multi_avg_fn = (
                lambda a, c, n: torch.optim.swa_utils.get_ema_multi_avg_fn(other.decay)(a, c, n))
        else:
            other.snapshots = collections.deque((list(x) for x in self.snapshots), maxlen=self.snapshots.maxlen)
        return other

    def update(self, step, batch):
        """After optimizer step `step` (from 1) of `batch` examples."""
        if self.spec["type"] == "ema":
            if "half_life" in self.spec:
                self.decay = 2.0 ** (-batch / self.spec["half_life"])
            self.holder.update_parameters(self.module)
            self.ready = True
        elif step % int(self.spec["every"]) == 0:
            self.snapshots.append([p.detach().clone() for p in self.module.parameters()])
            self.ready = True

    def averaged(self):
        """The averaged tensors, in the module's parameter order."""
        if self.spec["type"] == "ema":
            return [p.detach() for p in self.holder.module.parameters()]
        out = []
        for i in range(len(self.snapshots[0])):
            total = self.snapshots[0][i].clone()
            for s in list(self.snapshots)[1:]:
                total.add_(s[i])
            out.append(total.div_(len(self.snapshots)))
        return out

    def evaluate(self):
        """(loss, error) of the averaged weights on the validation split."""
        model = self.holder.module
        with torch.no_grad():
            if self.spec["type"] == "lawa":
                for p, a in zip(model.parameters(), self.averaged()):
                    p.copy_(a)
                for b, t in zip(model.buffers(), self.module.buffers()):
                    b.copy_(t)
        if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            rows = torch.utils.data.Subset(self.task.dataset, range(min(_NORM_STATISTICS_ROWS, self.task.train_size)))
            collate = self.task.loader_options.get("collate_fn")
            loader = torch.utils.data.DataLoader(rows, batch_size=_NORM_ROWS, collate_fn=collate)
            torch.optim.swa_utils.update_bn((_to(_split(b)[0], self.device) for b in loader), model)
        loss, error, _ = _evaluate(self.task, model, self.device)
        return loss, error


def _random_state():
    """torch's random state: the CPU generator's, and each GPU's once CUDA is in use."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _set_random_state(state):
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])


def _horizon(order):
    """Whether `order` is a horizon's run, branched from the trial in training ("from")."""
    return order is not None and "run" in order and "from" in order["run"]


def _executor_record():
    return {"name": "python", "torch": torch.__version__, "python": platform.python_version()}


def _error_line(e):
    line = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {line}" if line else type(e).__name__


def run_trial(spec, channel, task, parent=None):
    """Trains one trial as the program directs, answering each "go" with an
    evaluation (or "diverged"); returns when the program says "stop". An
    exception of the user's code is sent as the trial's error, in answer to
    an order (the program may end the trial before its first). Every message
    names its trial, so the program never takes one for another trial's.

    A "run" with "from" while this trial trains is one of its horizons: run
    here, from `parent`, this trial's state at that step (a copy of its
    module, optimizer, average and random state, and its batches from
    there), as the C++ trainer restores a branch from its checkpoint."""
    config = spec["config"]
    name = spec["trial"]
    budget, lrs, sizes = spec["budget"], spec["lr"], spec["batch_size"]
    threads = torch.get_num_threads()
    batches = loader = None

    def send(kind, body):
        channel.send({kind: body, "trial": name})

    try:
        try:
            torch.set_num_threads(max(1, int(spec.get("threads", 1))))
            device = torch.device("cuda" if config.get("device") == "cuda" else "cpu")
            base = config["schedule"]["base_lr"]  # each group's rate over it: its ratio, as the C++ LRAdapter's
            if parent is None:
                torch.manual_seed(config["seed"])  # the module's own randomness (dropout), as the C++ trainer seeds
                module = copy.deepcopy(task.template).to(device)
                module.train()
            else:
                if spec["from"] != parent["step"]:
                    raise RuntimeError(f"a horizon branched at step {spec['from']} of a trial at {parent['step']}")
                module = copy.deepcopy(parent["module"])
            opt = make_optimizer(config["optimizer"], module, base)
            ratios = [g["lr"] / base for g in opt.param_groups]  # (before a parent's state brings its trial's rate)
            if parent is None:
                average = _Average(config["average"], module, task, device) if "average" in config else None
                step = 0
            else:
                opt.load_state_dict(copy.deepcopy(parent["optimizer"].state_dict()))  # (loading aliases tensors)
                average = parent["average"].branch(module) if parent["average"] is not None else None
                step = spec["from"]
            sampler = _Batches(task.train_size, sizes, budget, config["seed"], step)
            loader = torch.utils.data.DataLoader(task.dataset, batch_sampler=sampler, **task.loader_options)
            batches = iter(loader)
            if parent is not None:  # after the loader drew its workers' seed, which the trial drew at step 0
                _set_random_state(parent["random"])
        except Exception as e:  # noqa: BLE001 - the user's code (the module's copy, the dataset): the trial fails
            while True:  # the error goes in answer to the trial's order, and to each horizon's
                order = channel.receive()
                if _horizon(order):
                    channel.send({"error": _error_line(e), "trial": order["run"]["trial"]})
                    continue
                if order is not None and "go" in order:
                    send("error", _error_line(e))
                return
        start = time.monotonic() - (0.0 if parent is None else parent["elapsed"])
        loss_sum, losses = (0.0, 0) if parent is None else (parent["loss_sum"], parent["losses"])
        waited, stepped, last_report = 0.0, 0.0, 0.0
        data = {"loader_threads": task.loader_options.get("num_workers", 0), "wait_fraction": None}
        while True:
            order = channel.receive()
            if _horizon(order):  # from here
                random = _random_state()
                run_trial(order["run"], channel, task,
                          {"module": module, "optimizer": opt, "average": average, "random": random, "step": step,
                           "loss_sum": loss_sum, "losses": losses, "elapsed": time.monotonic() - start})
                _set_random_state(random)
                continue
            if order is None or "go" not in order:  # "stop", or the program gone
                return
            try:
                until = order["go"]
                while step < until:
                    for group, ratio in zip(opt.param_groups, ratios):
                        group["lr"] = lrs[step] * ratio
                    t0 = time.monotonic()
                    x, y = _split(_to(next(batches), device))
                    t1 = time.monotonic()
                    opt.zero_grad(set_to_none=True)
                    loss = task.loss(module(x), y)
                    loss.backward()
                    opt.step()
                    if average is not None:
                        average.update(step + 1, _batch_at(sizes, step))
                    value = float(loss.detach())
                    stepped += time.monotonic() - t0
                    waited += t1 - t0
                    step += 1
                    data["wait_fraction"] = waited / stepped if stepped > 0 else None
                    now = time.monotonic() - start
                    if not math.isfinite(value):
                        send("diverged", {"step": step, "wall_time": now, "data": data,
                                          "executor": _executor_record()})
                        return
                    loss_sum += value
                    losses += 1
                    if now - last_report > 0.5 or step == budget:
                        last_report = now
                        send("progress", {"step": step, "loss": value, "steps_per_second": step / max(now, 1e-9)})
                if not order.get("evaluate", True):  # to a horizon's branch point
                    send("stepped", {"step": step})
                    continue
                evaluating = hasattr(opt, "eval") and callable(opt.eval)  # Schedule-Free's evaluation point
                if evaluating:
                    opt.eval()
                val_loss, val_error, metrics = _evaluate(task, module, device)
                if evaluating:
                    opt.train()
                averaged = average.evaluate() if average is not None and average.ready else None
            except Exception as e:  # noqa: BLE001 - the user's code: the trial fails with its message, the sweep goes on
                send("error", _error_line(e))
                return
            result = {"step": step, "train_loss": _finite_or_none(loss_sum / max(losses, 1)),
                      "val_loss": _finite_or_none(val_loss), "val_error": _finite_or_none(val_error),
                      "metrics": {k: _finite_or_none(v) for k, v in metrics.items()},
                      "wall_time": time.monotonic() - start, "data": data, "executor": _executor_record()}
            if averaged is not None:
                result["avg_val_loss"], result["avg_val_error"] = (_finite_or_none(v) for v in averaged)
            send("eval", result)
            loss_sum, losses = 0.0, 0
    finally:
        # The loader's workers go now, whatever ended the trial: forked, they
        # hold the pipe to the program, which would wait for them.
        del batches, loader
        torch.set_num_threads(threads)


def serve(channel, task):
    """Trains each trial the program sends, until it closes its end."""
    while True:
        message = channel.receive()
        if message is None:
            return
        if "run" in message:
            run_trial(message["run"], channel, task)
        # anything else: what was meant for a trial that has ended (a "go"
        # sent while its error was on the way): nothing to do
