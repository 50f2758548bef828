#!/usr/bin/python3
"""Reference trajectories from PyTorch's own torch.optim, for torch_optim_test.cpp.

Usage: torch_optim_reference.py OUT_DIR [MUON_PY]   (writes OUT_DIR/torch_optim.json)

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

Muon (torch.optim.Muon, PyTorch 2.9 and later): MUON_PY is the file
torch/optim/_muon.py of the torch wheel the second lane builds against
(scripts/fetch_torch.py unpacks it beside that LibTorch). Its step functions
(_zeropower_via_newtonschulz, _adjust_lr, _single_tensor_muon: the whole
algorithm; the class around them only gathers state) are executed as they are,
with this interpreter's torch for the tensor operations (Debian's 1.13 has no
Muon of its own). The cases ("muon_cases") cover Nesterov on and off and the
update-scale rules, on 2-D parameters (wide, tall, square); each records the
final weights of the code as shipped ("final", the iteration in bfloat16)
and of the same code with torch.bfloat16 read as torch.float32 in
_zeropower_via_newtonschulz ("final_fp32": the one change, made on the
syntax tree, so that the algorithm can be compared to fp32 rounding). Without MUON_PY
the file says why there are none ("muon_missing").
"""
import ast
import copy
import json
import math
import os
import pathlib
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


MUON_STEPS = 10
MUON_SHAPES = [[7, 5], [5, 9], [6, 6]]
# (name, nesterov, adjust_lr_fn); lr, weight decay and momentum as PyTorch's
# docstring example (lr 0.02, momentum 0.95) with its default decay 0.1.
MUON_CASES = [
    ("muon_nesterov_original", True, "original"),
    ("muon_plain_original", False, "original"),
    ("muon_nesterov_match_rms_adamw", True, "match_rms_adamw"),
    ("muon_plain_match_rms_adamw", False, "match_rms_adamw"),
]
MUON_HYPER = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.95}


def load_muon(path):
    """PyTorch's Muon step functions and constants from `path` (its _muon.py),
    executed here: the module's own imports (torch.optim.optimizer of 2.x)
    are replaced by what the step functions use of them."""
    tree = ast.parse(pathlib.Path(path).read_text(), filename=path)
    keep = {"_zeropower_via_newtonschulz", "_adjust_lr", "_single_tensor_muon"}
    body = [n for n in tree.body
            if (isinstance(n, ast.FunctionDef) and n.name in keep)
            or (isinstance(n, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper() for t in n.targets))]
    names = {n.name for n in body if isinstance(n, ast.FunctionDef)}
    if names != keep:
        raise SystemExit(f"torch_optim_reference: {path} lacks {sorted(keep - names)}")
    spaces = []
    for fp32 in (False, True):
        module = ast.Module(body=copy.deepcopy(body), type_ignores=[])
        if fp32:
            module = Fp32Iteration().visit(module)
            ast.fix_missing_locations(module)
        space = {"torch": torch, "math": math, "Tensor": torch.Tensor,
                 "_to_scalar": lambda x: x.item() if isinstance(x, torch.Tensor) else x}
        exec(compile(module, path, "exec"), space)
        spaces.append(space)
    return spaces


class Fp32Iteration(ast.NodeTransformer):
    """torch.bfloat16 -> torch.float32 in _zeropower_via_newtonschulz: PyTorch's
    algorithm, operation for operation, with the iteration in fp32 (the one
    change), the twin of bigbatch's default ns_bfloat16(false)."""

    def visit_FunctionDef(self, node):
        if node.name != "_zeropower_via_newtonschulz":
            return node
        return self.generic_visit(node)

    def visit_Attribute(self, node):
        if isinstance(node.value, ast.Name) and node.value.id == "torch" and node.attr == "bfloat16":
            return ast.copy_location(ast.Attribute(value=node.value, attr="float32", ctx=node.ctx), node)
        return self.generic_visit(node)


def run_muon(muon, start, grads, nesterov, adjust):
    params = [p.clone() for p in start]
    bufs = [torch.zeros_like(p) for p in params]  # Muon._init_group's momentum_buffer
    ns = (muon["DEFAULT_A"], muon["DEFAULT_B"], muon["DEFAULT_C"])
    with torch.no_grad():
        for step_grads in grads:
            muon["_single_tensor_muon"](params, step_grads, bufs, nesterov=nesterov, ns_coefficients=ns,
                                        ns_steps=muon["DEFAULT_NS_STEPS"], eps=muon["EPS"], adjust_lr_fn=adjust,
                                        has_complex=False, **MUON_HYPER)
    return params, ns


def run_muon_case(index, spaces, name, nesterov, adjust):
    muon, muon_fp32 = spaces
    gen = torch.Generator().manual_seed(2000 + index)
    start = [torch.randn(s, generator=gen, dtype=torch.float32) for s in MUON_SHAPES]
    grads = [[0.1 * torch.randn(s, generator=gen, dtype=torch.float32) for s in MUON_SHAPES]
             for _ in range(MUON_STEPS)]
    initial = [flat(p) for p in start]
    params, ns = run_muon(muon, start, grads, nesterov, adjust)
    params_fp32, _ = run_muon(muon_fp32, start, grads, nesterov, adjust)
    return {
        "name": name,
        "hyper": dict(MUON_HYPER, nesterov=nesterov, adjust_lr=adjust, ns_coefficients=list(ns),
                      ns_steps=muon["DEFAULT_NS_STEPS"], eps=muon["EPS"]),
        "shapes": MUON_SHAPES,
        "initial": initial,
        "grads": [[flat(g) for g in step_grads] for step_grads in grads],
        "final": [flat(p) for p in params],
        "final_fp32": [flat(p) for p in params_fp32],
    }


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: torch_optim_reference.py OUT_DIR [MUON_PY]")
    out_dir = sys.argv[1]
    muon_py = sys.argv[2] if len(sys.argv) == 3 and sys.argv[2] else None
    os.makedirs(out_dir, exist_ok=True)
    doc = {
        "torch_version": torch.__version__,
        "steps": STEPS,
        "cases": [run_case(i, *case) for i, case in enumerate(CASES)],
    }
    if muon_py and os.path.exists(muon_py):
        muon = load_muon(muon_py)
        doc["muon_source"] = muon_py
        doc["muon_steps"] = MUON_STEPS
        doc["muon_cases"] = [run_muon_case(i, muon, *case) for i, case in enumerate(MUON_CASES)]
    else:
        doc["muon_missing"] = (f"no {muon_py}" if muon_py else "no torch wheel in this build") + \
            ": configure with --torch VERSION (scripts/setup.sh), whose wheel carries torch/optim/_muon.py"
    path = os.path.join(out_dir, "torch_optim.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)
    muon = f", {len(doc['muon_cases'])} Muon cases from {muon_py}" if "muon_cases" in doc else ", no Muon cases"
    print(f"wrote {path}: {len(CASES)} cases, {STEPS} steps, torch {torch.__version__}{muon}")


if __name__ == "__main__":
    main()
