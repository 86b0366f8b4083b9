"""The tp-mode x layout matrix (tp_matrix.py) over torch.distributed (gloo), under torchrun with
2 and 4 processes, for both optimizers and two kinds of group: torch's own (the world "torch",
dist.group.WORLD and dist.new_group groups) and distmuon's over torch (a distmuon.Communicator of
the default group, and the groups of distmuon.process_groups, split through torch)."""
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist

import distmuon
import distmuon.torch as dmt
import tp_matrix

if not dist.is_initialized():
    dist.init_process_group("gloo")  # torchrun's environment
torch.set_num_threads(1)
G, R = dist.get_world_size(), dist.get_rank()

pytestmark = pytest.mark.skipif(G < 2 or G % 2, reason="the matrix needs an even world")


class TorchFamily:
    name = "torch"

    def __init__(self):
        self.world, self.size, self.rank = "torch", G, R
        self._cache = {}

    def groups(self, tp, gtp):
        if (tp, gtp) not in self._cache:
            # new_group is called by every process for every group, in the same order.
            mine = {}
            for rep in range(G // (tp * gtp)):
                for j in range(gtp):
                    ranks = [rep * tp * gtp + j * tp + i for i in range(tp)]
                    if tp < G:
                        grp = dist.new_group(ranks)
                        if R in ranks:
                            mine["tp"] = grp
                for i in range(tp):
                    ranks = [rep * tp * gtp + j * tp + i for j in range(gtp)]
                    if gtp < G:
                        grp = dist.new_group(ranks)
                        if R in ranks:
                            mine["gtp"] = grp
            self._cache[(tp, gtp)] = (mine.get("tp", dist.group.WORLD),
                                      mine.get("gtp", dist.group.WORLD))
        return self._cache[(tp, gtp)]


def torch_split_family():
    world = distmuon.communicator("torch")
    assert world.backend == "torch"
    return tp_matrix.SplitFamily("distmuon-over-torch", world)


@pytest.fixture(scope="module", params=["torch", "distmuon-over-torch"])
def checker(request):
    return tp_matrix.Checker(TorchFamily() if request.param == "torch" else torch_split_family())


@pytest.mark.parametrize("kind", tp_matrix.KINDS)
@pytest.mark.parametrize("mode", tp_matrix.MODES)
def test_matrix(checker, kind, mode):
    errors, _ = checker.check(kind, mode)
    assert not errors, "\n".join(errors)


def test_collectives():
    """Each collective through the torch callbacks (uneven all_to_all_v counts with zeros,
    in-place all_gather, reduce_scatter / all_reduce with each op, broadcast from the last rank,
    every dtype), over the world and over a split of it."""
    import collectives_check

    world = distmuon.communicator("torch")
    collectives_check.check_all(world)
    collectives_check.check_all(distmuon.process_groups(world, 2, G // 2).gtp)


def test_default_options_plan_owner_and_step():
    """The reported setting: TP-sharded weights, process_group and tp_mode left to their
    defaults, a bucket that auto gives to owner mode; the step runs and equals duplicated."""
    full = [torch.randn(64, 64, generator=torch.Generator().manual_seed(k)) for k in range(G)]

    def run(**mode):
        ps = [torch.nn.Parameter(f.chunk(G, 0)[R].contiguous()) for f in full]
        lays = [dmt.Layout(rows=64, cols=64, tp_dim=0, tp_group=dist.group.WORLD) for _ in ps]
        opt = dmt.Muon([{"params": ps, "layouts": lays}], **tp_matrix.HYPER, **mode)
        for step in range(2):
            for k, p in enumerate(ps):
                p.grad = torch.randn(64, 64, generator=torch.Generator().manual_seed(
                    100 * step + k)).chunk(G, 0)[R].contiguous()
            opt.step()
        return ps, [info["mode"] for info in opt.plan()]

    ps, modes = run()
    assert modes == ["owner"] * G
    dup, _ = run(tp_mode="duplicated")
    for a, b in zip(ps, dup):
        assert torch.equal(a, b)


def test_subgroup_split_is_refused_on_its_members():
    """torch.distributed cannot create a group from a subset of the processes: splitting a
    subgroup is refused with a distmuon.Error on each of its members (none waits)."""
    halves = [dist.new_group(list(range(h * G // 2, (h + 1) * G // 2))) for h in range(2)]
    sub = distmuon.communicator(halves[R // (G // 2)])
    assert sub.size == G // 2
    with pytest.raises(distmuon.Error, match="only the world communicator can be split"):
        sub.split(0, sub.rank)
    dist.barrier()
