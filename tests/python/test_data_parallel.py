"""Replicated weights under torch.distributed (torchrun, gloo; 2 and 4 processes): plain tensors
with distmuon.torch.Muon(data_parallel_group=...), DTensor Replicate() parameters and HSDP's
(Replicate, Shard(0)) 2-D mesh are orthogonalised once, on one home rank of their replicas, and
equal every replica's own NS bit for bit (the home runs the same NS on the same bits; the
exchanges only copy: tolerance 0). docs/data-parallel.md."""
import pytest
import torch
import torch.distributed as dist

import distmuon.torch as dmt

from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

SHAPES = [(24, 16), (16, 40), (32, 32), (12, 20), (40, 8)]


pytestmark = pytest.mark.usefixtures("gloo")


def _full(k, step=None):
    g = torch.Generator().manual_seed(100 * k + (0 if step is None else step + 1))
    m, n = SHAPES[k]
    return torch.randn(m, n, generator=g) * (0.1 if step is None else 1.0)


def _run(make, replica_mode, tp_mode="auto", steps=3, **kw):
    """make(k, full) -> the parameter of weight k; the same gradients on every replica."""
    params = [torch.nn.Parameter(make(k, _full(k))) for k in range(len(SHAPES))]
    opt = dmt.Muon(params, lr=0.02, weight_decay=0.01, ns_coefficients="quintic",
                   adjust_lr_fn="spectral", tp_mode=tp_mode, replica_mode=replica_mode, **kw)
    for s in range(steps):
        for k, p in enumerate(params):
            p.grad = make(k, _full(k, s))
        opt.step()
    info = [i for core, _ in opt._cores for i in core.parameters()]
    return [p.detach().to_local() if hasattr(p, "to_local") else p.detach() for p in params], info


def _expect_homes(a, b, info, replicas):
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert all(i["dp_size"] == replicas and i["home"] for i in info)
    assert {i["owner"] for i in info} <= set(range(dist.get_world_size()))


def test_plain_tensors_with_a_data_parallel_group():
    plain = lambda k, full: full.clone()  # noqa: E731
    home, info = _run(plain, "home", data_parallel_group="world")
    every, _ = _run(plain, "every_rank", data_parallel_group="world")
    _expect_homes(home, every, info, dist.get_world_size())


def test_dtensor_replicate():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    rep = lambda k, full: distribute_tensor(full, mesh, [Replicate()])  # noqa: E731
    home, info = _run(rep, "home")
    every, _ = _run(rep, "every_rank")
    _expect_homes(home, every, info, dist.get_world_size())


def test_hsdp_replicate_shard():
    if dist.get_world_size() != 4:
        pytest.skip("HSDP's 2 x 2 mesh needs 4 processes")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    hsdp = lambda k, full: distribute_tensor(full, mesh, [Replicate(), Shard(0)])  # noqa: E731
    # Owner mode's homes span the replicas: each weight's NS on one of the 4 ranks.
    home, info = _run(hsdp, "home", tp_mode="owner")
    every, _ = _run(hsdp, "every_rank", tp_mode="owner")
    _expect_homes(home, every, info, 2)


def test_bf16_wire_within_bf16_rounding_and_replicas_equal():
    """replica_wire="bf16": one step; every replica holds the same bits, and each element of the
    step's change is within bf16's rounding (2^-8 relative) of the fp32 wire's update
    (lr s u = -(w1 - w0) - lr wd w0), plus a few fp32 roundings of the weight (2^-21 |w0|)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    rep = lambda k, full: distribute_tensor(full, mesh, [Replicate()])  # noqa: E731
    fp32, _ = _run(rep, "home", steps=1)
    bf16, info = _run(rep, "home", steps=1, replica_wire="bf16")
    assert all(i["home"] for i in info)
    for k, (f, b) in enumerate(zip(fp32, bf16)):
        root = b.clone()
        dist.broadcast(root, 0)
        assert torch.equal(root, b)
        assert not torch.equal(f, b)
        w0 = _full(k).double()
        update = (f.double() - w0 + 0.02 * 0.01 * w0).abs()
        assert ((b.double() - f.double()).abs() <= update * 2**-8 + w0.abs() * 2**-21).all()


def test_homes_exchange_with_torch_async_work(monkeypatch):
    """The homes' results travel through torch's async_op work handles (the pipelined chunks'
    all-to-alls started while the next chunk's NS runs; one start per chunk per step), bit-equal
    to every replica's own NS."""
    from distmuon._torch_comm import TorchCollectives

    started = []
    start = TorchCollectives.start_all_to_all_v

    def counting(self, *args):
        work = start(self, *args)
        started.append(work is not None and hasattr(work, "wait"))
        return work

    monkeypatch.setattr(TorchCollectives, "start_all_to_all_v", counting)
    plain = lambda k, full: full.clone()  # noqa: E731
    home, info = _run(plain, "home", data_parallel_group="world")
    assert started and all(started)
    every, _ = _run(plain, "every_rank", data_parallel_group="world")
    _expect_homes(home, every, info, dist.get_world_size())
