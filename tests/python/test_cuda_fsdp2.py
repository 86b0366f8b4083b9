"""FSDP2 on CUDA at world size 1 (the device check): a model whose parameters fully_shard made
DTensors on a CUDA mesh goes to distmuon.torch.Muon as it is, and its steps equal the same model's
plain CUDA parameters stepped by distmuon (fp32 NS; relative tolerance 1e-6: the same products
on the same device, the DTensor path only adds views). bfloat16 and 3-D (a batch of experts)
DTensors likewise, each element within one bf16 step: both go through the same float32 copies
on the device. Needs a
GPU: skipped without torch.cuda or without distmuon's CUDA backend."""
import copy

import pytest
import torch
import torch.nn as nn

import distmuon
import distmuon.torch as dmt

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or "cuda" not in distmuon._core.backend_names(),
    reason="needs a CUDA device and a CUDA build of distmuon")


def _nccl_world(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1, device_id=torch.device("cuda", 0))


def test_fsdp2_cuda_parameters_step_as_plain_ones(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    _nccl_world(tmp_path)
    try:
        torch.manual_seed(0)
        plain = nn.Sequential(nn.Linear(48, 64, bias=False), nn.Linear(64, 32, bias=False)).cuda()
        sharded = copy.deepcopy(plain)
        fully_shard(sharded, mesh=init_device_mesh("cuda", (1,)))
        assert all(p.device.type == "cuda" for p in sharded.parameters())
        a = dmt.Muon(list(sharded.parameters()), lr=0.02, precision="fp32")
        b = dmt.Muon(list(plain.parameters()), lr=0.02, precision="fp32",
                     process_group=distmuon.communicator(None))
        for step in range(3):
            x = torch.randn(16, 48, device="cuda", generator=None)
            for net, opt in ((sharded, a), (plain, b)):
                opt.zero_grad()
                net(x).square().mean().backward()
                opt.step()
        for p, q in zip(sharded.parameters(), plain.parameters()):
            local = p.to_local() if hasattr(p, "to_local") else p
            rel = float((local.detach() - q.detach()).norm() / q.detach().norm())
            assert rel <= 1e-6, rel
    finally:
        dist.destroy_process_group()


class _Experts(nn.Module):
    """A batch of 4 expert matrices in one 3-D parameter, applied to the same input."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 32, 24) / 24**0.5)

    def forward(self, x):
        return torch.einsum("bn,emn->bm", x, self.w)


def test_fsdp2_cuda_bf16_and_3d_parameters_step_as_plain_ones(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    _nccl_world(tmp_path)
    try:
        torch.manual_seed(0)
        plain = nn.Sequential(nn.Linear(40, 24, bias=False), _Experts()).cuda().bfloat16()
        sharded = copy.deepcopy(plain)
        fully_shard(sharded, mesh=init_device_mesh("cuda", (1,)))
        assert all(p.device.type == "cuda" and p.dtype == torch.bfloat16
                   for p in sharded.parameters())
        a = dmt.Muon(list(sharded.parameters()), lr=0.02, precision="fp32")
        b = dmt.Muon(list(plain.parameters()), lr=0.02, precision="fp32",
                     process_group=distmuon.communicator(None))
        initial = [q.detach().clone() for q in plain.parameters()]
        for step in range(3):
            x = torch.randn(16, 40, device="cuda").bfloat16()
            for net, opt in ((sharded, a), (plain, b)):
                opt.zero_grad()
                net(x).float().square().mean().backward()
                opt.step()
        for p, q in zip(sharded.parameters(), plain.parameters()):
            local = p.to_local() if hasattr(p, "to_local") else p
            assert local.dtype == torch.bfloat16 and local.shape == q.shape
            # The same products on the same device; a product whose fp32 sum differs in its
            # last bits (another cuBLAS algorithm for another alignment) may round to the
            # neighbouring bf16 value: one bf16 step (2^-8 relative) per element at most.
            diff = (local.float() - q.float()).abs()
            assert bool((diff <= q.float().abs() * 2**-8 + 1e-30).all()), float(diff.max())
        assert not any(torch.equal(q, q0) for q, q0 in zip(plain.parameters(), initial))
        moments = [s["momentum_buffer"] for s in a.state_dict()["state"].values()]
        assert [m.shape for m in moments] == [q.shape for q in plain.parameters()]
        assert all(m.to_local().device.type == "cuda" for m in moments)
    finally:
        dist.destroy_process_group()
