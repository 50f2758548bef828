"""bigbatch's optimizers as torch.optim optimizers (docs/python.md).

Each class is a thin torch.optim.Optimizer over the C++ optimizer of the same
name (optimizers/*.h), which it holds through the operators of
python/csrc/ops.cpp: a step is one call of the custom operator bigbatch::step
with the parameters and each group's learning rate, and runs the C++ step
itself (the fused multi-tensor kernels on CPU or CUDA by default, the
reference path with fused=False), so a Python step and a C++ step of the same
tensors give the same bits. The options are the C++ options' names and
defaults; param_groups hold them as torch.optim's do, so a scheduler that
writes group["lr"] (or any other option) takes effect at the next step.

The state (moments, fp32 master copies, step counts, the skipped-step count)
lives in the C++ optimizer: state_dict() copies it out in torch.optim's
layout, load_state_dict() puts it back, and save()/load() read and write the
file torch::save(optimizer, path) of a C++ program reads and writes.

The classes are the library's registered optimizers (optimizers/kind.h), one
per kind, made here from what the operator library says of each: its options
with their defaults (the docstring lists them), those without a default, its
state fields. A class written out below adds what only its kind has (Muon's
update_rms); a new C++ optimizer appears here without a line of Python.
"""
import collections.abc

import torch
from torch.optim.optimizer import required as _REQUIRED  # torch.optim's marker of an option without a default

from . import _dtensor, _ops



def _plain(value):
    """A state value as state_dict() shows it: a count as an int, a number
    carried in double (Schedule-Free's weight sum) as a float, else the tensor."""
    if value.dim() == 0 and value.dtype == torch.int64:
        return int(value)
    if value.dim() == 0 and value.dtype == torch.float64:
        return float(value)
    return value


class _ParamState(collections.abc.MutableMapping):
    """One parameter's state (optimizer.state[p]), read from the C++
    optimizer on each access; a field written (state[p]["exp_avg"] = t) is
    checked as load_state_dict checks it and replaces the C++ optimizer's."""

    def __init__(self, optimizer, index):
        self._optimizer, self._index = optimizer, index

    def _now(self):
        return self._optimizer._state_at(self._index) or {}

    def __getitem__(self, name):
        return self._now()[name]

    def __setitem__(self, name, value):
        state = self._now()
        if not state:
            raise ValueError(f"bigbatch.optim.{self._optimizer._kind}: parameter {self._index} has no state before "
                             f"its first step to set '{name}' of; set a whole state (optimizer.state[p] = {{...}}) "
                             "or load a state_dict")
        state[name] = value
        self._optimizer._set_state_at(self._index, state)

    def __delitem__(self, name):
        raise ValueError(f"bigbatch.optim.{self._optimizer._kind}: a state field cannot be removed ('{name}'); "
                         "set a whole state or clear it (optimizer.state = {})")

    def __iter__(self):
        return iter(self._now())

    def __len__(self):
        return len(self._now())

    def __repr__(self):
        return repr(self._now())


class _StateView(collections.abc.MutableMapping):
    """optimizer.state: each parameter's state as the C++ optimizer holds it
    now (a copy of the step count, the tensors themselves), read on access;
    empty for one of its parameters before its first step (as torch.optim's
    defaultdict gives), which iteration and `in` leave out. Writes go to the
    C++ optimizer, checked: state[p] = {...} replaces a whole state,
    state[p][field] = value one field."""

    def __init__(self, optimizer):
        self._optimizer = optimizer

    def _index(self, param):
        index = self._optimizer._index_of(param)
        if index is None:
            raise KeyError(param)
        return index

    def __getitem__(self, param):
        return _ParamState(self._optimizer, self._index(param))

    def __setitem__(self, param, state):
        self._optimizer._set_state_at(self._index(param), dict(state))

    def __delitem__(self, param):
        _ops.ops.set_state(self._optimizer._handle, self._index(param), [], [])

    def __contains__(self, param):
        index = self._optimizer._index_of(param)
        return index is not None and self._optimizer._state_at(index) is not None

    def __iter__(self):
        for index, param in enumerate(self._optimizer._params()):
            if self._optimizer._state_at(index) is not None:
                yield param

    def __len__(self):
        return sum(1 for _ in self)


class _Optimizer(torch.optim.Optimizer):
    """What the classes share; a subclass names its C++ kind."""

    _kind = None

    def __init__(self, params, **options):
        self._handle = None
        self._sent = []
        defaults = _ops.loads(_ops.ops.default_options(self._kind))
        self._refuse_unknown(options, defaults)
        defaults.update(options)
        for key in _ops.ops.required_options(self._kind):  # torch.optim's own check, group by group
            if key not in options:
                defaults[key] = _REQUIRED
        self._shards = None
        super().__init__(params, defaults)
        groups = self.param_groups
        # DTensor parameters (FSDP2): the C++ optimizer steps tensors of
        # _dtensor's, sharded so that the norms are the whole tensors'.
        self._shards = _dtensor.plan(self._kind, self._params(), _ops.ops.whole_tensors(self._kind))
        sent_defaults = {k: v for k, v in defaults.items() if v is not _REQUIRED}
        self._handle = _ops.ops.create(self._kind, self._stepped(), [len(g["params"]) for g in groups],
                                       _ops.dumps(sent_defaults),
                                       "[" + ",".join(self._options_json(g) for g in groups) + "]")
        if self._shards is not None:
            _ops.ops.shard(self._handle, self._shards.tensor_chunks, self._shards.first_chunk,
                           self._shards.group_name)
        self._sent = [self._options_sent(g) for g in groups]

    # torch.optim.Optimizer.__init__ assigns self.state; the state is the C++ optimizer's.
    @property
    def state(self):
        return _StateView(self)

    @state.setter
    def state(self, value):
        """An empty mapping clears every parameter's state (`opt.state =
        defaultdict(dict)`, a common reset); anything else is refused."""
        if value:
            raise ValueError("bigbatch: the state is the C++ optimizer's; use load_state_dict()")
        if getattr(self, "_handle", None) is not None:
            for index in range(len(self._params())):
                _ops.ops.set_state(self._handle, index, [], [])

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle is not None and _ops is not None and _ops.ops is not None:
            try:
                _ops.ops.release(handle)
            except Exception:  # noqa: BLE001 - at interpreter exit the library may be gone
                pass

    def __getstate__(self):
        raise TypeError(f"bigbatch.optim.{self._kind} cannot be pickled; save its state_dict()")

    def _refuse_unknown(self, keys, options):
        """A ValueError naming the first of `keys` that is not one of `options`."""
        for key in keys:
            if key not in options:
                raise ValueError(f"{self._kind} has no option '{key}' (its options: {', '.join(sorted(options))})")

    def _params(self):
        return [p for g in self.param_groups for p in g["params"]]

    def _stepped(self):
        """The tensors the C++ optimizer steps, one per parameter: the
        parameters themselves, or _dtensor's for DTensor parameters."""
        return self._params() if self._shards is None else self._shards.tensors

    def _index_of(self, param):
        for index, p in enumerate(self._params()):
            if p is param:
                return index
        return None

    def _options_json(self, group):
        return _ops.dumps({k: group[k] for k in self.defaults})

    def _options_sent(self, group):
        """A group's options but lr (which every step sends), as last sent."""
        return _ops.dumps({k: group[k] for k in self.defaults if k != "lr"})

    def add_param_group(self, param_group):
        # A key that is not an option (timm's lr_scale, a scheduler's own) is
        # kept in the group as torch.optim keeps it, and not sent to C++.
        super().add_param_group(param_group)
        if self._handle is None:  # during __init__: the groups go to the C++ optimizer together
            return
        group = self.param_groups[-1]
        try:
            _dtensor.refuse_flat(self._kind, group["params"])
            if self._shards is not None or any(_dtensor.is_dtensor(p) for p in group["params"]):
                raise ValueError(f"bigbatch.optim.{self._kind}: a group of DTensor parameters (or a group "
                                 "added to an optimizer of them) must be given when the optimizer is made: "
                                 "its sharding is planned over all of them")
        except ValueError:
            self.param_groups.pop()
            raise
        try:
            _ops.ops.add_group(self._handle, group["params"], self._options_json(group))
        except Exception:
            self.param_groups.pop()
            raise
        self._sent.append(self._options_sent(group))

    def _sync_options(self):
        """Sends the options of every group whose options (but lr, which
        every step sends) changed since the last step."""
        for i, group in enumerate(self.param_groups):
            text = self._options_sent(group)
            if text != self._sent[i]:
                _ops.ops.set_group_options(self._handle, i, text)
                self._sent[i] = text

    def step(self, closure=None):
        """One step of every group (the C++ step); `closure`, if given, is
        called first with gradients enabled and its loss returned."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync_options()
        params = self._params()
        if not params:  # (empty groups: nothing to step, and no tensor to dispatch on)
            return loss
        with torch.no_grad():
            if self._shards is None:
                _ops.ops.step(self._handle, params, self._rates())
            else:
                try:
                    _ops.ops.step(self._handle, self._shards.before_step(), self._rates())
                finally:
                    self._shards.after_step()
        return loss

    def state_tensors(self):
        """Each parameter's state (in group order) as a dict of tensors that
        step_with() takes: copies of the moments, buffers and master copies,
        a count ("step") as a 0-dim int64 tensor, a number carried in double
        as a 0-dim float64 one; {} for a parameter without state."""
        out = []
        for index in range(len(self._params())):
            names, values = _ops.ops.state(self._handle, index)
            out.append({n: v.clone() for n, v in zip(names, values)})
        return out

    def step_with(self, params, grads, states):
        """One step of this optimizer's kind, with its groups' options and
        rates, on tensors the caller holds: `params` (written in place),
        `grads` (None for a parameter without a gradient) and `states` (one
        dict per parameter as state_tensors() gives it, written in place),
        each in the order of the optimizer's parameters. The optimizer's own
        parameters and state do not change. It is the operator
        bigbatch::step_with, whose schema names every tensor the step reads
        or writes: functionalization (torch.compile with any backend) and
        torch.library.opcheck see all of it (docs/python.md)."""
        if self._shards is not None:
            raise ValueError(f"bigbatch.optim.{self._kind}.step_with: an optimizer of DTensor parameters steps "
                             "with step() (its sharding is over its own parameters)")
        params, grads, states = list(params), list(grads), list(states)
        n = len(self._params())
        if not len(params) == len(grads) == len(states) == n:
            raise ValueError(f"bigbatch.optim.{self._kind}.step_with: {len(params)} parameters, {len(grads)} "
                             f"gradients and {len(states)} states for an optimizer of {n} parameters")
        self._sync_options()
        tensors, fields, owners = [], [], []
        for index, state in enumerate(states):
            for name, value in state.items():
                if not isinstance(value, torch.Tensor):
                    raise ValueError(f"bigbatch.optim.{self._kind}.step_with: field '{name}' of parameter {index} "
                                     f"is a {type(value).__name__}; the step writes it in place, so it must be a "
                                     "tensor (a count a 0-dim int64 one), as state_tensors() gives it")
                tensors.append(value)
                fields.append(name)
                owners.append(index)
        with torch.no_grad():
            _ops.ops.step_with(self._handle, params, grads, tensors, fields, owners, self._rates())

    def _rates(self):
        """The groups' rates as one float64 tensor. A rate that is a tensor
        (lr=torch.tensor(0.01), which LR schedulers update in place) stays
        one: torch.compile(opt.step) then takes each new rate as an input, and
        a scheduler's every step does not compile the step again."""
        rates = [g["lr"] for g in self.param_groups]
        if any(isinstance(r, torch.Tensor) for r in rates):
            return torch.stack([torch.as_tensor(r).to(device="cpu", dtype=torch.float64).reshape(()) for r in rates])
        return torch.tensor([float(r) for r in rates], dtype=torch.float64)

    # ------------------------------------------------------------- state ----

    def _state_entries(self, index, state):
        """A state mapping as the operators take it: names, and values (a
        copy of each tensor on the parameter's device; an integer as a 0-dim
        int64 tensor)."""
        names, values = [], []
        param = self._stepped()[index]
        for name, v in state.items():
            names.append(name)
            if self._shards is not None:
                v = self._shards.local_value(index, v)
            if isinstance(v, torch.Tensor):
                values.append(v.detach().to(device=param.device, copy=True, memory_format=torch.contiguous_format))
            elif isinstance(v, int) or (hasattr(v, "dtype") and hasattr(v, "item") and isinstance(v.item(), int)):
                values.append(torch.tensor(int(v), dtype=torch.int64))
            elif isinstance(v, float):
                values.append(torch.tensor(v, dtype=torch.float64))
            else:
                raise ValueError(f"bigbatch.optim.{self._kind}: state field '{name}' of parameter {index} "
                                 f"is a {type(v).__name__}, not a tensor, an integer or a float")
        return names, values

    def _set_state_at(self, index, state):
        """Replaces parameter `index`'s whole state by `state`, checked first
        (ValueError naming the field; nothing changes then)."""
        names, values = self._state_entries(index, state)
        _ops.ops.check_state(self._handle, index, names, values)
        _ops.ops.set_state(self._handle, index, names, values)

    def _state_at(self, index):
        names, values = _ops.ops.state(self._handle, index)
        if not names:
            return None
        if self._shards is not None:
            values = [self._shards.global_value(index, v) for v in values]
        return {n: _plain(v) for n, v in zip(names, values)}

    def state_dict(self):
        """torch.optim's layout: {"state": {index: {field: value}},
        "param_groups": [{options..., "params": [indices]}]}, plus
        "bigbatch": {"kind", "skipped_steps", "training"}. The tensors are the optimizer's
        own (torch.save copies them, as it does for torch.optim). The state
        dict hooks of torch.optim run as they do there."""
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        self._sync_options()
        state = {}
        for index in range(len(self._params())):
            s = self._state_at(index)
            if self._shards is not None:  # (a collective for whole tensors: every rank, every index)
                s = self._shards.export_state(index, s)
            if s is not None:
                state[index] = s
        groups = []
        start = 0
        for g in self.param_groups:
            entry = {k: v for k, v in g.items() if k != "params"}
            entry["params"] = list(range(start, start + len(g["params"])))
            start += len(g["params"])
            groups.append(entry)
        state_dict = {"state": state, "param_groups": groups,
                      "bigbatch": {"kind": self._kind, "skipped_steps": self.skipped_steps(),
                                   "training": _ops.ops.is_training(self._handle)}}
        for post_hook in self._optimizer_state_dict_post_hooks.values():
            result = post_hook(self, state_dict)
            if result is not None:
                state_dict = result
        return state_dict

    def load_state_dict(self, state_dict):
        """Loads what state_dict() gave (of an optimizer of the same kind and
        group sizes): the groups' options, each parameter's state (moved to
        the parameter's device), the skipped-step count. Everything is
        checked before anything changes: a refused state_dict (ValueError,
        naming what is wrong) leaves the optimizer as it was."""
        state_dict = dict(state_dict)
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = pre_hook(self, state_dict)
            if result is not None:
                state_dict = result
        # Its "bigbatch" entry names the kind and the skipped-step count; a
        # state_dict without it (one that went through torch.distributed.
        # checkpoint, which keeps "state" and "param_groups") is checked by
        # its fields alone, and the count stays as it is.
        ours = state_dict.get("bigbatch")
        if ours is not None and (not isinstance(ours, dict) or "kind" not in ours):
            raise ValueError(f"bigbatch.optim.{self._kind}: the state_dict's \"bigbatch\" entry is not "
                             f"{{\"kind\": ..., \"skipped_steps\": ...}}: {ours!r}")
        if ours is not None and ours["kind"] != self._kind:
            raise ValueError(f"bigbatch.optim.{self._kind}: the state_dict is a {ours['kind']}'s")
        saved = state_dict["param_groups"]
        sizes = [len(g["params"]) for g in self.param_groups]
        if [len(g["params"]) for g in saved] != sizes:
            raise ValueError(f"bigbatch.optim.{self._kind}: the state_dict's groups hold "
                             f"{[len(g['params']) for g in saved]} parameters, this optimizer's {sizes}")
        # Check: every group's options, every parameter's state.
        for entry in saved:
            _ops.ops.check_options(self._kind, _ops.dumps({k: v for k, v in entry.items() if k in self.defaults}))
        old_index = [i for g in saved for i in g["params"]]
        states = []
        for index in range(len(self._params())):
            s = state_dict["state"].get(old_index[index])
            if self._shards is not None:
                s = self._shards.import_state(index, s)
            names, values = [], []
            if s is not None:
                names, values = self._state_entries(index, s)
                _ops.ops.check_state(self._handle, index, names, values)
            states.append((names, values))
        # Apply.
        for group, entry in zip(self.param_groups, saved):
            for k, v in entry.items():
                if k != "params":
                    group[k] = v
        self._sync_options()
        for index, (names, values) in enumerate(states):
            _ops.ops.set_state(self._handle, index, names, values)
        if ours is not None:
            _ops.ops.set_skipped_steps(self._handle, int(ours.get("skipped_steps", 0)))
            # The parameters saved beside it are at that mode's point (Schedule-Free's x or y).
            _ops.ops.train(self._handle, bool(ours.get("training", True)), False)
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)

    def save(self, path):
        """Writes the optimizer as torch::save(optimizer, path) does in C++."""
        self._sync_options()
        for i, g in enumerate(self.param_groups):  # the rates the next step would use
            _ops.ops.set_group_options(self._handle, i, _ops.dumps({"lr": g["lr"]}))
        _ops.ops.save(self._handle, str(path))

    def load(self, path):
        """Reads a file that torch::save(optimizer, path) wrote, in C++ or by
        save(): the state and every group's options, which param_groups then show."""
        _ops.ops.load(self._handle, str(path))
        for i, g in enumerate(self.param_groups):
            g.update(_ops.loads(_ops.ops.group_options(self._handle, i), like=self.defaults))
        self._sent = [self._options_sent(g) for g in self.param_groups]

    # --------------------------------------------------------- what it saw ----

    def skipped_steps(self):
        """Steps that changed nothing because a gradient was inf or NaN (skip_nonfinite)."""
        return _ops.ops.skipped_steps(self._handle)

    def trust_ratios(self):
        """(parameter, ratio) for each parameter of a group that adapts, in
        group order: the ratio its last update was scaled by (LARS's and
        LAMB's, LARC's clipped local rate over lr). Empty before the first
        step, after a skipped one, and for NovoGrad."""
        params = self._params()
        indices, ratios = _ops.ops.trust_ratios(self._handle)
        return [(params[i], r) for i, r in zip(indices, ratios)]

    def state_bytes(self):
        """Bytes of the state this optimizer holds (moments, buffers, master copies)."""
        return _ops.ops.state_bytes(self._handle)

    # ------------------------------------------------- the two points ----

    def train(self, mode=True):
        """Puts the parameters at the point steps are taken from (mode True)
        or, mode False, at the point to evaluate: Schedule-Free's y and x (the
        authors' optimizer.train() / optimizer.eval()). For the other kinds
        the two points are one and only the mode changes. step() in
        evaluation mode raises."""
        self._sync_options()
        with torch.no_grad():
            _ops.ops.train(self._handle, bool(mode), True)
        return self

    def eval(self):
        """train(False): the parameters at the point to evaluate."""
        return self.train(False)

    @property
    def training(self):
        """Whether the parameters are at the training point (train() was last)."""
        return _ops.ops.is_training(self._handle)


class Muon(_Optimizer):
    """Muon (Jordan et al. 2024) with AdamW for the groups with
    orthogonalize=False; muon_param_groups() makes the usual split."""
    _kind = "Muon"

    def update_rms(self):
        """(parameter, RMS of its last orthogonalized update) for each matrix
        of an orthogonalized group; empty before the first step."""
        params = self._params()
        indices, rms = _ops.ops.update_rms(self._handle)
        return [(params[i], r) for i, r in zip(indices, rms)]


def _options_doc(kind):
    """The options of `kind` and their defaults, as its docstring lists them."""
    defaults = _ops.loads(_ops.ops.default_options(kind))
    required = set(_ops.ops.required_options(kind))
    return ", ".join(key if key in required else f"{key}={defaults[key]!r}" for key in sorted(defaults))


def _classes():
    """One class per registered kind: the written-out ones above, else a plain one."""
    written = {cls._kind: cls for cls in (Muon,)}
    out = {}
    for kind in _ops.ops.kinds():
        cls = written.get(kind)
        if cls is None:
            cls = type(kind, (_Optimizer,), {"_kind": kind, "__module__": __name__, "__qualname__": kind,
                                             "__doc__": f"bigbatch's {kind} (optimizers/, docs/optimizers.md)."})
        required = ", ".join(_ops.ops.required_options(kind))
        cls.__doc__ = (f"{cls.__doc__}\n\n    Options (the C++ {kind}Options, same names and defaults"
                       f"{'; ' + required + ' required' if required else ''}):\n    {_options_doc(kind)}")
        out[kind] = cls
    return out


globals().update(_classes())
__all__ = list(_ops.ops.kinds()) + ["layerwise_param_groups", "muon_param_groups"]


# ------------------------------------------------------------ the groups ----

def layerwise_param_groups(model, plain=None, **options):
    """The two groups of large-batch training: the weights (with `options`),
    and the parameters `plain` says yes to (default: those of 0 or 1
    dimensions, biases and normalization parameters) with `options` but no
    weight decay and no trust ratio (weight_decay=0, adapt=False). Empty
    groups are left out. As optimizers/param_groups.h does in C++."""
    plain = plain or (lambda p: p.dim() < 2)
    weights, others = [], []
    for p in model.parameters():
        if p.requires_grad:
            (others if plain(p) else weights).append(p)
    groups = []
    if weights:
        groups.append({"params": weights, **options})
    if others:
        groups.append({"params": others, **options, "weight_decay": 0.0, "adapt": False})
    return groups


def muon_param_groups(model, **options):
    """Muon's usual split, as muon_param_groups() does in C++: the hidden
    matrices (2 or more dimensions) orthogonalized with `options`; the
    weights of nn.Embedding modules and of the first and the last module with
    parameters of its own (input layer and head) by AdamW with the decay;
    the parameters of 0 or 1 dimensions by AdamW without decay."""
    owners = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    edge = set()
    if owners:
        for m in (owners[0], owners[-1]):
            edge.update(id(p) for p in m.parameters(recurse=False))
    for m in model.modules():
        if isinstance(m, torch.nn.Embedding):
            edge.update(id(p) for p in m.parameters(recurse=False))
    hidden, adamw, plain = [], [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        if p.dim() < 2:
            plain.append(p)
        elif id(p) in edge:
            adamw.append(p)
        else:
            hidden.append(p)
    groups = []
    if hidden:
        groups.append({"params": hidden, **options})
    if adamw:
        groups.append({"params": adamw, **options, "orthogonalize": False})
    if plain:
        groups.append({"params": plain, **options, "orthogonalize": False, "weight_decay": 0.0})
    return groups
