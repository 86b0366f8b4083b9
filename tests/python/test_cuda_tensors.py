"""CUDA tensors from PyTorch (docs/python.md): newton_schulz and distmuon.torch.Muon on CUDA
tensors, where they lie, on PyTorch's current stream. Needs a GPU: skipped without
torch.cuda or without distmuon's CUDA backend (its CPU twin is test_device_twin.py, on the opaque
backend). No precision override is set (DISTMUON_CUDA_PRECISION): each call names its precision,
or takes the CUDA backend's default (bf16) where that is what is tested."""
import math

import pytest
import torch

import distmuon
import distmuon.torch as dmt

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or "cuda" not in distmuon._core.backend_names(),
    reason="needs a CUDA device and a CUDA build of distmuon")

# The published Muon's quintic, one tuple at every step (torch.optim.Muon's default).
PUBLISHED = (3.4445, -4.7750, 2.0315)


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm())


def rand(shape, seed, device="cuda"):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(device)


@pytest.mark.parametrize("shape,algorithm", [((64, 96), "standard"), ((160, 48), "gram")])
def test_newton_schulz_of_a_cuda_tensor_matches_the_cpu(shape, algorithm):
    x = rand(shape, 1)
    got = distmuon.newton_schulz(x, algorithm=algorithm, precision="fp32")
    assert got.device == x.device and got.dtype == torch.float32
    want = distmuon.newton_schulz(x.cpu(), algorithm=algorithm)
    # fp32 cuBLAS vs OpenBLAS: other summation orders (~1e-7 relative per product), amplified
    # by NS on the small singular values (up to a^steps ~ 3.4^5 ~ 500 for the quintic's first
    # coefficient): 1e-3 relative in the Frobenius norm leaves 10x room over that bound.
    assert rel(got, want) <= 1e-3
    # bfloat16: a float32 working copy on the device, the result rounded to bfloat16 once
    # (2^-9 relative per element: 1e-2 for the matrix).
    xb = x.to(torch.bfloat16)
    gb = distmuon.newton_schulz(xb, algorithm=algorithm, precision="fp32")
    assert gb.dtype == torch.bfloat16 and gb.device == x.device
    assert rel(gb, distmuon.newton_schulz(xb.cpu().float(), algorithm=algorithm)) <= 1e-2
    # In place, on the tensor's own memory.
    y = x.clone()
    ptr = y.data_ptr()
    assert distmuon.newton_schulz(y, algorithm=algorithm, inplace=True, precision="fp32") is y
    assert y.data_ptr() == ptr and rel(y, want) <= 1e-3


# The GPU at a reduced precision against the CPU's emulation of it (precision.h): the same
# operand roundings, fp32 accumulation in other orders, which moves an operand across a rounding
# boundary here and there (one unit: 2^-8 bf16, 2^-11 tf32) and NS amplifies that as it does
# the fp32 differences above. Bound: each precision's documented error against float64
# (docs/precision.md: tf32 under 4e-3, bf16 under 3e-2 on every shape family). The default
# precision of a CUDA tensor's call is bf16.
@pytest.mark.parametrize("shape,algorithm", [((64, 96), "standard"), ((96, 96), "standard"),
                                             ((160, 48), "gram")])
@pytest.mark.parametrize("precision,tol", [("tf32", 4e-3), ("bf16", 3e-2), (None, 3e-2)])
def test_reduced_precision_on_the_gpu_matches_the_cpu_emulation(shape, algorithm, precision,
                                                                 tol):
    x = rand(shape, 5)
    got = distmuon.newton_schulz(x, algorithm=algorithm, precision=precision)
    want = distmuon.newton_schulz(x.cpu(), algorithm=algorithm, precision=precision or "bf16")
    exact = distmuon.newton_schulz(x.cpu(), algorithm=algorithm, precision="fp32")
    assert rel(got, want) <= tol
    assert rel(got, exact) > 1e-5  # the reduced precision is honoured, not fp32


def test_newton_schulz_runs_on_the_current_stream():
    src = rand((128, 128), 2)
    want = distmuon.newton_schulz(src.cpu())
    x = torch.zeros_like(src)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        # The input is written on s after ~50 ms of GPU sleep, with no host synchronisation:
        # a backend on any other stream would read the zeros.
        torch.cuda._sleep(100_000_000)
        x.copy_(src)
        y = distmuon.newton_schulz(x, precision="fp32")
        z = y * 2  # torch's own work after distmuon's, on the same stream
    s.synchronize()
    assert rel(y, want) <= 1e-3 and rel(z, 2 * want) <= 1e-3
    b = distmuon._core.backend("cuda", x.device.index, s.cuda_stream)
    assert b.name == f"cuda:{x.device.index}"


def test_cuda_errors():
    x = rand((8, 8), 3)
    with pytest.raises(distmuon.Error, match="mixed devices \\(cpu, cuda:0\\)"):
        distmuon.newton_schulz(x, out=torch.empty(8, 8))
    with pytest.raises(distmuon.Error, match="device 'opaque' with a tensor on cuda:0"):
        distmuon.newton_schulz(x, device="opaque")
    with pytest.raises(distmuon.Error, match="not row-major with unit column stride"):
        distmuon.newton_schulz(rand((8, 12), 4).T)
    p = torch.nn.Parameter(x.clone())
    with pytest.raises(distmuon.Error, match="device 'cpu' with parameters on cuda:0"):
        dmt.Muon([p], device="cpu")


def reference_ns(g, steps=5):
    """The published Muon's NS in fp64 on the device (torch only)."""
    x = g.double()
    x = x.T if g.shape[0] > g.shape[1] else x
    x = x / max(float(x.norm()), 1e-7)
    a, b, c = PUBLISHED
    for _ in range(steps):
        A = x @ x.T
        x = a * x + (b * A + c * (A @ A)) @ x
    return (x.T if g.shape[0] > g.shape[1] else x).float()


def reference_step(params, bufs, lr, wd, mu=0.95):
    """torch.optim.Muon's step (decoupled weight decay, Nesterov momentum, lr scaled by
    sqrt(max(1, rows / cols))), in plain PyTorch on the parameters' device, float32 state."""
    for p, buf in zip(params, bufs):
        g = p.grad.float()
        buf.lerp_(g, 1 - mu)
        u = g.lerp(buf, mu)
        o = reference_ns(u)
        w = p.detach().float() * (1 - lr * wd)
        w -= lr * math.sqrt(max(1.0, p.shape[0] / p.shape[1])) * o
        p.data.copy_(w.to(p.dtype))


# (parameter dtype, NS precision, tolerance on the weights after 3 steps; why beside the assert.)
@pytest.mark.parametrize("dtype,precision,tol", [(torch.float32, "fp32", 1e-4),
                                                 (torch.float32, "bf16", 2e-3),
                                                 (torch.bfloat16, None, 1e-2)])
def test_torch_muon_step_on_cuda_matches_a_pytorch_reference(dtype, precision, tol):
    shapes = [(96, 64), (64, 160), (128, 128)]
    params = [torch.nn.Parameter(rand(s, 10 + k).mul(0.05).to(dtype)) for k, s in enumerate(shapes)]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    bufs = [torch.zeros(s, device="cuda") for s in shapes]
    ptrs = [p.data_ptr() for p in params]
    opt = dmt.Muon(params, lr=0.02, weight_decay=0.1, precision=precision)  # None: cuda's bf16
    for step in range(3):
        for k, (p, r) in enumerate(zip(params, ref)):
            p.grad = rand(p.shape, 100 + 10 * step + k).to(dtype)
            r.grad = p.grad.clone()
        opt.step()
        reference_step(ref, bufs, 0.02, 0.1)
    assert [p.data_ptr() for p in params] == ptrs  # updated where they lie
    # fp32: the update differs by the NS difference above (fp32 vs the fp64 reference, < 1e-3
    # of the update), and the update is lr ~ 2% of the weight: 1e-4 relative on the weights.
    # fp32 weights, bf16 NS: the update is at most 2e-2 from fp64's (docs/precision.md), 2% of
    # the weight, over 3 steps: 2e-3 relative on the weights.
    # bf16 weights: both sides round the weight to bfloat16 after each step (2^-9 per element), and a
    # one-ulp difference in a rounding can flip: 1e-2 relative.
    for p, r in zip(params, ref):
        assert p.dtype == dtype and p.device.type == "cuda"
        assert rel(p.detach(), r.detach()) <= tol
    st = opt.state_dict()["state"][0]["momentum_buffer"]
    assert st.device == params[0].device and rel(st, bufs[0]) <= 1e-5


def test_nccl_data_plane_through_a_torch_process_group(tmp_path):
    """A torch.distributed NCCL group (one process here) as the host plane: the CUDA backend's
    data plane is distmuon's NCCL communicator, bootstrapped through it (its control buffers
    staged through CUDA tensors: an NCCL group has no CPU backend). A weight split over the
    world (of one) takes that path; it equals the unsplit step."""
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1, device_id=torch.device("cuda", 0))
    try:
        w = rand((64, 96), 7).mul(0.05)
        p = torch.nn.Parameter(w.clone())
        q = torch.nn.Parameter(w.clone())
        p.distmuon_layout = dmt.Layout(rows=64, cols=96, tp_dim=0, tp_group="world")
        # fp32 NS: the split path forms the other Gram side (96x96), equal to fp32 rounding.
        opt = dmt.Muon([p], lr=0.02, tp_mode="distributed", precision="fp32")
        assert opt.world.size == 1
        plain = dmt.Muon([q], lr=0.02, process_group=distmuon.communicator(None),
                         precision="fp32")
        for step in range(2):
            p.grad = rand(p.shape, 200 + step)
            q.grad = p.grad.clone()
            opt.step()
            plain.step()
        # The same products on the same device; the split path's all-gathers move bytes only.
        assert rel(p.detach(), q.detach()) <= 1e-6
    finally:
        dist.destroy_process_group()
