"""bigbatch.optim against the C++ optimizers (bit for bit, through the peer
program tests/python/peer.cpp), against independent references (timm's LAMB
and LARS, torch.optim.Muon, the authors' Schedule-Free, pytorch-optimizer's
SOAP and ScalableShampoo, float64 re-derivations of Lion and NovoGrad), and
as a torch.optim optimizer (state_dict, schedulers, closures, the
non-finite skip, refused options, torch.compile, the profiler)."""
import copy
import inspect
import io
import math
import warnings

import pytest
import torch
from conftest import reference

import bigbatch
from bigbatch import _ops
from bigbatch.optim import (LAMB, LARC, LARS, SOAP, AdamWScheduleFree, Lion, Muon, NovoGrad, SGDScheduleFree,
                            Shampoo)

SHAPES = [(17, 33), (8, 3, 3, 3), (33,), (8,)]
STEPS = 4
PLAIN = {"weight_decay": 0.0, "adapt": False}
# case -> (class, options, the plain group's (1-D parameters') overrides, dtype); peer.cpp has the same cases.
CASES = {
    "lamb": (LAMB, dict(lr=1e-2, weight_decay=0.01), PLAIN, torch.float32),
    "lamb_clip": (LAMB, dict(lr=2e-3, betas=(0.8, 0.99), max_grad_norm=1.0, trust_clip=True), PLAIN, torch.float32),
    "lamb_reference": (LAMB, dict(lr=1e-2, weight_decay=0.01, fused=False), PLAIN, torch.float32),
    "lamb_master": (LAMB, dict(lr=1e-2, weight_decay=0.01, master_weights=True), PLAIN, torch.bfloat16),
    "lars": (LARS, dict(lr=0.1, momentum=0.9, weight_decay=1e-4, nesterov=True), PLAIN, torch.float32),
    "larc": (LARC, dict(lr=0.1, weight_decay=5e-4), PLAIN, torch.float32),
    "novograd": (NovoGrad, dict(lr=1e-2, weight_decay=1e-3, grad_averaging=True), PLAIN, torch.float32),
    "lion": (Lion, dict(lr=1e-3, weight_decay=0.1), PLAIN, torch.float32),
    "adamw_schedule_free": (AdamWScheduleFree, dict(lr=1e-2, weight_decay=0.05, warmup_steps=2), PLAIN,
                            torch.float32),
    "sgd_schedule_free": (SGDScheduleFree, dict(lr=0.1, weight_decay=1e-3), PLAIN, torch.float32),
    "soap": (SOAP, dict(lr=3e-3, weight_decay=0.01, precondition_frequency=2), PLAIN, torch.float32),
    "shampoo": (Shampoo, dict(lr=1e-2, betas=(0.9, 0.99), epsilon=1e-5, momentum=0.5, weight_decay=0.01,
                              precondition_frequency=2, max_preconditioner_dim=16), PLAIN, torch.float32),
    "muon": (Muon, dict(lr=0.02, weight_decay=0.01), {"orthogonalize": False, "weight_decay": 0.0}, torch.float32),
}


def tensors(dtype=torch.float32, seed=0, steps=STEPS, gap=True, shapes=SHAPES):
    """Parameters of `shapes` and their gradients for `steps` steps; with
    `gap`, the last parameter has none in step 1."""
    g = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=g).to(dtype) for s in shapes]
    grads = [[None if (gap and t == 1 and i == len(shapes) - 1) else torch.randn(s, generator=g).mul(0.1).to(dtype)
              for i, s in enumerate(shapes)] for t in range(steps)]
    return params, grads


def make(case, params):
    cls, options, plain, _ = CASES[case]
    mats = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    return cls([{"params": mats}, {"params": rest, **plain}], **options)


def leaves(params):
    return [p.clone().requires_grad_(True) for p in params]


def run(opt, params, grads):
    for step in grads:
        for p, g in zip(params, step):
            p.grad = None if g is None else g.clone()
        opt.step()
    return params


def assert_same_bits(a, b):
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and torch.equal(x.detach(), y.detach()), (x - y).abs().max()


# ------------------------------------------------------------ the C++ peer ----

@pytest.mark.parametrize("case", list(CASES))
def test_steps_bit_for_bit_as_the_cpp_optimizer(case, peer):
    params, grads = tensors(CASES[case][3])
    cpp = peer(case, params, grads)
    mine = leaves(params)
    opt = make(case, mine)
    run(opt, mine, grads)
    assert_same_bits(mine, cpp["params"])
    assert [r for _, r in opt.trust_ratios()] == cpp["ratios"]
    assert not torch.equal(mine[0].detach(), params[0])  # it moved


@pytest.mark.parametrize("case", ["lamb", "lamb_master", "novograd", "muon", "adamw_schedule_free", "soap",
                                  "shampoo"])
def test_optimizer_files_move_between_cpp_and_python(case, peer, tmp_path):
    params, grads = tensors(CASES[case][3])
    whole = peer(case, params, grads)["params"]
    # C++ saves after two steps; Python loads and takes the other two.
    half = peer(case, params, grads[:2], save=tmp_path / "cpp.pt")["params"]
    mine = leaves(half)
    opt = make(case, mine)
    opt.load(tmp_path / "cpp.pt")
    run(opt, mine, grads[2:])
    assert_same_bits(mine, whole)
    # Python saves after two steps; C++ loads and takes the other two.
    mine = leaves(params)
    opt = make(case, mine)
    run(opt, mine, grads[:2])
    opt.save(tmp_path / "py.pt")
    cpp = peer(case, mine, grads[2:], load=tmp_path / "py.pt")["params"]
    assert_same_bits(cpp, whole)


@pytest.mark.parametrize("case", ["lamb", "lars", "novograd", "muon", "lamb_master", "adamw_schedule_free",
                                  "soap", "shampoo"])
def test_state_dict_round_trips_through_torch_save(case):
    params, grads = tensors(CASES[case][3])
    a = leaves(params)
    opt_a = make(case, a)
    run(opt_a, a, grads[:2])
    buffer = io.BytesIO()
    torch.save(opt_a.state_dict(), buffer)
    buffer.seek(0)
    b = [p.detach().clone().requires_grad_(True) for p in a]
    opt_b = make(case, b)
    opt_b.load_state_dict(torch.load(buffer))
    run(opt_a, a, grads[2:])
    run(opt_b, b, grads[2:])
    assert_same_bits(a, b)
    state = opt_a.state_dict()["state"]
    assert set(state) == set(range(len(SHAPES)))
    if case == "lamb_master":
        assert state[0]["master"].dtype == torch.float32
    if case in ("lamb", "lamb_master", "novograd"):  # per-tensor step counts
        assert state[0]["step"] == STEPS and state[3]["step"] == STEPS - 1  # no gradient in step 1


# --------------------------------------------------- independent references ----

def test_lamb_matches_timm():
    Lamb = reference("timm.optim.lamb").Lamb
    # Every parameter has a gradient every step: timm counts steps per group, bigbatch per tensor.
    params, grads = tensors(seed=1, steps=6, gap=False)
    mine, theirs = leaves(params), leaves(params)
    run(LAMB(mine, lr=1e-2, weight_decay=0.01, max_grad_norm=1.0), mine, grads)
    run(Lamb(theirs, lr=1e-2, weight_decay=0.01, max_grad_norm=1.0), theirs, grads)
    for a, b, p in zip(mine, theirs, params):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a - b).abs().max()
        assert not torch.allclose(a, p)


def test_lars_and_larc_follow_timm_where_no_weight_decay_is_set_with_always_adapt_false():
    # timm's Lars (both its LARS and its LARC, trust_clip) scales only the
    # groups with weight decay, unless always_adapt; bigbatch's default adapts
    # every group, and always_adapt=False is timm's rule.
    Lars = reference("timm.optim.lars").Lars
    params, grads = tensors(seed=3, steps=5, gap=False)
    for ours, clip in ((LARS, False), (LARC, True)):
        mine, theirs, always = leaves(params), leaves(params), leaves(params)
        groups = lambda ps, **o: [{"params": ps[:2], "weight_decay": 1e-3, **o}, {"params": ps[2:], **o}]  # noqa: E731
        extra = {"clip": True, "trust_coefficient": 1e-3, "eps": 1e-8} if clip else {"eps": 1e-8}
        run(ours(groups(mine, always_adapt=False), lr=0.5, momentum=0.9, **extra), mine, grads)
        run(ours(groups(always), lr=0.5, momentum=0.9, **extra), always, grads)
        run(Lars(groups(theirs), lr=0.5, momentum=0.9, trust_coeff=1e-3, eps=1e-8, trust_clip=clip), theirs, grads)
        for a, b in zip(mine, theirs):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), (ours, (a - b).abs().max())
        # The default adapts the group without decay too, where timm's does not.
        assert not torch.allclose(always[2], theirs[2], rtol=1e-5, atol=1e-7), ours


def _schedule_free_run(opt, params, data, steps):
    """`steps` steps on a least-squares problem whose gradient depends on the
    parameters (so the two optimizers' differences would grow, not wash out)."""
    x, y = data
    for _ in range(steps):
        for p in params:
            p.grad = None
        w, b = params
        torch.nn.functional.mse_loss(torch.tanh(x @ w.T) @ b.T, y).backward()
        opt.step()


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("frequency", [1, 10])
def test_soap_matches_pytorch_optimizer(frequency, fused):
    # PyPI's pytorch-optimizer: SOAP after the authors' code, keeping Adam's
    # first moment in the plain basis and rotating it every step (bigbatch
    # keeps it in the eigenbasis and rotates it at a refresh: the same
    # numbers up to rounding). Its merge_dims and normalize_gradient differ
    # from the authors' (a lone merged dimension; eps added to the norm), so
    # both stay off here; the 4-D weight is preconditioned along each
    # dimension. The updates are compared, not the bases: an eigenvector's
    # sign is the solver's choice. A fresh minibatch each step: the first
    # step moves nothing, so a full batch would give the second the first's
    # gradient, which has no component along its own factor's null
    # direction; the rounding noise there, divided by a v of the same noise,
    # is where any two implementations part.
    po = reference("pytorch_optimizer")
    g = torch.Generator().manual_seed(7)
    start = [torch.randn(8, 9, generator=g) * 0.3, torch.randn(4, 3, 2, 2, generator=g) * 0.3,
             torch.randn(8, generator=g) * 0.1]
    batches = [(torch.randn(32, 9, generator=g), torch.randn(32, 8, generator=g), torch.randn(32, 12, generator=g))
               for _ in range(40)]
    mine, theirs = leaves(start), leaves(start)
    options = dict(lr=3e-3, betas=(0.9, 0.99), weight_decay=0.01, precondition_frequency=frequency, eps=1e-8)
    ours = SOAP(mine, shampoo_beta=0.9, fused=fused, **options)
    ref = po.SOAP(theirs, shampoo_beta=0.9, **options)
    for x, y, patches in batches:
        for opt, params in ((ours, mine), (ref, theirs)):
            for p in params:
                p.grad = None
            w, c, b = params
            loss = (torch.nn.functional.mse_loss(torch.tanh(x @ w.T) + b, y)
                    + (patches @ c.reshape(4, 12).T).square().mean())
            loss.backward()
            opt.step()
    # Within 1e-5 of the distance moved (measured at most 1.4e-6: fp32
    # rounding, the products' order and the moment's rotations).
    for a, b, p in zip(mine, theirs, start):
        assert ((a - b).norm() / (b - p).norm()).item() < 1e-5, (a - b).abs().max()
        assert (b - p).norm() > 0.1 * p.norm()


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("frequency", [1, 10])
def test_shampoo_matches_pytorch_optimizer(frequency, fused):
    # PyPI's pytorch-optimizer: ScalableShampoo (after Anil et al.'s
    # scalable Shampoo), in the options where it and Shi et al.'s design
    # agree: AdaGrad grafting of each whole matrix (no blocks: the matrices
    # are under block_size), the factors' moving average without bias
    # correction, inverse roots by a decomposition of L + eps*I (SVD there,
    # eigh here: the same for a symmetric positive definite matrix), no
    # filtered gradient (its betas[0] is the momentum), Nesterov momentum at
    # frequency 1, none at 10 (before its start step it keeps a separate
    # momentum for the graft), 1-D parameters on the graft alone, no weight
    # decay (it decays after preconditioning). Its eps starts in L and decays
    # with it (beta2^t * eps at step t); ours is added at each root: with
    # beta2 = 0.999 they part by at most 4% of eps, far below the factors'
    # eigenvalues. The updates are compared, not the roots.
    po = reference("pytorch_optimizer")
    graft = reference("pytorch_optimizer.optimizer.utils.graft").LayerWiseGrafting
    g = torch.Generator().manual_seed(7)
    start = [torch.randn(8, 9, generator=g) * 0.3, torch.randn(12, 4, generator=g) * 0.3,
             torch.randn(8, generator=g) * 0.1]
    batches = [(torch.randn(32, 9, generator=g), torch.randn(32, 8, generator=g), torch.randn(32, 12, generator=g))
               for _ in range(40)]
    mine, theirs = leaves(start), leaves(start)
    momentum = 0.9 if frequency == 1 else 0.0
    ours = Shampoo(mine, lr=1e-2, betas=(0.0, 0.999), epsilon=1e-6, momentum=momentum, use_nesterov=True,
                   use_bias_correction=False, precondition_frequency=frequency, grafting="adagrad",
                   grafting_epsilon=1e-10, use_merge_dims=False, precondition_1d=False, fused=fused)
    ref = po.ScalableShampoo(theirs, lr=1e-2, betas=(momentum, 0.999), matrix_eps=1e-6, nesterov=True,
                             start_preconditioning_step=frequency, preconditioning_compute_steps=frequency,
                             block_size=64, shape_interpretation=False, graft_type=graft.ADAGRAD,
                             diagonal_eps=1e-10, use_svd=True)
    for x, y, patches in batches:
        for opt, params in ((ours, mine), (ref, theirs)):
            for p in params:
                p.grad = None
            w, c, b = params
            loss = (torch.nn.functional.mse_loss(torch.tanh(x @ w.T) + b, y)
                    + (patches @ c).square().mean())
            loss.backward()
            opt.step()
    # Within 1e-4 of the distance moved (measured at most 1.0e-5: fp32
    # rounding, SVD against eigh, eps added once against decayed in L).
    for a, b, p in zip(mine, theirs, start):
        assert ((a - b).norm() / (b - p).norm()).item() < 1e-4, (a - b).abs().max()
        assert (b - p).norm() > 0.1 * p.norm()


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_schedule_free_matches_the_authors_reference_at_y_and_x(kind):
    # PyPI's schedulefree: the authors' reference optimizers, which keep x, y
    # and z explicitly; bigbatch keeps y and z (x recovered by eval()).
    sf = reference("schedulefree")
    g = torch.Generator().manual_seed(5)
    data = (torch.randn(64, 12, generator=g), torch.randn(64, 3, generator=g))
    start = [torch.randn(16, 12, generator=g) * 0.3, torch.randn(3, 16, generator=g) * 0.3]
    mine, theirs = leaves(start), leaves(start)
    if kind == "adamw":
        options = dict(lr=0.01, betas=(0.9, 0.995), weight_decay=0.05, warmup_steps=20)
        ours, ref = bigbatch.optim.AdamWScheduleFree(mine, **options), sf.AdamWScheduleFreeReference(theirs, **options)
    else:
        options = dict(lr=0.2, momentum=0.9, weight_decay=0.01, warmup_steps=20)
        ours, ref = bigbatch.optim.SGDScheduleFree(mine, **options), sf.SGDScheduleFreeReference(theirs, **options)
    ref.train()
    ours.train()
    _schedule_free_run(ours, mine, data, 100)
    _schedule_free_run(ref, theirs, data, 100)
    for a, b, p in zip(mine, theirs, start):  # y
        assert ((a - b).norm() / b.norm()).item() < 1e-6, (a - b).abs().max()
        assert (b - p).norm() > 1e-2 * p.norm()
    ours.eval()
    ref.eval()
    for a, b in zip(mine, theirs):  # x
        assert ((a - b).norm() / b.norm()).item() < 1e-6, (a - b).abs().max()
    assert not ours.training
    with pytest.raises(RuntimeError, match="evaluation mode"):
        ours.step()
    ours.train()
    ref.train()
    for a, b in zip(mine, theirs):  # y again, through the inverse interpolation
        assert ((a - b).norm() / b.norm()).item() < 1e-6, (a - b).abs().max()
    state = ours.state[mine[0]]
    assert state["step"] == 100 and isinstance(state["weight_sum"], float) and state["lr_max"] == options["lr"]


def test_lars_matches_timm():
    Lars = reference("timm.optim.lars").Lars
    params, grads = tensors(seed=2, steps=6, gap=False)
    mine, theirs = leaves(params), leaves(params)
    run(LARS(mine, lr=0.5, momentum=0.9, weight_decay=1e-3, eps=1e-8, nesterov=True), mine, grads)
    run(Lars(theirs, lr=0.5, momentum=0.9, weight_decay=1e-3, trust_coeff=1e-3, eps=1e-8, nesterov=True),
        theirs, grads)
    for a, b in zip(mine, theirs):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), (a - b).abs().max()


def test_muon_matches_torch_optim_muon_with_an_fp32_iteration(monkeypatch):
    from torch.optim import _muon
    # torch's iteration runs in bfloat16; the same code in fp32 compares to fp32 rounding.
    source = inspect.getsource(_muon._zeropower_via_newtonschulz).replace("torch.bfloat16", "torch.float32")
    scope = dict(vars(_muon))
    exec(compile(source, _muon.__file__, "exec"), scope)  # noqa: S102 - torch's own source, one dtype changed
    monkeypatch.setattr(_muon, "_zeropower_via_newtonschulz", scope["_zeropower_via_newtonschulz"])
    g = torch.Generator().manual_seed(3)
    params = [torch.randn(s, generator=g) for s in [(16, 40), (40, 16), (24, 24)]]
    grads = [[torch.randn(p.shape, generator=g) for p in params] for _ in range(4)]
    mine, theirs = leaves(params), leaves(params)
    run(Muon(mine, lr=0.02, weight_decay=0.01, momentum=0.95, nesterov=True), mine, grads)
    run(torch.optim.Muon(theirs, lr=0.02, weight_decay=0.01, momentum=0.95, nesterov=True), theirs, grads)
    for a, b, p in zip(mine, theirs, params):
        assert torch.allclose(a - p, b - p, rtol=1e-4, atol=1e-6), ((a - b).abs().max(), (b - p).abs().max())


def test_lion_matches_a_float64_derivation():
    params, grads = tensors(seed=4, steps=5)
    mine = leaves(params)
    lr, wd, b1, b2 = 1e-3, 0.1, 0.9, 0.99
    run(Lion(mine, lr=lr, weight_decay=wd, betas=(b1, b2)), mine, grads)
    for i, p in enumerate(params):
        w, m = p.double(), torch.zeros_like(p, dtype=torch.float64)
        for step in grads:
            if step[i] is None:
                continue
            g = step[i].double()
            w = w * (1 - lr * wd) - lr * torch.sign(b1 * m + (1 - b1) * g)
            m = b2 * m + (1 - b2) * g
        assert torch.allclose(mine[i].double(), w, rtol=0, atol=1e-6), (mine[i].double() - w).abs().max()


def test_novograd_matches_a_float64_derivation():
    params, grads = tensors(seed=5, steps=5)
    mine = leaves(params)
    lr, wd, b1, b2, eps = 1e-2, 1e-3, 0.95, 0.98, 1e-8
    run(NovoGrad(mine, lr=lr, weight_decay=wd, betas=(b1, b2), eps=eps, grad_averaging=True), mine, grads)
    for i, p in enumerate(params):
        w, m, v = p.double(), torch.zeros_like(p, dtype=torch.float64), None
        for step in grads:
            if step[i] is None:
                continue
            g = step[i].double()
            n = float(g.pow(2).sum())
            v = n if v is None else b2 * v + (1 - b2) * n
            m = b1 * m + (1 - b1) * (g / (math.sqrt(v) + eps) + wd * w)
            w = w - lr * m
        assert torch.allclose(mine[i].double(), w, rtol=1e-5, atol=1e-7), (mine[i].double() - w).abs().max()


# ------------------------------------------------------------ harder cases ----
# Rates that differ per group, tensors of several engine chunks (16,384
# elements each, kernels/plan.h), bf16 parameters without a master copy.

def _lambdas(n):
    """A rate multiplier per group that differs between groups and over steps."""
    return [lambda t, k=k: 1.0 / (1.0 + k * t) for k in range(n)]


@pytest.mark.parametrize("case", [c for c in CASES if c != "lamb_clip"])  # lamb_clip's norm spans all groups
def test_each_group_steps_at_its_own_rate(case):
    # One parameter per group, each group at its own rate under its own
    # LambdaLR: the same bits as one optimizer per parameter. A rate sent to
    # another group (their order reversed in the op layer) moves a parameter
    # at another's rate.
    cls, options, plain, dtype = CASES[case]
    params, grads = tensors(dtype)
    scales = [1.0, 0.5, 0.25, 0.125]

    def group(i, p):
        return {"params": [p], "lr": options["lr"] * scales[i], **(plain if p.dim() < 2 else {})}

    def run_scheduled(opt, ps, gs, lambdas):
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambdas)
        for step in gs:
            for p, g in zip(ps, step):
                p.grad = None if g is None else g.clone()
            opt.step()
            sched.step()

    lambdas = _lambdas(len(params))
    mine = leaves(params)
    run_scheduled(cls([group(i, p) for i, p in enumerate(mine)], **options), mine, grads, lambdas)
    for i, p in enumerate(params):
        alone = leaves([p])
        run_scheduled(cls([group(i, alone[0])], **options), alone, [[s[i]] for s in grads], [lambdas[i]])
        assert_same_bits([mine[i]], alone)


BIG = [(130, 257), (40000,), (16384,), (16385,)]  # 2 chunks and a tail; 3; exactly 1; 1 and one element


def test_lamb_over_several_chunks_and_distinct_group_rates_matches_timm():
    Lamb = reference("timm.optim.lamb").Lamb
    params, grads = tensors(seed=6, gap=False, shapes=BIG)
    rates = [1e-2, 4e-3, 2e-3, 1e-3]
    groups = lambda ps: [{"params": [p], "lr": r} for p, r in zip(ps, rates)]  # noqa: E731
    mine, theirs = leaves(params), leaves(params)
    ours = LAMB(groups(mine), weight_decay=0.01, max_grad_norm=1.0)
    ref = Lamb(groups(theirs), weight_decay=0.01, max_grad_norm=1.0)
    for opt, ps in ((ours, mine), (ref, theirs)):
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _lambdas(4))
        for step in grads:
            for p, g in zip(ps, step):
                p.grad = g.clone()
            opt.step()
            sched.step()
    for a, b, p in zip(mine, theirs, params):
        assert ((a - b).norm() / (b - p).norm()).item() < 1e-5, (a - b).abs().max()


@pytest.mark.parametrize("clip", [False, True])
def test_lars_and_larc_over_several_chunks_match_timm(clip):
    Lars = reference("timm.optim.lars").Lars
    params, grads = tensors(seed=7, gap=False, shapes=BIG)
    ours = LARC if clip else LARS
    extra = {"clip": True} if clip else {}
    groups = lambda ps: [{"params": ps[:2], "weight_decay": 1e-3}, {"params": ps[2:], "weight_decay": 0.0}]  # noqa: E731
    mine, theirs = leaves(params), leaves(params)
    run(ours(groups(mine), lr=0.5, momentum=0.9, trust_coefficient=1e-3, eps=1e-8, always_adapt=False, **extra),
        mine, grads)
    run(Lars(groups(theirs), lr=0.5, momentum=0.9, trust_coeff=1e-3, eps=1e-8, trust_clip=clip), theirs, grads)
    for a, b, p in zip(mine, theirs, params):
        assert ((a - b).norm() / (b - p).norm()).item() < 1e-5, (a - b).abs().max()


@pytest.mark.parametrize("case", [c for c in CASES if c != "lamb_reference"])
def test_the_fused_step_over_several_chunks_is_the_reference_step(case):
    # The fused engine splits each tensor into chunks and sums the norms
    # chunk by chunk in double; the reference path is plain ATen over whole
    # tensors. Their sums round differently, so the distances moved agree to
    # fp32 rounding, not bit for bit. SOAP's and Shampoo's paths also batch
    # their products and eigensolvers differently (Shampoo's 40,000-element
    # vector is 2,500 blocks of 16), which their eigenvalues amplify: measured
    # 1.2e-5 (SOAP) and 5.1e-5 (Shampoo) of the distance moved on an AMD
    # EPYC, as the C++ tests find (tests/optimizers/soap_test.cpp).
    cls, options, plain, dtype = CASES[case]
    tolerance = 1e-4 if case in ("soap", "shampoo") else 1e-5
    params, grads = tensors(dtype, seed=8, gap=False, shapes=BIG)
    fused, reference_path = leaves(params), leaves(params)
    for ps, flag in ((fused, True), (reference_path, False)):
        mats = [p for p in ps if p.dim() >= 2]
        rest = [p for p in ps if p.dim() < 2]
        run(cls([{"params": mats}, {"params": rest, **plain}], **{**options, "fused": flag}), ps, grads)
    for a, b, p in zip(fused, reference_path, params):
        moved = (b.float() - p.float()).norm()
        assert moved > 0 and ((a.float() - b.float()).norm() / moved).item() < tolerance, (a - b).abs().max()


def test_bf16_parameters_without_a_master_copy_round_each_step():
    # Without a master copy the step reads the bf16 parameter, computes in
    # fp32 (states fp32) and rounds the new value to bf16: a float64
    # derivation rounded to bf16 after each step. The rate is large, so a
    # step moves an element by tens of bf16 ulps and an update computed in
    # lower precision would cross rounding boundaries often. fp32 states can
    # still put an element on the other side of a boundary from float64 now
    # and then (about 2^-16 of the time): measured 818 of 818 elements equal
    # on an AMD EPYC. An fp32 master copy ends 0.016 away.
    params, grads = tensors(torch.bfloat16, seed=9, steps=6, gap=False)
    lr, wd, b1, b2, eps = 0.1, 0.01, 0.9, 0.999, 1e-6
    mine = leaves(params)
    run(LAMB(mine, lr=lr, weight_decay=wd, betas=(b1, b2), eps=eps, master_weights=False), mine, grads)
    exact = total = 0
    for i, p in enumerate(params):
        w, m, v = p.double(), torch.zeros(p.shape, dtype=torch.float64), torch.zeros(p.shape, dtype=torch.float64)
        for t, step in enumerate(grads, start=1):
            g = step[i].double()
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            u = (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps) + wd * w
            w = (w - lr * (w.norm() / u.norm()) * u).to(torch.bfloat16).double()
        ours = mine[i].detach().double()
        assert mine[i].dtype == torch.bfloat16
        # One bf16 ulp at the value: 2^(exponent - 7).
        ulp = torch.exp2(torch.floor(torch.log2(w.abs().clamp_min(1e-30))) - 7)
        assert ((ours - w).abs() <= ulp).all(), (ours - w).abs().max()
        exact += int((ours == w).sum())
        total += w.numel()
    assert exact >= 0.99 * total, (exact, total)


# ------------------------------------------------ as a torch.optim optimizer ----

def test_a_scheduler_sets_the_rate_of_the_next_step():
    params, grads = tensors()
    a, b = leaves(params), leaves(params)
    opt_a = LAMB(a, lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt_a, lambda epoch: 2.0 if epoch == 0 else 0.0)
    opt_b = LAMB(b, lr=2e-2)
    run(opt_a, a, grads[:1])
    run(opt_b, b, grads[:1])
    assert_same_bits(a, b)  # the scheduler's 2x is the optimizer's rate
    sched.step()  # rate 0: LAMB's update and decay are both scaled by it
    before = [p.detach().clone() for p in a]
    run(opt_a, a, grads[1:2])
    assert_same_bits(a, before)
    assert opt_a.param_groups[0]["lr"] == 0.0


def test_a_closure_is_called_once_and_its_loss_returned():
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    x = torch.randn(16, 5)
    calls = []

    def closure():
        calls.append(1)
        model.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        return loss

    twin = torch.nn.Linear(5, 3)
    twin.load_state_dict(model.state_dict())
    opt = LAMB(model.parameters(), lr=1e-2)
    loss = opt.step(closure)
    assert len(calls) == 1 and loss.item() > 0
    twin_opt = LAMB(twin.parameters(), lr=1e-2)
    twin(x).pow(2).mean().backward()
    twin_opt.step()
    assert_same_bits(list(model.parameters()), list(twin.parameters()))


@pytest.mark.parametrize("cls", [LAMB, LARS, LARC, NovoGrad, Lion, Muon])
def test_a_nonfinite_gradient_skips_the_step(cls):
    params, grads = tensors(gap=False)
    mats = leaves([p for p in params if p.dim() >= 2])
    fresh = leaves([p for p in params if p.dim() >= 2])
    opt, fresh_opt = cls(mats, lr=0.01), cls(fresh, lr=0.01)
    bad = [g.clone() for g in grads[0][:2]]
    bad[0][0, 0] = float("inf")
    run(opt, mats, [bad])
    assert_same_bits(mats, fresh)  # nothing moved
    assert opt.skipped_steps() == 1
    # The next step is the first one: no moment or count kept anything of the skipped one.
    run(opt, mats, [grads[1][:2]])
    run(fresh_opt, fresh, [grads[1][:2]])
    assert_same_bits(mats, fresh)
    assert not torch.equal(mats[0].detach(), params[0]) and opt.skipped_steps() == 1


def test_bad_options_are_refused_naming_the_option_and_value():
    p = [torch.zeros(3, 3, requires_grad=True)]
    with pytest.raises(ValueError, match=r"LAMB option eps: -1"):
        LAMB(p, eps=-1.0)
    with pytest.raises(ValueError, match=r"betas\[1\]: 1"):
        LAMB(p, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match=r"LAMB has no option 'momentum'"):
        LAMB(p, momentum=0.9)
    with pytest.raises(ValueError, match=r"ns_steps: 2.5 \(must be an integer\)"):
        Muon(p, ns_steps=2.5)
    with pytest.raises(ValueError, match=r"required optimization parameter lr"):
        LARS(p)
    LARS([{"params": p, "lr": 0.1}])  # each group may give it
    LARC([{"params": p, "lr": 0.1}])  # (LARC, which refuses lr 0 with clip, too)
    # An option changed in param_groups is checked at the next step, which then changes nothing.
    opt = LAMB(p, lr=0.1)
    p[0].grad = torch.ones(3, 3)
    opt.param_groups[0]["weight_decay"] = -0.5
    with pytest.raises(ValueError, match=r"LAMB option weight_decay: -0.5"):
        opt.step()
    assert torch.equal(p[0].detach(), torch.zeros(3, 3))
    with pytest.raises(ValueError, match=r"LAMB option adapt"):
        opt.add_param_group({"params": [torch.zeros(2, requires_grad=True)], "adapt": "yes"})
    assert len(opt.param_groups) == 1


def test_the_step_is_one_opaque_operator_under_torch_compile():
    params, grads = tensors()
    a, b = leaves(params), leaves(params)
    opt_a, opt_b = LAMB(a, lr=1e-2), LAMB(b, lr=1e-2)

    @torch.compile(fullgraph=True)
    def compiled_step(params, lrs):
        torch.ops.bigbatch.step(opt_b._handle, params, lrs)

    for step in grads:
        for x, y, g in zip(a, b, step):
            x.grad = y.grad = None if g is None else g.clone()
        opt_a.step()
        with torch.no_grad():
            compiled_step(b, torch.tensor([1e-2], dtype=torch.float64))
    assert_same_bits(a, b)
    with pytest.raises(ValueError, match="not the optimizer's own"):
        torch.ops.bigbatch.step(opt_a._handle, [p.detach().clone() for p in a], torch.tensor([1e-2]))
    with pytest.raises(ValueError, match="1-D float tensor"):
        torch.ops.bigbatch.step(opt_a._handle, a, torch.tensor(1e-2))


def test_a_compiled_step_under_a_scheduler_with_a_tensor_rate_compiles_once():
    """torch.compile(opt.step) with LambdaLR changing a tensor rate every
    step: after two warm-up steps no recompilation (an error here), and the
    same bits as the eager step under the same schedule."""
    params, grads = tensors()
    a, b = leaves(params), leaves(params)
    opt_a, opt_b = LAMB(a, lr=torch.tensor(1e-2)), LAMB(b, lr=torch.tensor(1e-2))
    sched_a = torch.optim.lr_scheduler.LambdaLR(opt_a, lambda s: 0.8 ** s)
    sched_b = torch.optim.lr_scheduler.LambdaLR(opt_b, lambda s: 0.8 ** s)
    torch._dynamo.reset()
    compiled = torch.compile(opt_b.step)
    for i, step in enumerate(grads * 3):
        for x, y, g in zip(a, b, step):
            x.grad = y.grad = None if g is None else g.clone()
        opt_a.step()
        sched_a.step()
        with torch._dynamo.config.patch(error_on_recompile=i >= 2):
            compiled()
        sched_b.step()
    assert float(opt_b.param_groups[0]["lr"]) == pytest.approx(1e-2 * 0.8 ** (3 * len(grads)))
    assert_same_bits(a, b)


def _held_model(kind, **options):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Linear(8, 3))
    groups = (bigbatch.optim.muon_param_groups(model, **options) if kind == "Muon"
              else bigbatch.optim.layerwise_param_groups(model, **options))
    return model, getattr(bigbatch.optim, kind)(groups)


def _backward(model, seed, opt):
    """A backward pass on seed's batch; the gradients in `opt`'s order."""
    torch.manual_seed(seed)
    model.zero_grad()
    model(torch.randn(5, 6)).square().mean().backward()
    return [p.grad.clone() for p in opt._params()]


# bigbatch::step_with: the step on tensors the caller holds, every one in
# the schema. From the state of one eager step, 3 steps on copies equal 3
# steps of the optimizer itself, bit for bit, state included, for kinds with
# each sort of field: moments (LAMB), Muon's two sorts of groups, SOAP's
# factors of their own shape, Schedule-Free's weight sum carried in double.
@pytest.mark.parametrize("kind,options", [("LAMB", {"lr": 1e-2, "weight_decay": 0.01}),
                                          ("Muon", {"lr": 2e-2, "weight_decay": 0.01}),
                                          ("SOAP", {"lr": 3e-3, "precondition_frequency": 2}),
                                          ("AdamWScheduleFree", {"lr": 1e-2, "warmup_steps": 2})])
def test_step_with_on_held_tensors_equals_the_optimizers_own_steps(kind, options):
    model, opt = _held_model(kind, **options)
    _backward(model, 0, opt)
    opt.step()
    params = [p.detach().clone() for p in opt._params()]
    states = opt.state_tensors()
    own_before = opt.state_tensors()
    twin, twin_opt = _held_model(kind, **options)  # the same kind and options, never stepped
    twin_opt.load_state_dict(opt.state_dict())
    with torch.no_grad():
        for p, q in zip(twin.parameters(), model.parameters()):
            p.copy_(q)
    for seed in (1, 2, 3):
        grads = _backward(model, seed, opt)
        opt.step()
        opt.step_with(params, grads, states)  # (opt's rates and options; its own tensors untouched by it)
    assert_same_bits(params, list(opt._params()))
    for mine, theirs in zip(states, opt.state_tensors()):
        assert mine.keys() == theirs.keys()
        for k in mine:
            assert torch.equal(mine[k], theirs[k]), k
    # The handle's own parameters and state are what its own steps made.
    for seed in (1, 2, 3):
        _backward(twin, seed, twin_opt)
        twin_opt.step()
    assert_same_bits(list(twin_opt._params()), list(opt._params()))
    assert own_before[0].keys() == states[0].keys()


def test_step_with_passes_opcheck_and_compiles_with_any_backend():
    """torch.library.opcheck: the schema (what is written, what is read),
    the fake implementation, autograd's registration, and functionalization
    (aot_dispatch, which passes copies: the old step refuses those). Then
    torch.compile(fullgraph=True) with aot_eager and inductor, bit for bit
    with eager."""
    model, opt = _held_model("LAMB", lr=1e-2, weight_decay=0.01)
    _backward(model, 0, opt)
    opt.step()
    grads = _backward(model, 1, opt)
    states = opt.state_tensors()
    tensors = [t for s in states for t in s.values()]
    fields = [k for s in states for k in s]
    owners = [i for i, s in enumerate(states) for _ in s]
    lrs = opt._rates().clone().requires_grad_(True)  # (opcheck's autograd test needs an input that requires grad)
    params = [p.detach().clone() for p in opt._params()]
    result = torch.library.opcheck(torch.ops.bigbatch.step_with.default,
                                   (opt._handle, params, grads, tensors, fields, owners, lrs))
    assert set(result.values()) == {"SUCCESS"} and len(result) == 4, result

    def step(params, grads, tensors, lrs):
        torch.ops.bigbatch.step_with(opt._handle, params, grads, tensors, fields, owners, lrs)

    eager = ([p.detach().clone() for p in opt._params()], [t.clone() for t in tensors])
    step(*eager[:1], grads, eager[1], opt._rates())
    for backend in ("aot_eager", "inductor"):
        torch._dynamo.reset()
        mine = ([p.detach().clone() for p in opt._params()], [t.clone() for t in tensors])
        torch.compile(step, backend=backend, fullgraph=True)(mine[0], grads, mine[1], opt._rates())
        assert_same_bits(mine[0], eager[0])
        assert_same_bits(mine[1], eager[1])


def test_step_with_refuses_what_it_cannot_step():
    model, opt = _held_model("LAMB", lr=1e-2)
    grads = _backward(model, 0, opt)
    params = [p.detach().clone() for p in opt._params()]
    with pytest.raises(ValueError, match="parameter 0 has a gradient and no state"):
        opt.step_with(params, grads, [{} for _ in params])
    opt.step()
    states = opt.state_tensors()
    with pytest.raises(ValueError, match="3 parameters, 6 gradients and 6 states"):
        opt.step_with(params[:3], grads, states)
    states[0]["step"] = 1
    with pytest.raises(ValueError, match="field 'step' of parameter 0 is a int"):
        opt.step_with(params, grads, states)
    states = opt.state_tensors()
    states[1]["exp_avg"] = states[1]["exp_avg"].t()
    with pytest.raises(ValueError, match="is not contiguous"):
        opt.step_with(params, grads, states)
    before = [p.clone() for p in params]
    with pytest.raises(ValueError, match="parameter 2 is Float \\[7\\]"):
        opt.step_with(params[:2] + [torch.zeros(7)] + params[3:], grads, opt.state_tensors())
    assert_same_bits(params, before)


def test_the_step_shows_in_the_profiler():
    p = [torch.randn(64, 64, requires_grad=True)]
    opt = LAMB(p, lr=1e-3)
    p[0].grad = torch.randn(64, 64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        opt.step()
    assert "bigbatch::step" in {e.name for e in prof.events()}


def test_the_parameter_groups_of_the_helpers():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Linear(8, 8), torch.nn.LayerNorm(8),
                                torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    groups = bigbatch.optim.layerwise_param_groups(model, weight_decay=0.01)
    assert [len(g["params"]) for g in groups] == [4, 5]
    assert groups[1]["weight_decay"] == 0.0 and groups[1]["adapt"] is False
    opt = LAMB(groups, lr=1e-3)
    assert opt.param_groups[0]["weight_decay"] == 0.01 and opt.param_groups[1]["adapt"] is False
    groups = bigbatch.optim.muon_param_groups(model, lr=0.02)
    hidden, adamw, plain = (g["params"] for g in groups)
    assert [p is model[1].weight or p is model[3].weight for p in hidden] == [True, True]
    assert {id(p) for p in adamw} == {id(model[0].weight), id(model[4].weight)}
    assert len(plain) == 5 and groups[2]["weight_decay"] == 0.0
    Muon(groups)


def test_trust_ratios_and_state_bytes():
    params, grads = tensors()
    mine = leaves(params)
    opt = make("lamb", mine)
    assert opt.trust_ratios() == [] and opt.state_bytes() == 0
    run(opt, mine, grads[:1])
    ratios = opt.trust_ratios()
    assert [p is q for (p, _), q in zip(ratios, mine[:2])] == [True, True]  # the matrices' group adapts
    assert all(r > 0 for _, r in ratios)
    assert opt.state_bytes() == sum(2 * 4 * p.numel() for p in mine)  # exp_avg and exp_avg_sq in fp32


def test_a_bad_rate_is_refused_at_the_step_which_changes_nothing():
    p = [torch.zeros(3, 3, requires_grad=True)]
    opt = LAMB(p, lr=0.1)
    p[0].grad = torch.ones(3, 3)
    for lr in (-1.0, float("nan")):
        opt.param_groups[0]["lr"] = lr
        with pytest.raises(ValueError, match=r"LAMB option lr: (-1|nan)"):
            opt.step()
        assert torch.equal(p[0].detach(), torch.zeros(3, 3))


def test_the_step_bumps_the_parameters_versions_as_an_inplace_op():
    w = torch.randn(4, 4, requires_grad=True)
    opt = LAMB([w], lr=0.1)
    loss = (w * w).sum()  # saves w for its backward
    loss.backward(retain_graph=True)
    opt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_state_that_does_not_fit_is_refused_and_loading_changes_nothing_then():
    params, grads = tensors()
    mine = leaves(params)
    opt = make("lamb", mine)
    run(opt, mine, grads[:2])
    good = opt.state_dict()
    before = {i: {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in s.items()}
              for i, s in good["state"].items()}

    def broken(index, **change):
        sd = {"state": {i: dict(s) for i, s in good["state"].items()},
              "param_groups": [dict(g, weight_decay=0.3) for g in good["param_groups"]], "bigbatch": good["bigbatch"]}
        sd["state"][index].update(change)
        return sd

    cases = [
        (broken(0, exp_avg=torch.tensor(0.5)), r"field 'exp_avg' is Float \[\] on cpu; it must be float32 shaped like"),
        (broken(1, exp_avg_sq=torch.zeros(3)), r"field 'exp_avg_sq' is Float \[3\]"),
        (broken(2, moment=torch.zeros(33)), r"no field 'moment'"),
        (broken(0, step=torch.tensor(2.0)), r"field 'step' must be an integer"),
        (broken(0, exp_avg=good["state"][0]["exp_avg"].double()), r"field 'exp_avg' is Double"),
    ]
    for sd, message in cases:
        with pytest.raises(ValueError, match=message):
            opt.load_state_dict(sd)
        assert opt.param_groups[0]["weight_decay"] == 0.01  # nothing applied
        for i, s in before.items():
            for k, v in s.items():
                got = opt.state[mine[i]][k]
                assert torch.equal(got, v) if isinstance(v, torch.Tensor) else got == v
    # torch.optim's state does not carry over: its options (fused=None) and fields are not these.
    others = leaves([p.detach() for p in mine])
    adamw = torch.optim.AdamW([{"params": others[:2]}, {"params": others[2:]}])
    for p in others:
        p.grad = torch.ones_like(p)
    adamw.step()
    with pytest.raises(ValueError, match=r"Invalid LAMB option fused: null \(must be true or false\)"):
        opt.load_state_dict(adamw.state_dict())
    # A column-major state tensor is taken as its values, not its memory.
    twin = leaves([p.detach() for p in mine])
    twin_opt = make("lamb", twin)
    sd = opt.state_dict()
    sd["state"] = {i: dict(s) for i, s in sd["state"].items()}
    sd["state"][0]["exp_avg"] = sd["state"][0]["exp_avg"].t().contiguous().t()
    twin_opt.load_state_dict(sd)
    run(opt, mine, grads[2:])
    run(twin_opt, twin, grads[2:])
    assert_same_bits(mine, twin)


@pytest.mark.parametrize("case", list(CASES))
def test_channels_last_weights_step_as_contiguous_ones(case):
    """A channels_last convolution weight (the usual ResNet layout) steps on
    the fused engine bit for bit as its contiguous twin, without a warning;
    Muon's, SOAP's and Shampoo's fused steps read matrices in memory order,
    so there it takes the reference path with one warning saying why, and
    agrees to rounding."""
    cls, options, _, dtype = CASES[case]
    params, grads = tensors(dtype)
    last = torch.channels_last

    def channels_last(t):
        return t if t is None or t.dim() != 4 else t.contiguous(memory_format=last)

    a = leaves(params)
    b = [channels_last(p.clone()).requires_grad_(True) for p in params]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(make(case, a), a, grads)
        run(make(case, b), b, [[channels_last(g) for g in step] for step in grads])
    said = [str(w.message) for w in caught if "steps on the reference path" in str(w.message)]
    assert b[1].is_contiguous(memory_format=last)
    if cls in (Muon, SOAP, Shampoo):
        assert len(said) == 1 and "strides [27, 1, 9, 3]) is not contiguous" in said[0], said
    else:
        assert said == []
    if cls in (Muon, SOAP, Shampoo) or not options.get("fused", True):
        # (Shampoo: the whole step, the 1-D parameters' too, took the other
        # path, and their rank-short factors amplify rounding: formulas.md)
        tol = dict(rtol=1e-3, atol=1e-5) if cls is Shampoo else dict(rtol=1e-5, atol=1e-6)
        for x, y in zip(a, b):
            torch.testing.assert_close(x.detach(), y.detach(), **tol)
    else:
        assert_same_bits(a, b)


def test_a_step_the_engine_cannot_take_warns_once_with_its_reason():
    wide = torch.randn(8, 12)
    strided = wide[:, ::2]
    opt = LAMB([strided], lr=0.01)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            strided.grad = torch.randn(8, 6)
            opt.step()
    said = [str(w.message) for w in caught if "steps on the reference path" in str(w.message)]
    assert len(said) == 1, said
    assert "a parameter (sizes [8, 6], strides [12, 2]) is not dense and non-overlapping" in said[0]


def test_the_state_fields_are_those_a_step_makes():
    for cls, extra in [(LAMB, {}), (LARS, {"lr": 0.1}), (LARC, {"lr": 0.1}), (NovoGrad, {}), (Lion, {})]:
        p = [torch.randn(4, 4).bfloat16().requires_grad_(True)]
        opt = cls(p, master_weights=True, **extra)
        p[0].grad = torch.randn(4, 4).bfloat16()
        opt.step()
        assert list(opt.state[p[0]]) == list(torch.ops.bigbatch.state_fields(cls._kind)), cls
    w, b = torch.randn(4, 4, requires_grad=True), torch.randn(4, requires_grad=True)
    opt = Muon([{"params": [w]}, {"params": [b], "orthogonalize": False}], master_weights=True)
    w.grad, b.grad = torch.randn(4, 4), torch.randn(4)
    opt.step()
    fields = set(opt.state[w]) | set(opt.state[b])
    assert fields | {"master"} == set(torch.ops.bigbatch.state_fields("Muon"))


def test_hooks_empty_groups_and_a_state_reset():
    p = [torch.randn(3, 3, requires_grad=True)]
    opt = LAMB(p, lr=0.1)
    seen = []
    opt.register_state_dict_pre_hook(lambda o: seen.append("pre"))
    opt.register_state_dict_post_hook(lambda o, sd: {**sd, "note": 1})
    opt.register_load_state_dict_post_hook(lambda o: seen.append("loaded"))
    p[0].grad = torch.ones(3, 3)
    opt.step()
    sd = opt.state_dict()
    assert seen == ["pre"] and sd["note"] == 1
    opt.load_state_dict(sd)
    assert seen[-1] == "loaded"
    assert len(opt.state) == 1
    opt.state = {}  # torch.optim's reset
    assert len(opt.state) == 0
    empty = LAMB([{"params": []}], lr=0.1)
    assert empty.step(lambda: torch.tensor(1.0)).item() == 1.0


# Every option of each C++ optimizer, by name (written out here, not read
# from the library): each class takes each as a keyword argument, and a value
# other than the default reaches the C++ optimizer's group.
OPTIONS = {
    "LARS": "lr momentum weight_decay trust_coefficient eps nesterov adapt always_adapt skip_nonfinite fused "
            "master_weights",
    "LARC": "lr momentum weight_decay trust_coefficient eps clip nesterov adapt always_adapt skip_nonfinite fused "
            "master_weights",
    "LAMB": "lr betas eps weight_decay bias_correction grad_averaging adam_w_mode max_grad_norm always_adapt "
            "trust_clip min_trust max_trust adapt skip_nonfinite fused master_weights",
    "NovoGrad": "lr betas eps weight_decay grad_averaging adapt skip_nonfinite fused master_weights",
    "Lion": "lr betas weight_decay adapt skip_nonfinite fused master_weights",
    "Muon": "lr weight_decay orthogonalize momentum nesterov ns_coefficients ns_steps eps adjust_lr ns_bfloat16 "
            "adamw_betas adamw_eps skip_nonfinite fused master_weights",
    "AdamWScheduleFree": "lr betas eps weight_decay warmup_steps r weight_lr_power adapt skip_nonfinite fused "
                         "master_weights",
    "SGDScheduleFree": "lr momentum weight_decay warmup_steps r weight_lr_power adapt skip_nonfinite fused "
                       "master_weights",
    "SOAP": "lr betas shampoo_beta eps weight_decay precondition_frequency max_precond_dim merge_dims "
            "precondition_1d normalize_grads correct_bias adapt skip_nonfinite fused master_weights",
    "Shampoo": "lr betas epsilon momentum dampening weight_decay max_preconditioner_dim precondition_frequency "
               "start_preconditioning_step inv_root_override use_nesterov use_bias_correction "
               "use_decoupled_weight_decay grafting grafting_beta2 grafting_epsilon use_merge_dims precondition_1d "
               "adapt skip_nonfinite fused master_weights",
}


def _another(key, value):
    if key == "start_preconditioning_step":  # -1, or at least precondition_frequency
        return 5
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return 1000.0 if value == float("inf") else (0.125 if value == 0 else value / 2)
    if isinstance(value, tuple):
        return tuple(v / 2 for v in value)
    return {"adjust_lr": "spectral_unclamped", "grafting": "rmsprop"}[key]


def test_every_option_of_every_optimizer_is_a_keyword_argument():
    import bigbatch.optim as bo
    assert sorted(torch.ops.bigbatch.kinds()) == sorted(OPTIONS)
    for kind, names in OPTIONS.items():
        cls = getattr(bo, kind)
        assert kind in bo.__all__ and cls._kind == kind
        required = {"lr": 0.1} if kind in ("LARS", "LARC") else {}
        p = [torch.zeros(4, 4, requires_grad=True)]
        defaults = cls(p, **required).defaults
        assert set(defaults) == set(names.split()), kind
        for key in names.split():
            if key == "lr":
                continue
            value = _another(key, defaults[key])
            # As a keyword argument (every group's), and as one group's own.
            for opt in (cls(p, **required, **{key: value}), cls([{"params": p, key: value}], **required)):
                assert opt.param_groups[0][key] == value
                sent = _ops.loads(torch.ops.bigbatch.group_options(opt._handle, 0))
                assert sent[key] == value, (kind, key)
        assert all(key in cls.__doc__ for key in names.split()), kind


# torch.optim's contract where checkpointing and parameter-group helpers
# rely on it: a parameter before its first step has the state {}; a
# state_dict without the "bigbatch" entry (torch.distributed.checkpoint keeps
# only "state" and "param_groups") loads and continues bit for bit; a group's
# key that is no option (timm's lr_scale) is kept, as torch.optim keeps it,
# and changes nothing of the step.
def test_state_dicts_without_the_bigbatch_entry_and_groups_with_keys_of_their_own():
    params, grads = tensors(seed=4, steps=6, gap=False)
    mine = leaves(params)
    opt = make("lamb", mine)
    assert opt.state[mine[0]] == {} and mine[0] not in opt.state and len(opt.state) == 0
    run(opt, mine, grads[:3])
    assert mine[0] in opt.state and len(opt.state) == len(mine)
    sd = opt.state_dict()
    plain = {"state": sd["state"], "param_groups": sd["param_groups"]}
    twin = leaves([p.detach() for p in mine])
    twin_opt = make("lamb", twin)
    twin_opt.load_state_dict(plain)
    run(opt, mine, grads[3:])
    run(twin_opt, twin, grads[3:])
    assert_same_bits(mine, twin)

    # timm's layer-decay groups: lr_scale is its scheduler's; the groups'
    # options are what they say, so the step is that of the same groups by hand.
    param_groups_layer_decay = reference("timm.optim._param_groups").param_groups_layer_decay
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    twin_model = copy.deepcopy(model)
    groups = param_groups_layer_decay(model, weight_decay=0.05, layer_decay=0.5)
    assert any("lr_scale" in g for g in groups)
    by_hand = [{"params": [dict(twin_model.named_parameters())[n] for n, q in model.named_parameters()
                           if any(q is r for r in g["params"])], "weight_decay": g["weight_decay"]} for g in groups]
    ours, theirs = LAMB(groups, lr=1e-2), LAMB(by_hand, lr=1e-2)
    assert [g.get("lr_scale") for g in ours.param_groups] == [g.get("lr_scale") for g in groups]
    x = torch.randn(16, 6)
    for _ in range(3):
        for m, o in ((model, ours), (twin_model, theirs)):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
    assert_same_bits(list(model.parameters()), list(twin_model.parameters()))
    sd = ours.state_dict()
    assert [g.get("lr_scale") for g in sd["param_groups"]] == [g.get("lr_scale") for g in groups]


# torch.distributed.checkpoint's optimizer state dict (parameters by their
# names, no "bigbatch" entry) round-trips into a fresh optimizer, which then
# continues bit for bit.
def test_torch_distributed_checkpoint_get_and_set_optimizer_state_dict():
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    twin = copy.deepcopy(model)
    x = torch.randn(16, 6)

    def step(m, o):
        o.zero_grad()
        m(x).square().mean().backward()
        o.step()

    opt = LAMB(bigbatch.optim.layerwise_param_groups(model, weight_decay=0.01), lr=1e-2)
    for _ in range(3):
        step(model, opt)
    osd = get_optimizer_state_dict(model, opt)
    assert set(osd) == {"state", "param_groups"} and "0.weight" in osd["state"]
    twin.load_state_dict(model.state_dict())
    twin_opt = LAMB(bigbatch.optim.layerwise_param_groups(twin, weight_decay=0.01), lr=1e-2)
    set_optimizer_state_dict(twin, twin_opt, osd)
    for _ in range(3):
        step(model, opt)
        step(twin, twin_opt)
    assert_same_bits(list(model.parameters()), list(twin.parameters()))


# optimizer.state is writable through the checked path: a field
# (state[p][k] = v, as a user or a tool that moves state does) or a whole
# state (state[p] = {...}, as Lightning's optimizer-to-device does), each
# checked as load_state_dict checks it; a refused write changes nothing.
def test_the_state_is_written_through_the_checked_path():
    params, grads = tensors(seed=5, steps=5, gap=False)
    mine, twin = leaves(params), leaves(params)
    opt, twin_opt = make("lamb", mine), make("lamb", twin)
    with pytest.raises(ValueError, match="no state before its first step"):
        opt.state[mine[0]]["exp_avg"] = torch.zeros_like(mine[0])
    run(opt, mine, grads[:2])
    run(twin_opt, twin, grads[:2])
    # One field: the C++ optimizer's moment is the one written.
    opt.state[mine[0]]["exp_avg"] = torch.zeros_like(mine[0])
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], torch.zeros_like(mine[0]))
    sd = twin_opt.state_dict()
    sd["state"] = {i: dict(s) for i, s in sd["state"].items()}
    sd["state"][0]["exp_avg"] = torch.zeros_like(twin[0])
    twin_opt.load_state_dict(sd)
    # Whole states, each replaced by a copy of itself (a move to the same device).
    for p, s in list(opt.state.items()):
        opt.state[p] = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in s.items()}
    run(opt, mine, grads[2:])
    run(twin_opt, twin, grads[2:])
    assert_same_bits(mine, twin)
    # Refused writes name the field and change nothing.
    before = opt.state_dict()["state"][1]["exp_avg_sq"].clone()
    with pytest.raises(ValueError, match=r"field 'exp_avg_sq' is Float \[3\]"):
        opt.state[mine[1]]["exp_avg_sq"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"no field 'moment'"):
        opt.state[mine[1]] = {"moment": torch.zeros_like(mine[1])}
    with pytest.raises(ValueError, match="cannot be removed"):
        del opt.state[mine[1]]["exp_avg"]
    assert torch.equal(opt.state_dict()["state"][1]["exp_avg_sq"], before)
    del opt.state[mine[1]]
    assert mine[1] not in opt.state and len(opt.state) == len(mine) - 1


# ZeroRedundancyOptimizer(optimizer_class=bigbatch.optim.LAMB) on 2 Gloo ranks
# (tests/python/zero_ranks.py): each rank's LAMB holds a part of the
# parameters; the consolidated state loads into a fresh one, which continues
# bit for bit, and the whole run equals one process's LAMB.
def test_zero_redundancy_optimizer_over_two_gloo_ranks_saves_and_loads():
    import json
    import pathlib
    import subprocess
    import sys
    script = pathlib.Path(__file__).resolve().parent / "zero_ranks.py"
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert 0 < result["local_params"] < result["all_params"], result  # each rank holds a part
    assert result["loaded_continues"] and result["equals_one_process"], result


def _fsdp_ranks(world, *kinds):
    import json
    import pathlib
    import subprocess
    import sys
    script = pathlib.Path(__file__).resolve().parent / "fsdp_ranks.py"
    proc = subprocess.run([sys.executable, str(script), str(world), *kinds], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# FSDP2 (fully_shard) on 2 and 4 Gloo ranks (tests/python/fsdp_ranks.py):
# each kind's sharded step against the same kind stepping the unsharded
# model with the same gradients. The pieces' norms are the whole tensors'
# (a weight's rank pieces start inside a chunk; a layer of 3 rows has an
# empty shard at 4 ranks): the parameters equal bit for bit, the trust
# ratios to the last bits of a double (a chunk split between two ranks is
# summed in two parts). Muon and SOAP step each matrix whole on its owner.
# Then the state (LAMB's or LARS's, and Muon's, whose owners hold whole
# matrices) goes through torch.distributed.checkpoint (DTensor fields) into
# a fresh sharded optimizer, which goes on as the saved one.
@pytest.mark.parametrize("world,kinds", [(2, ("LAMB", "LARS", "LARC", "NovoGrad", "Lion", "AdamWScheduleFree", "Muon", "SOAP",
                                              "Shampoo")),
                                         (4, ("LARS", "LAMB", "LARC", "NovoGrad", "Muon"))])
def test_fsdp2_steps_equal_the_unsharded_step(world, kinds):
    result = _fsdp_ranks(world, *kinds)
    for kind in kinds:
        r = result[kind]
        assert r["max_abs"] == 0.0, (kind, r)
        assert r["ratio_rel"] <= 1e-14, (kind, r)  # a few units in the last place of a double
        assert r["ratios"] == (2 if kind in ("LAMB", "LARS", "LARC") else 0), (kind, r)
    assert set(result["dcp"]) == {kinds[0], "Muon"}, result["dcp"]
    for kind, r in result["dcp"].items():
        assert r["continues"] and "DTensor" in r["field_types"], (kind, r)


def test_sharded_parameters_are_refused_where_they_cannot_be_stepped():
    """An FSDP1 flat parameter; a DTensor placed otherwise than FSDP2 places
    it, a plain parameter among DTensors, a DTensor group added later, the
    reference path: refused, naming what (docs/python.md). On a one-rank
    mesh a DTensor steps as its plain tensor does."""
    flat = torch.nn.Parameter(torch.randn(10))
    flat._is_flat_param = True  # what FSDP1 marks its FlatParameter with (FlatParameter's isinstance reads it)
    from torch.distributed.fsdp._flat_param import FlatParameter
    assert isinstance(flat, FlatParameter)
    with pytest.raises(ValueError, match="FSDP1's flat parameters are refused"):
        LAMB([flat], lr=1e-3)
    opt = LAMB([torch.nn.Parameter(torch.randn(3))], lr=1e-3)
    with pytest.raises(ValueError, match="FSDP1's flat parameters are refused"):
        opt.add_param_group({"params": [flat]})
    assert len(opt.param_groups) == 1
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        torch.manual_seed(0)
        whole = torch.randn(8, 4)
        shard = torch.nn.Parameter(distribute_tensor(whole, mesh, [Shard(0)]))
        plain = torch.nn.Parameter(whole.clone())
        with pytest.raises(ValueError, match=r"parameter 0 is a DTensor placed \(Shard\(dim=1\),\)"):
            bigbatch.optim.LARS([torch.nn.Parameter(distribute_tensor(whole, mesh, [Shard(1)]))], lr=0.1)
        with pytest.raises(ValueError, match="parameter 1 is a plain tensor among DTensor parameters"):
            bigbatch.optim.LARS([shard, torch.nn.Parameter(torch.randn(3))], lr=0.1)
        opt = bigbatch.optim.LARS([shard], lr=0.1, weight_decay=0.01)
        with pytest.raises(ValueError, match="must be given when the optimizer is made"):
            opt.add_param_group({"params": [torch.nn.Parameter(torch.randn(3))]})
        assert len(opt.param_groups) == 1
        twin = bigbatch.optim.LARS([plain], lr=0.1, weight_decay=0.01)
        for _ in range(2):
            g = torch.randn(8, 4)
            shard.grad = distribute_tensor(g, mesh, [Shard(0)])
            plain.grad = g
            opt.step()
            twin.step()
        assert torch.equal(shard.full_tensor(), plain)
        assert torch.equal(opt.state[shard]["momentum_buffer"].full_tensor(), twin.state[plain]["momentum_buffer"])
        reference = bigbatch.optim.LAMB([torch.nn.Parameter(distribute_tensor(whole, mesh, [Shard(0)]))], lr=1e-3,
                                        fused=False)
        reference.param_groups[0]["params"][0].grad = distribute_tensor(whole, mesh, [Shard(0)])
        with pytest.raises(RuntimeError, match="a sharded step runs on the fused engine only"):
            reference.step()
    finally:
        if started:
            dist.destroy_process_group()
