#!/usr/bin/python3
"""PyTorch's Muon step on the parameter lists of bm_muon.cpp, for the ratio
"bigbatch's fused Muon / PyTorch's Muon" measured on the same machine.

Usage: torch_muon_bench.py [--muon-py PATH] [--device cpu|cuda] [--lists gpt_mini_3M,...] [--steps N]

Two timings per list: PyTorch's Muon as shipped (its Newton-Schulz iteration
in bfloat16) and the same step functions with the iteration in fp32, the
precision of bigbatch's default (ns_bfloat16 false), loaded as the cross-check
test loads them (tests/optimizers/torch_optim_reference.py). With a torch
that has torch.optim.Muon (2.9 and later: the GPU machine's), the shipped one
is its optimizer class as a user calls it. Without (Debian's 1.13),
--muon-py names PyTorch's torch/optim/_muon.py (the second lane's wheel
unpacks it into .torch/VERSION/torch/optim/_muon.py) and its step function
_single_tensor_muon (the whole algorithm: the class only gathers state) runs
on this torch's operations. Convolution weights are given flattened to
(out, in*k*k), as torch.optim.Muon takes 2-D parameters only.
Prints one line per list and precision: milliseconds per step (median).
"""
import argparse
import pathlib
import statistics
import sys
import time

import torch

A, B, C = 3.4445, -4.7750, 2.0315


def gpt(layers, width):
    shapes = []
    for _ in range(layers):
        shapes += [(3 * width, width), (width, width), (4 * width, width), (width, 4 * width)]
    return shapes


def resnet50():
    shapes = [(64, 3 * 7 * 7)]
    cin = 64
    for width, blocks in zip((64, 128, 256, 512), (3, 4, 6, 3)):
        for b in range(blocks):
            shapes += [(width, cin), (width, width * 9), (4 * width, width)]
            if b == 0:
                shapes.append((4 * width, cin))
            cin = 4 * width
    return shapes + [(1000, 2048)]


LISTS = {"gpt_mini_3M": gpt(4, 256), "gpt_small_124M": gpt(12, 768), "resnet50_25M": resnet50()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--muon-py")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--lists", default=",".join(LISTS))
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    native = hasattr(torch.optim, "Muon")
    path = args.muon_py or (sys.modules["torch.optim._muon"].__file__ if native else None)
    if path is None:
        raise SystemExit("torch_muon_bench: this torch has no torch.optim.Muon: give --muon-py PATH/_muon.py")
    # PyTorch's step functions as shipped (the iteration in bf16) and with the
    # iteration in fp32, as the cross-check test loads them.
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "optimizers"))
    from torch_optim_reference import load_muon
    shipped, fp32 = load_muon(path)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    for name in args.lists.split(","):
        params = [(0.02 * torch.randn(s)).to(args.device).requires_grad_(True) for s in LISTS[name]]
        for p in params:
            p.grad = 1e-3 * torch.randn_like(p)
        bufs = [torch.zeros_like(p) for p in params]

        def functional(space):
            def step():
                with torch.no_grad():
                    space["_single_tensor_muon"](params, [p.grad for p in params], bufs, lr=0.02,
                                                 weight_decay=0.1, momentum=0.95, nesterov=True,
                                                 ns_coefficients=(A, B, C), ns_steps=5, eps=1e-7,
                                                 adjust_lr_fn=None, has_complex=False)
            return step

        runs = [("fp32 iteration", functional(fp32))]
        if native:
            runs.append(("torch.optim.Muon as shipped, bf16 iteration", torch.optim.Muon(params, lr=0.02).step))
        else:
            runs.append(("_single_tensor_muon as shipped, bf16 iteration", functional(shipped)))
        for how, step in runs:
            step()
            sync()
            times = []
            for _ in range(args.steps):
                start = time.perf_counter()
                step()
                sync()
                times.append(time.perf_counter() - start)
            print(f"{name}: {1e3 * statistics.median(times):.1f} ms/step ({how}; {path}, torch {torch.__version__}, "
                  f"{args.device}, median of {args.steps} steps)", flush=True)


if __name__ == "__main__":
    main()
