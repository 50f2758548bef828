"""Two Gloo ranks on this machine running bigbatch.optim.LAMB under
torch.distributed.optim.ZeroRedundancyOptimizer (each rank steps its own
partition): 3 steps, the state consolidated on rank 0 and loaded by a fresh
ZeroRedundancyOptimizer on both ranks, 3 more steps of each. Prints, from
rank 0, one JSON line: whether the loaded one continued bit for bit, and
whether the whole run equals one process's LAMB over all the parameters.
Run by test_optim.py; it joins the two processes it starts."""
import copy
import json
import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.optim import ZeroRedundancyOptimizer


def model_and_input():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    return model, torch.randn(16, 6)


def step(model, opt, x):
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


def rank_main(rank, world, store, out):
    import bigbatch.optim as bo
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        model, x = model_and_input()
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=bo.LAMB, lr=1e-2, weight_decay=0.01)
        for _ in range(3):
            step(model, opt, x)
        opt.consolidate_state_dict(to=0)
        saved = [opt.state_dict() if rank == 0 else None]
        dist.broadcast_object_list(saved, src=0)
        twin = copy.deepcopy(model)
        twin_opt = ZeroRedundancyOptimizer(twin.parameters(), optimizer_class=bo.LAMB, lr=1e-2, weight_decay=0.01)
        twin_opt.load_state_dict(saved[0])
        for _ in range(3):
            step(model, opt, x)
            step(twin, twin_opt, x)
        ref, _ = model_and_input()
        ref_opt = bo.LAMB(ref.parameters(), lr=1e-2, weight_decay=0.01)
        for _ in range(6):
            step(ref, ref_opt, x)
        same = lambda a, b: all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))  # noqa: E731
        if rank == 0:
            with open(out, "w") as f:
                json.dump({"loaded_continues": same(model, twin), "equals_one_process": same(model, ref),
                           "local_params": sum(len(g["params"]) for g in opt.optim.param_groups),
                           "all_params": len(list(model.parameters()))}, f)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    folder = tempfile.mkdtemp(prefix="bigbatch_zero_")
    try:
        out = os.path.join(folder, "result.json")
        mp.spawn(rank_main, args=(2, os.path.join(folder, "store"), out), nprocs=2, join=True)
        with open(out) as f:
            sys.stdout.write(f.read() + "\n")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
