"""bigbatch.optim over DTensor parameters: FSDP2's fully_shard (Shard(0) on a
mesh dimension) and HSDP (Replicate on the others) (docs/python.md).

The C++ optimizer never sees a DTensor. It steps, per parameter, a plain
tensor this module gives it, and the sharding of optimizers/ makes each
step the whole tensors' step:

- pieces (LARS, LARC, LAMB, NovoGrad, Lion, Schedule-Free): the tensor is the
  rank's local shard itself (an alias of the DTensor's local tensor, which
  the step writes in place), placed by where its first element lies in the
  whole tensor. The chunk sums of the norms (trust ratios, layer norms,
  clipping, the non-finite check) are added across the shard dimension's
  process group in one small all-reduce per reduce pass, so each tensor's
  norms are the whole tensor's; the moments are sharded as the parameter is.
- whole tensors (Muon, SOAP, Shampoo: an orthogonalization or a
  preconditioner needs the whole matrix): each tensor has an owner rank
  (the largest first, each to the rank holding the fewest elements, as
  distributed/sharded.h plans it), which alone keeps its state; before
  each step the owner gathers the tensor and its gradient, steps it whole,
  and scatters the rows back (as Dion and the distributed Muons do).

FSDP1's flat parameters are refused: each holds many tensors' elements and
a layer-wise optimizer's per-tensor norms cannot be taken from one.
"""
import math

import torch

CHUNK = 16384  # the fused engine's chunk (kernels/engine.h): norms are summed per chunk


def is_dtensor(t):
    return type(t).__name__ == "DTensor" or type(getattr(t, "data", None)).__name__ == "DTensor"


def refuse_flat(kind, params):
    for p in params:
        if getattr(p, "_is_flat_param", False):
            raise ValueError(f"bigbatch.optim.{kind}: FSDP1's flat parameters are refused: each holds many "
                             "tensors' elements, split across ranks, and the per-tensor norms of a layer-wise "
                             "optimizer cannot be taken from a shard (use_orig_params does not change that); "
                             "use FSDP2 (torch.distributed.fsdp.fully_shard)")


def _shard_dim(kind, index, p):
    """The mesh dimension p is sharded over (Shard(0)); the others must replicate."""
    from torch.distributed.tensor import Replicate, Shard
    dims = [d for d, pl in enumerate(p.placements) if isinstance(pl, Shard) and type(pl) is Shard and pl.dim == 0]
    others = [pl for d, pl in enumerate(p.placements) if d not in dims and not isinstance(pl, Replicate)]
    if len(dims) != 1 or others:
        raise ValueError(f"bigbatch.optim.{kind}: parameter {index} is a DTensor placed {tuple(p.placements)}; "
                         "bigbatch takes Shard(0) on one mesh dimension and Replicate on the others "
                         "(FSDP2's fully_shard, HSDP)")
    return dims[0]


def _local(p):
    return p._local_tensor


def _point(a, t):
    """Points `a` at t's elements (storage, offset, sizes and strides)."""
    with torch.no_grad():
        return a.set_(t.untyped_storage(), t.storage_offset(), t.size(), t.stride())


def _alias(t):
    """A tensor of its own over t's elements (the C++ optimizer keys its
    state by it), which _Pieces.refresh can point at new storage later."""
    return _point(torch.empty(0, dtype=t.dtype, device=t.device), t)


class _Sharding:
    """What both ways share: the parameters, their mesh and group."""

    def __init__(self, kind, params):
        import torch.distributed as dist
        self.kind, self.params = kind, params
        names = set()
        self.dims = []
        for i, p in enumerate(params):
            if not is_dtensor(p):
                raise ValueError(f"bigbatch.optim.{kind}: parameter {i} is a plain tensor among DTensor "
                                 "parameters; every parameter of one optimizer must be sharded the same way "
                                 "(fully_shard the root module too)")
            dim = _shard_dim(kind, i, p)
            self.dims.append(dim)
            names.add(p.device_mesh.get_group(dim).group_name)
        if len(names) != 1:
            raise ValueError(f"bigbatch.optim.{kind}: the parameters are sharded over {len(names)} process "
                             "groups; one optimizer takes the parameters of one mesh")
        self.group_name = names.pop()
        self.group = params[0].device_mesh.get_group(self.dims[0])
        self.rank, self.world = dist.get_rank(self.group), dist.get_world_size(self.group)

    def rows(self, p):
        """Rows per rank of p's dim 0 (torch.chunk's split, which DTensor's Shard(0) uses)."""
        return math.ceil(p.shape[0] / self.world)

    def local_value(self, index, value):
        """A state value given for parameter `index` as the C++ optimizer takes it."""
        return value

    def global_value(self, index, value):
        """A state value of parameter `index` as state() shows it."""
        return value

    def export_state(self, index, state):
        """Parameter `index`'s state (or None) as state_dict() gives it.
        Every rank calls it for every parameter, in order."""
        return state

    def import_state(self, index, state):
        """A state_dict's state of parameter `index` (or None) as this rank
        loads it. Every rank calls it for every parameter, in order."""
        return state


class _Pieces(_Sharding):
    """Each rank steps its shard; the norms' chunk sums are all-reduced."""

    def __init__(self, kind, params):
        super().__init__(kind, params)
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
        self.tensors = [_alias(_local(p)) for p in params]
        self.tensor_chunks, self.first_chunk = [], []
        for p in params:
            _, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
            row = math.prod(p.shape[1:])
            chunks = math.ceil(p.numel() / CHUNK)
            self.tensor_chunks.append(chunks)
            self.first_chunk.append(min(offset[0] * row // CHUNK, chunks))

    def refresh(self):
        """Points each alias at its DTensor's local tensor, which FSDP2 may
        have replaced (a load_state_dict, a module's _apply)."""
        for i, (p, a) in enumerate(zip(self.params, self.tensors)):
            t = _local(p)
            if (a.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() and
                    a.storage_offset() == t.storage_offset() and a.size() == t.size() and
                    a.stride() == t.stride()):
                continue
            if t.size() != a.size() or t.dtype != a.dtype or t.device != a.device:
                raise ValueError(f"bigbatch.optim.{self.kind}: parameter {i}'s local shard is now {t.dtype} "
                                 f"{tuple(t.size())} on {t.device}, it was {a.dtype} {tuple(a.size())} on "
                                 f"{a.device}; build the optimizer after sharding and moving the model")
            _point(a, t)

    def before_step(self):
        self.refresh()
        for p, a in zip(self.params, self.tensors):
            g = p.grad
            a.grad = None if g is None else (_local(g) if is_dtensor(g) else g)
        return self.tensors

    def after_step(self):
        for a in self.tensors:
            a.grad = None

    def local_value(self, index, value):
        if not is_dtensor(value):
            return value
        p = self.params[index]
        if tuple(value.placements) != tuple(p.placements) or value.shape != p.shape:
            raise ValueError(f"bigbatch.optim.{self.kind}: a state DTensor of parameter {index} is "
                             f"{tuple(value.shape)} placed {tuple(value.placements)}, the parameter "
                             f"{tuple(p.shape)} placed {tuple(p.placements)}")
        return _local(value)

    def global_value(self, index, value):
        """A field shaped like the local shard, as a DTensor placed as the
        parameter (what torch.distributed.checkpoint saves sharded)."""
        from torch.distributed.tensor import DTensor
        p, a = self.params[index], self.tensors[index]
        if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape != a.shape:
            return value
        return DTensor.from_local(value, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                  stride=p.stride())


class _Whole(_Sharding):
    """Each tensor stepped whole by its owner rank."""

    def __init__(self, kind, params):
        super().__init__(kind, params)
        load = [0] * self.world
        self.owner = [0] * len(params)
        for i in sorted(range(len(params)), key=lambda i: -params[i].numel()):  # stable: ties keep their order
            r = load.index(min(load))
            self.owner[i] = r
            load[r] += params[i].numel()
        # The owner's whole tensor; another rank's keeps the dimensions with none of the rows.
        self.tensors = [torch.zeros(tuple(p.shape) if r == self.rank else (0,) + tuple(p.shape[1:]),
                                    dtype=p.dtype, device=_local(p).device) for p, r in zip(params, self.owner)]
        self.tensor_chunks = [math.ceil(p.numel() / CHUNK) for p in params]
        self.first_chunk = [0] * len(params)

    def _padded(self, p, local):
        """This rank's rows of p (`local`), padded to rows(p): the parts of a gather or scatter."""
        return self._padded_rows(local, self.rows(p))

    def before_step(self):
        import torch.distributed as dist
        with torch.no_grad():
            for p, t, owner in zip(self.params, self.tensors, self.owner):
                # Under FSDP2 a gradient is there on every rank or on none.
                g = p.grad
                for local, into in ((_local(p), t), (None if g is None else _local(g) if is_dtensor(g) else g, None)):
                    if local is None:
                        t.grad = None
                        break
                    part = self._padded(p, local)
                    parts = [torch.empty_like(part) for _ in range(self.world)] if owner == self.rank else None
                    dist.gather(part, parts, group=self.group, group_dst=owner)
                    if owner != self.rank:
                        continue
                    whole = torch.cat(parts)[:p.shape[0]]
                    if into is None:
                        t.grad = whole
                    else:
                        into.copy_(whole)
        return self.tensors

    def after_step(self):
        import torch.distributed as dist
        with torch.no_grad():
            for p, t, owner in zip(self.params, self.tensors, self.owner):
                t.grad = None
                local = _local(p)
                part = torch.empty((self.rows(p),) + tuple(p.shape[1:]), dtype=local.dtype, device=local.device)
                rows = self.rows(p)
                parts = [self._padded(p, t[r * rows:(r + 1) * rows]) for r in range(self.world)] \
                    if owner == self.rank else None
                dist.scatter(part, parts, group=self.group, group_src=owner)
                local.copy_(part[:local.shape[0]])


    # ---------------------------------------------- the state, sharded ----
    # state_dict() gives each tensor field (the owner's whole tensor, of the
    # parameter's shape or of its own) as a DTensor cut in rows as the
    # parameter is, which torch.distributed.checkpoint saves sharded;
    # load_state_dict() gathers such fields back to the owner.

    def export_state(self, index, state):
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor
        p, owner = self.params[index], self.owner[index]
        if owner == self.rank:
            head = None if state is None else {
                k: (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) and v.dim() > 0 else v
                for k, v in state.items()}
        else:
            head = None
        box = [head]
        dist.broadcast_object_list(box, group=self.group, group_src=owner)
        if box[0] is None:
            return None
        out = {}
        for k, v in box[0].items():
            if not (isinstance(v, tuple) and len(v) == 2 and isinstance(v[1], torch.dtype)):
                out[k] = v
                continue
            shape, dtype = v
            rows = math.ceil(shape[0] / self.world)
            part = torch.empty((rows,) + shape[1:], dtype=dtype, device=_local(p).device)
            parts = None
            if owner == self.rank:
                parts = [self._padded_rows(state[k][r * rows:(r + 1) * rows], rows) for r in range(self.world)]
            dist.scatter(part, parts, group=self.group, group_src=owner)
            mine = max(0, min(rows, shape[0] - self.rank * rows))
            out[k] = DTensor.from_local(part[:mine].clone(), p.device_mesh, p.placements, run_check=False,
                                        shape=torch.Size(shape), stride=torch.empty(shape, device="meta").stride())
        return out

    def import_state(self, index, state):
        import torch.distributed as dist
        owner = self.owner[index]
        if state is None:
            return None
        out = {}
        for k in sorted(state):  # the same order on every rank
            v = state[k]
            if not is_dtensor(v):
                out[k] = v
                continue
            rows = math.ceil(v.shape[0] / self.world)
            part = self._padded_rows(_local(v), rows)
            parts = [torch.empty_like(part) for _ in range(self.world)] if owner == self.rank else None
            dist.gather(part, parts, group=self.group, group_dst=owner)
            out[k] = torch.cat(parts)[:v.shape[0]] if owner == self.rank else None
        return out if owner == self.rank else None

    @staticmethod
    def _padded_rows(t, rows):
        out = t.new_zeros((rows,) + tuple(t.shape[1:]))
        out[:t.shape[0]].copy_(t)
        return out


def plan(kind, params, whole):
    """The sharding of `params` (the optimizer's, in group order) for `kind`,
    or None where none is a DTensor."""
    refuse_flat(kind, params)
    if not any(is_dtensor(p) for p in params):
        return None
    return (_Whole if whole else _Pieces)(kind, params)
