"""bigbatch.optim under FSDP2 (fully_shard) on W Gloo ranks of this machine,
against the same optimizer stepping the unsharded model in each rank.

Each rank trains on its own batch; after each backward the whole averaged
gradient (each DTensor gradient's full_tensor()) is given to the unsharded
twin, so the two optimizers see the same gradients and parameters and any
difference is the sharded step's. The model has a weight whose rank pieces
start inside a chunk of 16384 elements (the norms' unit), a layer with
fewer rows than ranks (an empty shard at 4 ranks) and biases.

Then, for the first kind and Muon, the optimizer's state goes through
torch.distributed.checkpoint (get/set_optimizer_state_dict, dcp.save and
dcp.load to a folder) into a fresh sharded optimizer, which must continue
as the saved one does.

Usage: fsdp_ranks.py WORLD KIND [KIND...]; prints one JSON line from rank 0:
{kind: {"max_abs": largest |sharded - unsharded| over every parameter after
each step, "steps": n, "ratio_rel": the largest relative difference of the
trust ratios, "ratios": how many the last step had}, "dcp": {kind: {"continues":
whether the loaded optimizer went on as the saved one, "field_types"}}}.
Run by test_optim.py, which joins the processes it starts."""
import json
import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STEPS = 3
OPTIONS = {
    "LARS": {"lr": 0.5, "weight_decay": 1e-3, "momentum": 0.9},
    "LARC": {"lr": 0.5, "weight_decay": 1e-3, "momentum": 0.9},
    "LAMB": {"lr": 1e-2, "weight_decay": 0.01},
    "NovoGrad": {"lr": 1e-2, "weight_decay": 0.01},
    "Lion": {"lr": 1e-3, "weight_decay": 0.1},
    "Muon": {"lr": 2e-2, "weight_decay": 0.01},
    "SOAP": {"lr": 3e-3, "weight_decay": 0.01},
    "Shampoo": {"lr": 1e-2, "weight_decay": 0.01},
    "AdamWScheduleFree": {"lr": 1e-2, "weight_decay": 0.01},
}


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(300, 130), torch.nn.Tanh(), torch.nn.Linear(130, 3))


def groups(kind, model):
    import bigbatch.optim as bo
    if kind == "Muon":
        return bo.muon_param_groups(model, **OPTIONS[kind])
    return bo.layerwise_param_groups(model, **OPTIONS[kind])


def backward(model, x):
    model(x).square().mean().backward()


def step_both(sharded, opt, twin, twin_opt, x):
    opt.zero_grad()
    twin_opt.zero_grad()
    backward(sharded, x)
    for p, q in zip(sharded.parameters(), twin.parameters()):
        q.grad = p.grad.full_tensor().clone()
    opt.step()
    twin_opt.step()


def difference(sharded, twin):
    return max((p.full_tensor() - q).abs().max().item() for p, q in zip(sharded.parameters(), twin.parameters()))


def run_kind(kind, mesh, rank):
    from torch.distributed.fsdp import fully_shard
    import bigbatch.optim as bo
    cls = getattr(bo, kind)
    model = make_model()
    twin = make_model()
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = cls(groups(kind, model))
    twin_opt = cls(groups(kind, twin))
    torch.manual_seed(100 + rank)
    worst = 0.0
    ratio_rel = 0.0
    for _ in range(STEPS):
        step_both(model, opt, twin, twin_opt, torch.randn(8, 300))
        worst = max(worst, difference(model, twin))
        ours = [r for _, r in opt.trust_ratios()]
        theirs = [r for _, r in twin_opt.trust_ratios()]
        if len(ours) != len(theirs):
            ratio_rel = float("inf")
        for a, b in zip(ours, theirs):
            ratio_rel = max(ratio_rel, abs(a - b) / abs(b))
    return {"max_abs": worst, "steps": STEPS, "ratio_rel": ratio_rel, "ratios": len(ours)}, (model, opt, twin, twin_opt)


def dcp_round_trip(kind, mesh, rank, run, folder):
    """The sharded state through torch.distributed.checkpoint into a fresh
    sharded optimizer over a copy of the model: both go on STEPS steps."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
    from torch.distributed.fsdp import fully_shard
    import bigbatch.optim as bo
    model, opt, twin, twin_opt = run
    state = get_optimizer_state_dict(model, opt)
    sharded_fields = sorted({type(v).__name__ for s in state["state"].values() for v in s.values()})
    dcp.save(state, checkpoint_id=folder)
    copy = make_model()
    for layer in (copy[0], copy[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(copy, mesh=mesh)
    with torch.no_grad():
        for p, q in zip(copy.parameters(), model.parameters()):
            p.copy_(q)
    copy_opt = getattr(bo, kind)(groups(kind, copy))
    loaded = get_optimizer_state_dict(copy, copy_opt)  # its layout, filled by dcp.load
    dcp.load(loaded, checkpoint_id=folder)
    set_optimizer_state_dict(copy, copy_opt, loaded)
    torch.manual_seed(200 + rank)
    same = True
    for _ in range(STEPS):
        x = torch.randn(8, 300)
        for m, o in ((model, opt), (copy, copy_opt)):
            o.zero_grad()
            backward(m, x)
            o.step()
        same = same and all(torch.equal(p.full_tensor(), q.full_tensor())
                            for p, q in zip(model.parameters(), copy.parameters()))
    return {"continues": same, "field_types": sharded_fields}


def rank_main(rank, world, store, out, kinds):
    from torch.distributed.device_mesh import init_device_mesh
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        result = {"dcp": {}}
        runs = {}
        for kind in kinds:
            result[kind], runs[kind] = run_kind(kind, mesh, rank)
        # The state through torch.distributed.checkpoint: the first kind's,
        # and Muon's (each matrix's state whole on its owner) where it ran.
        for kind in dict.fromkeys(k for k in (kinds[0], "Muon") if k in kinds):
            folder = [tempfile.mkdtemp(prefix="bigbatch_dcp_") if rank == 0 else None]
            dist.broadcast_object_list(folder, src=0)
            try:
                result["dcp"][kind] = dcp_round_trip(kind, mesh, rank, runs[kind], folder[0])
            finally:
                dist.barrier()
                if rank == 0:
                    shutil.rmtree(folder[0], ignore_errors=True)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    world, kinds = int(sys.argv[1]), sys.argv[2:]
    folder = tempfile.mkdtemp(prefix="bigbatch_fsdp_")
    try:
        out = os.path.join(folder, "result.json")
        mp.spawn(rank_main, args=(world, os.path.join(folder, "store"), out, kinds), nprocs=world, join=True)
        with open(out) as f:
            sys.stdout.write(f.read() + "\n")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
