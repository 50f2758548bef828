#!/usr/bin/python3
"""Reference trajectories from PyTorch's own torch.optim, for torch_optim_test.cpp.

Usage: torch_optim_reference.py OUT_DIR   (writes OUT_DIR/torch_optim.json)

Each case runs a torch.optim optimizer for STEPS steps on three float32
parameters of odd shapes, with float32 gradients drawn up front (independent
of the parameters, so the C++ test replays them), and records the initial
values, every gradient and the final values. Floats are written as Python
floats of the float32 values: exact, so the C++ side reads the same bits back.

The configurations are those where our optimizers reduce exactly (in exact
arithmetic; fp32 differs by rounding only) to PyTorch's (the update rules in optimizers/*.h):
  LARS, adapt false (ratio 1):  v = m*v + lr*d, w -= v         d = g + wd*w
        SGD(momentum m, dampening 0, weight_decay wd):  b = m*b + d, w -= lr*b
        so v = lr*b at constant lr; nesterov: m*v + lr*d = lr*(d + m*b).
  LARC, adapt false (scale 1):  v = m*v + d (v = d first), w -= lr*v
        is SGD's update term for term, nesterov w -= lr*(d + m*v) included.
  LAMB, adapt false (ratio 1), bias correction, grad averaging, no clipping:
        u = mh/(sqrt(vh)+eps) + wd*w, w -= lr*u   is AdamW (w *= 1 - lr*wd, then
        the Adam step, both from the old w); with wd 0 it is Adam; with
        adam_w_mode false (g += wd*w before the moments) it is Adam(weight_decay=wd).
NovoGrad has no torch.optim counterpart and is not covered.
"""
import json
import os
import sys

import torch

STEPS = 20
SHAPES = [[7, 5], [13], [3, 4, 2]]

SGD_LARS = {"lr": 0.05, "momentum": 0.9, "dampening": 0.0, "weight_decay": 0.01}
SGD_LARC = {"lr": 0.03, "momentum": 0.8, "dampening": 0.0, "weight_decay": 0.02}
ADAM = {"lr": 0.01, "betas": [0.9, 0.99], "eps": 1e-8}

# (name, ours, torch optimizer, its hyperparameters, gradient scale). The Adam
# cases get gradients of 1e-3: Adam ignores their scale but not eps, which then
# matters (a missed eps, ours 1e-6 by default, moves the weights by ~5e-5).
CASES = [
    ("lars_sgd", "LARS", "SGD", dict(SGD_LARS, nesterov=False), 1.0),
    ("lars_sgd_nesterov", "LARS", "SGD", dict(SGD_LARS, nesterov=True), 1.0),
    ("larc_sgd", "LARC", "SGD", dict(SGD_LARC, nesterov=False), 1.0),
    ("larc_sgd_nesterov", "LARC", "SGD", dict(SGD_LARC, nesterov=True), 1.0),
    # lr*wd a power of two: AdamW's factor 1 - lr*wd is then exact in fp32. With
    # lr = wd = 0.01 torch rounds 0.9999 the same way every step, a bias of
    # 3.3e-7 in the weights after 20 steps (a third of the C++ test's tolerance).
    ("lamb_adamw", "LAMB", "AdamW", dict(ADAM, lr=2**-7, weight_decay=2**-4), 1e-3),
    ("lamb_adam", "LAMB", "Adam", dict(ADAM, weight_decay=0.0), 1e-3),
    ("lamb_adam_l2", "LAMB", "Adam", dict(ADAM, weight_decay=1e-3), 1e-3),  # wd*w ~ g
]


def flat(t):
    """A float32 tensor as a list of Python floats (each exactly the float32 value)."""
    return [float(x) for x in t.detach().reshape(-1).tolist()]


def run_case(index, name, ours, optimizer, hyper, grad_scale):
    gen = torch.Generator().manual_seed(1000 + index)
    params = [torch.randn(s, generator=gen, dtype=torch.float32) for s in SHAPES]
    grads = [[grad_scale * torch.randn(s, generator=gen, dtype=torch.float32) for s in SHAPES]
             for _ in range(STEPS)]
    initial = [flat(p) for p in params]

    params = [p.clone().requires_grad_(True) for p in params]
    kwargs = dict(hyper)
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    opt = getattr(torch.optim, optimizer)(params, foreach=False, **kwargs)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        opt.step()

    return {
        "name": name,
        "ours": ours,
        "optimizer": optimizer,
        "hyper": hyper,
        "grad_scale": grad_scale,
        "shapes": SHAPES,
        "initial": initial,
        "grads": [[flat(g) for g in step_grads] for step_grads in grads],
        "final": [flat(p) for p in params],
    }


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: torch_optim_reference.py OUT_DIR")
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    doc = {
        "torch_version": torch.__version__,
        "steps": STEPS,
        "cases": [run_case(i, *case) for i, case in enumerate(CASES)],
    }
    path = os.path.join(out_dir, "torch_optim.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)
    print(f"wrote {path}: {len(CASES)} cases, {STEPS} steps, torch {torch.__version__}")


if __name__ == "__main__":
    main()
