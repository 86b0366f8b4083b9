"""Parameters under FSDP2 that torch.optim.Muon takes, in distmuon.torch.Muon, under torchrun at
2 processes (gloo): bfloat16 DTensor parameters step through float32 copies of their shards,
bit-equal to the same bfloat16 model stepped unsharded in one process (tp_mode duplicated
gathers each weight and runs the unsharded arithmetic; every rank feeds the same batch, so
FSDP2's averaged gradient is the unsharded one exactly).
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import distmuon
import distmuon.torch as dmt


@pytest.fixture(scope="module", autouse=True)
def _world():
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    torch.set_num_threads(1)
    yield


def _net(dtype):
    torch.manual_seed(4)
    return nn.Sequential(nn.Linear(12, 10), nn.Tanh(), nn.Linear(10, 7)).to(dtype)


def _train(model, opt, steps):
    for s in range(steps):
        g = torch.Generator().manual_seed(s)  # the same batch on every rank
        x = torch.randn(8, 12, generator=g).to(torch.bfloat16)
        opt.zero_grad()
        model(x).float().square().mean().backward()
        opt.step()


def test_bf16_fsdp2_parameters_equal_the_unsharded_step():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    sharded, ref = _net(torch.bfloat16), _net(torch.bfloat16)
    fully_shard(sharded, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    opt = dmt.Muon(sharded.parameters(), lr=0.02, adamw_lr=0.01, tp_mode="duplicated")
    ref_opt = dmt.Muon(ref.parameters(), lr=0.02, adamw_lr=0.01, tp_mode="duplicated",
                       process_group=distmuon.communicator())  # this process alone
    before = [p.detach().clone() for p in ref.parameters()]
    _train(sharded, opt, 3)
    _train(ref, ref_opt, 3)
    for p, q, q0 in zip(sharded.parameters(), ref.parameters(), before):
        assert isinstance(p, DTensor) and p.dtype == torch.bfloat16
        assert torch.equal(p.full_tensor(), q) and not torch.equal(q, q0)
    w = sharded[0].weight
    buf = opt.state[w]["momentum_buffer"]
    assert isinstance(buf, DTensor) and buf.dtype == torch.float32
    assert torch.equal(buf.full_tensor(), ref_opt.state[ref[0].weight]["momentum_buffer"])
