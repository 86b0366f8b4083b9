"""distmuon.torch.Muon over mpi4py (mpirun -np 2; any count works): the ranks agree on their param
groups before any collective of a group. A rank that holds another number of groups, or adds a
group the others do not, raises distmuon.CollectiveError on every rank instead of leaving the
ranks in different collectives (before: a hang)."""
import pytest
import torch
from mpi4py import MPI

import distmuon
import distmuon.torch

COMM = MPI.COMM_WORLD
G, R = COMM.Get_size(), COMM.Get_rank()


def params(seed, n=2):
    g = torch.Generator().manual_seed(seed)
    out = [torch.nn.Parameter(torch.randn(8, 6, generator=g)) for _ in range(n)]
    for p in out:
        p.grad = torch.randn(8, 6, generator=g)
    return out


def test_another_number_of_groups_on_one_rank():
    groups = [{"params": params(1)}]
    if R == G - 1:
        groups.append({"params": params(2)})
    with pytest.raises(distmuon.CollectiveError, match="param groups"):
        opt = distmuon.torch.Muon(groups, process_group=COMM, tp_mode="duplicated")
        opt.step()
    COMM.Barrier()


def test_a_group_added_on_one_rank():
    opt = distmuon.torch.Muon(params(3), process_group=COMM, tp_mode="duplicated")
    opt.step()
    before = [p.detach().clone() for g in opt.param_groups for p in g["params"]]
    with pytest.raises(distmuon.CollectiveError, match="param groups"):
        if R == 0:
            opt.add_param_group({"params": params(4)})
        opt.step()
    # The ranks that stepped did not update anything: the agreement comes first.
    if R != 0:
        after = [p.detach() for g in opt.param_groups for p in g["params"]]
        assert all(torch.equal(a, b) for a, b in zip(after, before))
    COMM.Barrier()


def test_the_same_groups_step():
    opt = distmuon.torch.Muon([{"params": params(5)}, {"params": params(6, 1), "lr": 0.01}],
                              process_group=COMM, tp_mode="duplicated")
    opt.step()
    opt.add_param_group({"params": params(7)})
    opt.step()
