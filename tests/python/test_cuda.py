"""bigbatch.optim on CUDA tensors (skipped without a GPU): the same steps as
on the CPU within fp32 rounding (the fused CUDA kernels in a BIGBATCH_CUDA
build, the reference path's ATen ops otherwise), bf16 with master weights,
and the state moved through state_dict between devices."""
import pytest
import torch

from bigbatch.optim import LAMB, LARS, Lion, Muon, NovoGrad

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

SHAPES = [(17, 33), (8, 3, 3, 3), (33,), (1000, 257)]


def tensors(device, dtype=torch.float32, steps=4):
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=g).to(device, dtype).requires_grad_(True) for s in SHAPES]
    grads = [[torch.randn(s, generator=g).mul(0.1).to(device, dtype) for s in SHAPES] for _ in range(steps)]
    return params, grads


def run(opt, params, grads):
    for step in grads:
        for p, g in zip(params, step):
            p.grad = g.clone()
        opt.step()


@pytest.mark.parametrize("make", [lambda p: LAMB(p, lr=1e-2), lambda p: LARS(p, lr=0.1, weight_decay=1e-4),
                                  lambda p: NovoGrad(p, lr=1e-2), lambda p: Lion(p, lr=1e-3),
                                  lambda p: Muon([q for q in p if q.dim() >= 2], lr=0.02)])
def test_cuda_steps_match_the_cpu_steps(make):
    cpu, cpu_grads = tensors("cpu")
    gpu, gpu_grads = tensors("cuda")
    run(make(cpu), cpu, cpu_grads)
    run(make(gpu), gpu, gpu_grads)
    for a, b in zip(cpu, gpu):
        assert torch.allclose(a, b.cpu(), rtol=1e-5, atol=1e-6), (a - b.cpu()).abs().max()


def test_bf16_with_master_weights_on_cuda_and_its_state_moves_to_the_cpu():
    gpu, grads = tensors("cuda", torch.bfloat16)
    opt = LAMB(gpu, lr=1e-2, master_weights=True)
    run(opt, gpu, grads[:2])
    state = opt.state_dict()
    assert state["state"][0]["master"].dtype == torch.float32 and state["state"][0]["master"].is_cuda
    cpu = [p.detach().cpu().requires_grad_(True) for p in gpu]
    cpu_opt = LAMB(cpu, lr=1e-2, master_weights=True)
    cpu_opt.load_state_dict(state)
    assert cpu_opt.state[cpu[0]]["master"].device.type == "cpu"
    run(opt, gpu, grads[2:])
    run(cpu_opt, cpu, [[g.cpu() for g in step] for step in grads[2:]])
    for a, b in zip(cpu, gpu):
        assert torch.allclose(a.float(), b.float().cpu(), rtol=1e-2, atol=1e-2)
