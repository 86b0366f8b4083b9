"""Parameters under FSDP2 in distmuon.torch.Muon, under torchrun at 2 processes (gloo): bfloat16
DTensor parameters (through float32 copies of their shards) and 3-D expert batches (FSDP2 splits
them over their first dimension: each rank whole matrices), bit-equal to the same model stepped
unsharded in one process (tp_mode duplicated gathers each 2-D weight and runs the unsharded
arithmetic; every rank feeds the same batch, so FSDP2's averaged gradient is the unsharded one
exactly); torch's checkpoint helpers round-trip the experts' state; an uneven split of the
batch is refused with its reason.
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import distmuon
import distmuon.torch as dmt


pytestmark = pytest.mark.usefixtures("gloo")


class Experts(nn.Module):
    """A dense layer, then a batch of experts [E, 7, 10] (each token through every expert)."""

    def __init__(self, experts):
        super().__init__()
        self.inp = nn.Linear(12, 10)
        self.experts = nn.Parameter(torch.randn(experts, 7, 10) / 10 ** 0.5)

    def forward(self, x):
        return torch.einsum("bi,eoi->beo", torch.tanh(self.inp(x)), self.experts)


def _net(dtype, experts=0):
    torch.manual_seed(4)
    if experts:
        return Experts(experts).to(dtype)
    return nn.Sequential(nn.Linear(12, 10), nn.Tanh(), nn.Linear(10, 7)).to(dtype)


def _shard(model):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    return model


def _train(model, opt, steps):
    for s in range(steps):
        g = torch.Generator().manual_seed(s)  # the same batch on every rank
        x = torch.randn(8, 12, generator=g).to(next(model.parameters()).dtype)
        opt.zero_grad()
        model(x).float().square().mean().backward()
        opt.step()


@pytest.mark.parametrize("momentum_dtype", ["fp32", "param"])
def test_bf16_fsdp2_parameters_equal_the_unsharded_step(momentum_dtype):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    sharded, ref = _net(torch.bfloat16), _net(torch.bfloat16)
    fully_shard(sharded, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    opt = dmt.Muon(sharded.parameters(), lr=0.02, adamw_lr=0.01, tp_mode="duplicated",
                   momentum_dtype=momentum_dtype)
    ref_opt = dmt.Muon(ref.parameters(), lr=0.02, adamw_lr=0.01, tp_mode="duplicated",
                       process_group=distmuon.communicator(),  # this process alone
                       momentum_dtype=momentum_dtype)
    before = [p.detach().clone() for p in ref.parameters()]
    _train(sharded, opt, 3)
    _train(ref, ref_opt, 3)
    for p, q, q0 in zip(sharded.parameters(), ref.parameters(), before):
        assert isinstance(p, DTensor) and p.dtype == torch.bfloat16
        assert torch.equal(p.full_tensor(), q) and not torch.equal(q, q0)
    # A local shard of the padded shard's shape is stepped where it lies (no float32 copy kept
    # between steps); only a shorter one is staged through a zero-padded float32 copy.
    entries = [e.dt for _, es in opt._cores for e in es]
    direct = [e for e in entries if not e.staged]
    assert direct and all(e.work.data_ptr() == e.local.data_ptr() for e in direct)
    w = sharded[0].weight
    buf = opt.state[w]["momentum_buffer"]
    dtype = torch.float32 if momentum_dtype == "fp32" else torch.bfloat16
    assert isinstance(buf, DTensor) and buf.dtype == dtype
    assert torch.equal(buf.full_tensor(), ref_opt.state[ref[0].weight]["momentum_buffer"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fsdp2_expert_batches_equal_the_unsharded_step(dtype):
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.tensor import DTensor

    experts = 2 * dist.get_world_size()
    sharded, ref = _shard(_net(dtype, experts)), _net(dtype, experts)
    assert isinstance(sharded.experts, DTensor)
    opt = dmt.Muon(sharded.parameters(), lr=0.02, adamw_lr=0.01, tp_mode="duplicated")
    ref_opt = dmt.Muon(ref.parameters(), lr=0.02, adamw_lr=0.01, tp_mode="duplicated",
                       process_group=distmuon.communicator())
    _train(sharded, opt, 3)
    _train(ref, ref_opt, 3)
    assert torch.equal(sharded.experts.full_tensor(), ref.experts)
    # Each rank's experts are one C++ parameter, a batch of its local matrices.
    batches = [i["batch"] for i in opt.plan() if (i["rows"], i["cols"]) == (7, 10)]
    assert batches == [experts // dist.get_world_size()]
    buf = opt.state[sharded.experts]["momentum_buffer"]
    assert isinstance(buf, DTensor) and buf.shape == sharded.experts.shape
    assert torch.equal(buf.full_tensor(), ref_opt.state[ref.experts]["momentum_buffer"])
    k = list(sharded.parameters()).index(sharded.experts)
    before = [t.full_tensor() for t in opt.state_dict()["state"][k].values()
              if isinstance(t, DTensor)]
    msd, osd = get_state_dict(sharded, opt)
    set_state_dict(sharded, opt, model_state_dict=msd, optim_state_dict=osd)
    after = [t.full_tensor() for t in opt.state_dict()["state"][k].values()
             if isinstance(t, DTensor)]
    assert len(before) == 1 and torch.equal(before[0], after[0])
    _train(sharded, opt, 1)
    _train(ref, ref_opt, 1)
    assert torch.equal(sharded.experts.full_tensor(), ref.experts)


def test_uneven_expert_split_refused():
    sharded = _shard(_net(torch.float32, 2 * dist.get_world_size() - 1))
    with pytest.raises(distmuon.CollectiveError, match="split unevenly over"):
        dmt.Muon(sharded.parameters())
