"""distmuon.torch.Muon on CUDA tensors at 2 ranks under torchrun (the device check): weights
sharded over the ranks (rows, then columns) in the owner, distributed and auto modes against the
same weights stepped unsharded on one rank (fp32 NS; relative tolerance 1e-5: the sharded modes
sum the same products in other orders). DISTMUON_TEST_TORCH_BACKEND says the process group:
"gloo" with DISTMUON_CUDA_DATA_PLANE=host (two ranks may share one GPU: the data plane stages
through the host), "nccl" with one GPU per rank (distmuon's NCCL data plane). Skipped without a
GPU, without a CUDA build, or outside torchrun."""
import os

import pytest
import torch

import distmuon
import distmuon.torch as dmt

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or "cuda" not in distmuon._core.backend_names() or
    "LOCAL_RANK" not in os.environ,
    reason="needs a CUDA device, a CUDA build of distmuon and torchrun")

H, D = 64, 48


@pytest.fixture(scope="module")
def world():
    import torch.distributed as dist

    backend = os.environ.get("DISTMUON_TEST_TORCH_BACKEND", "gloo")
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    if backend == "nccl":
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    yield dist.get_world_size(), dist.get_rank(), device
    dist.destroy_process_group()


def _weights(device):
    g = torch.Generator().manual_seed(5)
    return (torch.randn(H, D, generator=g) / D ** 0.5).to(device), \
        (torch.randn(D, H, generator=g) / H ** 0.5).to(device)


def _grads(step, device):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(H, D, generator=g).to(device), torch.randn(D, H, generator=g).to(device)


@pytest.mark.parametrize("mode", ["owner", "distributed", "auto"])
def test_sharded_cuda_steps_match_one_rank(world, mode):
    size, rank, device = world
    w1, w2 = _weights(device)
    p1 = torch.nn.Parameter(w1.chunk(size, 0)[rank].contiguous())
    p2 = torch.nn.Parameter(w2.chunk(size, 1)[rank].contiguous())
    layouts = [dmt.Layout(rows=H, cols=D, tp_dim=0, tp_group="world"),
               dmt.Layout(rows=D, cols=H, tp_dim=1, tp_group="world")]
    opt = dmt.Muon([{"params": [p1, p2], "layouts": layouts}], lr=0.02, tp_mode=mode,
                   precision="fp32")
    q1, q2 = torch.nn.Parameter(w1.clone()), torch.nn.Parameter(w2.clone())
    ref = dmt.Muon([q1, q2], lr=0.02, precision="fp32",
                   process_group=distmuon.communicator(None))
    for step in range(3):
        g1, g2 = _grads(step, device)
        p1.grad = g1.chunk(size, 0)[rank].contiguous()
        p2.grad = g2.chunk(size, 1)[rank].contiguous()
        q1.grad, q2.grad = g1, g2
        opt.step()
        ref.step()
    for got, want in ((p1, q1.detach().chunk(size, 0)[rank]),
                      (p2, q2.detach().chunk(size, 1)[rank])):
        rel = float((got.detach() - want).norm() / want.norm())
        assert rel <= 1e-5, (mode, rel)
