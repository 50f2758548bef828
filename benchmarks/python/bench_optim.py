#!/usr/bin/env python3
"""The Python package's step time (docs/python.md, "Measured"), in one run:

  list/<name>: one step of bigbatch.optim.LAMB on the ResNet-50-like and
    BERT-large-like lists of the C++ benchmarks (benchmarks/cuda_table.py's
    sizes), against what a
    PyTorch user would otherwise pick: torch.optim.AdamW(fused=True) (fewer
    bytes per element than LAMB: no norms), timm's LAMB (a Python loop over
    tensors), and torch.optim.AdamW(foreach=True);
  copy: dst.copy_(src) of the bytes LAMB's step and AdamW's step move (44 and
    28 per fp32 parameter), the machine's own bound for either;
  overhead: the Python call against the C++ call of the same step, on a small
    list (16 tensors of 64 elements) where the step itself costs little: the
    C++ step timed by the peer program (tests/python/peer.cpp, bench mode) on
    the same tensors.

With --suite schedule_free instead (or all: both): one step of
bigbatch.optim.AdamWScheduleFree on the same lists against the authors'
PyPI schedulefree (AdamWScheduleFree with foreach, their fast form, and
AdamWScheduleFreeReference, the three-sequence one), torch's
AdamW(fused=True), and a copy of the 32 bytes per parameter the fused step moves.

With --suite soap (not part of all: a minute of matrix products): SOAP on
the hidden matrices of a GPT of 4 layers of width 256 (bm_kronecker's list, 3.1M
parameters): bigbatch.optim.SOAP fused and on its reference path, the fused
step without a refresh and with no factor (the elementwise part alone), and
pytorch-optimizer's SOAP, all at precondition_frequency 10, beside torch's
AdamW(fused=True). A SOAP step's cost depends on whether it refreshes the
bases (one in ten), so each is the mean of 40 steps (four refreshes) after
the first, not a median.

With --suite shampoo (not part of all, likewise): Shampoo on the same list,
Adam grafting, the inverse roots every 10 steps: bigbatch.optim.Shampoo fused
and on its reference path, with the roots at every step, and before its
start step (the graft alone), against pytorch-optimizer's ScalableShampoo
(RMSprop grafting, its closest to Adam; blocks of 1024; the roots every 10
steps by its default coupled Newton iteration and by SVD), beside torch's
AdamW(fused=True): the mean of 40 steps after the start step.

Times are medians of torch.utils.benchmark's blocked_autorange on this
machine's CPU (named in the output), or on CUDA with --device cuda.
Usage: bench_optim.py [--device cpu|cuda] [--lists resnet50,bert_large] [--peer PATH] [--min-time S]
                      [--suite lamb|schedule_free|all|soap|shampoo]
"""
import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile

import torch
import torch.utils.benchmark as tb

import bigbatch


def lists():
    """The ResNet-50-like and BERT-large-like lists of the C++ benchmarks, as
    benchmarks/cuda_table.py writes them (sizes; each tensor flat here: a
    step's cost follows its tensors' sizes, not their shapes)."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    import cuda_table
    return {"resnet50": [(n,) for n in cuda_table.resnet50()[1]],
            "bert_large": [(n,) for n in cuda_table.bert_large()[1]]}


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def step_time(make, shapes, device, min_time):
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=g).to(device).requires_grad_(True) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g).mul_(0.01).to(device)
    opt = make(params)
    opt.step()  # the state is made in the first step
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def one():
        opt.step()
        sync()

    return tb.Timer(stmt="one()", globals={"one": one}).blocked_autorange(min_run_time=min_time).median


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--lists", default="resnet50,bert_large")
    parser.add_argument("--peer", default=str(pathlib.Path(__file__).resolve().parents[2] / "build" / "tests" / "python_peer"))
    parser.add_argument("--min-time", type=float, default=2.0)
    parser.add_argument("--suite", default="lamb", choices=["lamb", "schedule_free", "all", "soap", "shampoo"])
    args = parser.parse_args()
    if args.suite in ("soap", "shampoo"):
        kronecker(args, args.suite)
    if args.suite in ("schedule_free", "all"):
        schedule_free(args)
    if args.suite in ("lamb", "all"):
        lamb(args)


def timed_against(args, peers, copies, base_name):
    """Each peer's step on each list, and copies of `copies` bytes per parameter."""
    known = lists()
    for name in args.lists.split(","):
        shapes = known[name]
        numel = sum(torch.Size(s).numel() for s in shapes)
        times = {k: step_time(make, shapes, args.device, args.min_time) for k, make in peers.items()}
        for label, per in copies:
            src = torch.randn(numel * per // 8, device=args.device)
            dst = torch.zeros_like(src)
            sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
            times[label] = tb.Timer(stmt="dst.copy_(src); sync()", globals={"dst": dst, "src": src, "sync": sync}
                                    ).blocked_autorange(min_run_time=args.min_time).median
            del src, dst
        base = times[base_name]
        print(f"\nlist {name}: {len(shapes)} tensors, {numel / 1e6:.1f}M parameters")
        for k, t in times.items():
            print(f"  {k:36s} {t * 1e3:9.2f} ms   {t / base:5.2f}x bigbatch's")


def schedule_free(args):
    import importlib.metadata
    import schedulefree
    version = importlib.metadata.version("schedulefree")
    print(f"device {args.device}: {torch.cuda.get_device_name() if args.device == 'cuda' else cpu_name()}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, schedulefree {version}")

    def trained(opt):
        opt.train()
        return opt

    peers = {
        "bigbatch.optim.AdamWScheduleFree": lambda p: bigbatch.optim.AdamWScheduleFree(p, weight_decay=0.1),
        "schedulefree AdamWScheduleFree": lambda p: trained(schedulefree.AdamWScheduleFree(p, weight_decay=0.1)),
        "schedulefree ...Reference": lambda p: trained(schedulefree.AdamWScheduleFreeReference(p, weight_decay=0.1)),
        "torch AdamW(fused=True)": lambda p: torch.optim.AdamW(p, lr=1e-3, fused=True),
    }
    # The fused step moves 32 bytes per fp32 parameter (kernels/schedule_free.h), AdamW's 28.
    timed_against(args, peers, (("copy of its 32 B/param", 32), ("copy of AdamW's 28 B/param", 28)),
                  "bigbatch.optim.AdamWScheduleFree")


def kronecker(args, suite):
    """SOAP's or Shampoo's step on bm_kronecker's GPT list, against pytorch-optimizer's."""
    import importlib.metadata
    import time

    import pytorch_optimizer
    from pytorch_optimizer.optimizer.utils.graft import LayerWiseGrafting
    version = importlib.metadata.version("pytorch-optimizer")
    print(f"device {args.device}: {torch.cuda.get_device_name() if args.device == 'cuda' else cpu_name()}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, pytorch-optimizer {version}")
    shapes = []
    for _ in range(4):  # bm_kronecker's gpt_mini: Q,K,V as one (3w, w), the projection, the MLP's two
        shapes += [(768, 256), (256, 256), (1024, 256), (256, 1024)]
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    adamw = ("torch AdamW(fused=True)", lambda p: torch.optim.AdamW(p, lr=1e-3, fused=True), 1)
    if suite == "soap":
        common = dict(lr=3e-3, weight_decay=0.01, precondition_frequency=10)
        peers = [  # name, make, steps before the timing (SOAP's first builds the factors and bases)
            ("bigbatch.optim.SOAP", lambda p: bigbatch.optim.SOAP(p, **common), 1),
            ("bigbatch SOAP reference path", lambda p: bigbatch.optim.SOAP(p, fused=False, **common), 1),
            ("bigbatch SOAP, no refresh",
             lambda p: bigbatch.optim.SOAP(p, **{**common, "precondition_frequency": 10**9}), 1),
            ("bigbatch SOAP, no factor (elementwise)", lambda p: bigbatch.optim.SOAP(p, max_precond_dim=1, **common), 1),
            ("pytorch_optimizer SOAP", lambda p: pytorch_optimizer.SOAP(p, **common), 1),
            adamw,
        ]
    else:
        common = dict(lr=1e-3, precondition_frequency=10)
        theirs = dict(lr=1e-3, betas=(0.0, 0.999), start_preconditioning_step=10, preconditioning_compute_steps=10,
                      block_size=1024, graft_type=LayerWiseGrafting.RMSPROP)
        peers = [  # timed from step 11: the roots at steps 20 and 30 of each 40
            ("bigbatch.optim.Shampoo", lambda p: bigbatch.optim.Shampoo(p, **common), 10),
            ("bigbatch Shampoo reference path", lambda p: bigbatch.optim.Shampoo(p, fused=False, **common), 10),
            ("bigbatch Shampoo, roots every step",
             lambda p: bigbatch.optim.Shampoo(p, **{**common, "precondition_frequency": 1}), 10),
            ("bigbatch Shampoo, graft only",
             lambda p: bigbatch.optim.Shampoo(p, start_preconditioning_step=10**9, **common), 10),
            ("pytorch_optimizer ScalableShampoo", lambda p: pytorch_optimizer.ScalableShampoo(p, **theirs), 10),
            ("pytorch_optimizer ScalableShampoo (SVD)",
             lambda p: pytorch_optimizer.ScalableShampoo(p, use_svd=True, **theirs), 10),
            adamw,
        ]
    times = {}
    for name, make, warm in peers:
        g = torch.Generator().manual_seed(0)
        params = [torch.randn(s, generator=g).mul_(0.02).to(args.device).requires_grad_(True) for s in shapes]
        for p in params:
            p.grad = torch.randn(p.shape, generator=g).mul_(1e-3).to(args.device)
        opt = make(params)
        try:
            for _ in range(warm):
                opt.step()
            sync()
            t0 = time.perf_counter()
            for _ in range(40):
                opt.step()
            sync()
            times[name] = (time.perf_counter() - t0) / 40
        except RuntimeError as e:  # a peer's decomposition that does not converge: said, not timed
            times[name] = f"failed: {str(e).splitlines()[0][:90]}"
    base = times[peers[0][0]]
    print(f"\nlist gpt_mini: {len(shapes)} matrices, {sum(torch.Size(s).numel() for s in shapes) / 1e6:.1f}M parameters")
    for k, t in times.items():
        print(f"  {k:42s} {t * 1e3:9.2f} ms   {t / base:5.2f}x bigbatch's" if isinstance(t, float) else f"  {k:42s} {t}")


def lamb(args):
    try:
        from timm.optim.lamb import Lamb
    except ImportError:  # a GPU machine without timm: the other columns
        Lamb = None

    print(f"device {args.device}: {torch.cuda.get_device_name() if args.device == 'cuda' else cpu_name()}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    best = bigbatch._ops.ops.cpu_isa()  # the widest the CPU has (kernels/cpu/isa.h)

    def lamb_with(isa):
        def make(p):
            bigbatch._ops.ops.set_cpu_isa(isa)  # from here to the next peer's
            return bigbatch.optim.LAMB(p, lr=1e-3)
        return make

    peers = {
        "bigbatch.optim.LAMB": lamb_with(best),
        "torch AdamW(fused=True)": lambda p: torch.optim.AdamW(p, lr=1e-3, fused=True),
        "torch AdamW(foreach=True)": lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True),
        "timm Lamb": lambda p: Lamb(p, lr=1e-3),
    }
    if Lamb is None:
        del peers["timm Lamb"]
    if best != "baseline":  # the element loops for the baseline x86-64 ISA, as before the variants
        peers["bigbatch.optim.LAMB, baseline loops"] = lamb_with("baseline")
    # A copy of the bytes LAMB's step must move (44 per fp32 parameter: kernels/lamb.h), and AdamW's 28.
    print(f"bigbatch's CPU element loops: {best}")
    timed_against(args, peers, (("copy of LAMB's 44 B/param", 44), ("copy of AdamW's 28 B/param", 28)),
                  "bigbatch.optim.LAMB")
    bigbatch._ops.ops.set_cpu_isa(best)

    # The Python call's overhead: the same step from Python and from C++.
    shapes = [(64,)] * 16
    py = step_time(lambda p: bigbatch.optim.LAMB(p, lr=1e-3), shapes, "cpu", args.min_time)
    with tempfile.TemporaryDirectory() as tmp:
        g = torch.Generator().manual_seed(0)
        params = [torch.randn(s, generator=g) for s in shapes]
        grads = [[torch.randn(s, generator=g).mul_(0.01) for s in shapes]]
        torch.save({"params": params, "grads": grads}, os.path.join(tmp, "in.pt"))
        out = subprocess.run([args.peer, "bench", "lamb_flat", os.path.join(tmp, "in.pt"), str(args.min_time)],
                             check=True, capture_output=True, text=True).stdout
        cpp = json.loads(out)["median_s"]
    print(f"\noverhead (16 tensors of 64 on the CPU): Python step {py * 1e6:.1f} us, C++ step {cpp * 1e6:.1f} us, "
          f"the Python call adds {(py - cpp) * 1e6:.1f} us per step")


if __name__ == "__main__":
    main()
