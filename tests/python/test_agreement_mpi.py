"""A refusal on one rank raises on every rank (run under mpirun -np 2): the Python layers'
own checks (arrays, storage, gradients, param groups) are agreed on before any collective, so no
rank is left waiting in a step (a hang fails the test by its ctest TIMEOUT), and nothing is
updated on any rank."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

import distmuon
import distmuon.torch as dmt

COMM = MPI.COMM_WORLD
G = COMM.Get_size()
R = COMM.Get_rank()
BAD = G - 1  # the rank whose input is wrong
ON_BAD = rf"rank\(s\) {BAD} of {G}"

if G < 2:
    pytest.skip("needs mpirun -np 2 or more", allow_module_level=True)

M, N = 8 * G, 12


def _rng(seed):
    return np.random.default_rng(seed + 100 * R)


def test_numpy_gradient_refused_on_one_rank():
    opt = distmuon.Muon(COMM, tp_mode="duplicated")
    shards = [_rng(k).standard_normal((M // G, N)).astype(np.float32) for k in range(2)]
    for k, s in enumerate(shards):
        opt.add_parameter(s, f"w{k}", M, N, tp_dim=0, tp_group=COMM)
    before = [s.copy() for s in shards]
    grads = [_rng(10 + k).standard_normal(s.shape).astype(np.float32) for k, s in
             enumerate(shards)]
    bad = list(grads)
    if R == BAD:
        bad[1] = bad[1].astype(np.float64)  # refused by the view before the C++ step
    with pytest.raises(distmuon.CollectiveError, match=ON_BAD + ".*float32"):
        opt.step(bad)
    assert opt.step_count == 0 and all(np.array_equal(a, b) for a, b in zip(shards, before))
    if R == BAD:
        bad = [grads[0], "not an array"]  # refused by the Python layer
    with pytest.raises(distmuon.CollectiveError, match=ON_BAD + ".*str"):
        opt.step(bad)
    with pytest.raises(distmuon.CollectiveError, match=ON_BAD + ".*mine"):
        opt.step(grads, failure="mine" if R == BAD else "")
    opt.step(grads)  # every rank still in step: the next step runs
    assert opt.step_count == 1 and not np.array_equal(shards[0], before[0])


@pytest.mark.parametrize("kind", ["float64", "not an array"])
def test_time_steps_gradient_refused_on_one_rank(kind):
    """The C++ timing loop (bench/python_step_overhead.py) views its gradients before the steps:
    one refused on one rank raises on every rank (before: that rank alone raised, the others
    waited in the first step), and no weight changes."""
    opt = distmuon.Muon(COMM, tp_mode="duplicated")
    shard = _rng(0).standard_normal((M // G, N)).astype(np.float32)
    opt.add_parameter(shard, "w", M, N, tp_dim=0, tp_group=COMM)
    before = shard.copy()
    grad = _rng(1).standard_normal(shard.shape).astype(np.float32)
    bad = grad
    if R == BAD:
        bad = grad.astype(np.float64) if kind == "float64" else kind
    with pytest.raises(distmuon.CollectiveError, match=ON_BAD + (".*float32" if kind == "float64"
                                                                 else ".*str")):
        opt._core.time_steps([bad], 2)
    assert np.array_equal(shard, before)
    assert len(opt._core.time_steps([grad], 2)) == 2  # every rank still in step
    assert not np.array_equal(shard, before)


def _two_groups(**options):
    torch.manual_seed(1 + R)
    p0 = torch.nn.Parameter(torch.randn(M // G, N))
    p1 = torch.nn.Parameter(torch.randn(M // G, N))
    layout = dmt.Layout(rows=M, cols=N, tp_dim=0, tp_group="world")
    opt = dmt.Muon([{"params": [p0], "layouts": [layout]},
                    {"params": [p1], "layouts": [layout], "lr": 0.01}],
                   process_group=COMM, tp_mode="duplicated", **options)
    for p in (p0, p1):
        p.grad = torch.randn_like(p)
    return opt, p0, p1


def _spoil(kind, p1):
    if kind == "sparse":
        p1.grad = torch.randn(M // G, N).to_sparse()
    elif kind == "dtype":  # torch refuses such a .grad; .grad.data takes it
        p1.grad.data = p1.grad.data.double()
    elif kind == "shape":
        p1.grad.data = torch.randn(M // G, N + 1)
    elif kind == "non-finite":
        p1.grad[0, 0] = float("inf")
    elif kind == "storage":
        p1.data = p1.data.clone()
    elif kind == "lr":
        return -1.0
    return None


@pytest.mark.parametrize("kind", ["sparse", "dtype", "shape", "non-finite", "storage", "lr"])
def test_torch_second_group_refused_on_one_rank(kind):
    opt, p0, p1 = _two_groups()
    before = (p0.detach().clone(), p1.detach().clone())
    if R == BAD:
        lr = _spoil(kind, p1)
        if lr is not None:
            opt.param_groups[1]["lr"] = lr
    want = {"sparse": "sparse", "dtype": "float64", "shape": "group 1 is", "non-finite":
            "non-finite", "storage": "new storage", "lr": "lr"}[kind]
    with pytest.raises(distmuon.CollectiveError, match=ON_BAD + ".*" + want):
        opt.step()
    # Group 0 did not step either, on any rank.
    assert torch.equal(p0, before[0]) and torch.equal(p1, before[1])
    assert [core.step_count for core, _ in opt._cores] == [0, 0]


def test_torch_gradient_missing_on_one_rank_only():
    # A parameter without a gradient on every rank is skipped on every rank; one that has a
    # gradient on some ranks only is refused on every rank (its collectives would differ).
    opt, p0, p1 = _two_groups()
    before = (p0.detach().clone(), p1.detach().clone())
    p1.grad = None
    opt.step()
    assert torch.equal(p1, before[1]) and not torch.equal(p0, before[0])
    p1.grad = torch.randn_like(p1)
    if R == BAD:
        p0.grad = None
    after = (p0.detach().clone(), p1.detach().clone())
    with pytest.raises(distmuon.CollectiveError, match=r"rank\(s\) " + str(BAD) + ".*active"):
        opt.step()
    assert torch.equal(p0, after[0]) and torch.equal(p1, after[1])


def test_torch_hyper_parameter_differs_on_one_rank():
    opt, p0, p1 = _two_groups()
    opt.param_groups[0]["momentum"] = 0.5 if R == BAD else 0.95
    before = p0.detach().clone()
    with pytest.raises(distmuon.CollectiveError, match=r"rank\(s\) " + str(BAD) + ".*momentum"):
        opt.step()
    assert torch.equal(p0, before)
    opt.param_groups[0]["momentum"] = 0.5  # agreed again: it steps
    opt.step()
    assert not torch.equal(p0, before)


def test_torch_load_state_dict_refused_on_one_rank():
    opt, p0, p1 = _two_groups()
    opt.step()
    sd = opt.state_dict()
    good = {k: v.clone() for k, v in sd["state"][0].items()}
    bad = {"state": {k: dict(v) for k, v in sd["state"].items()},
           "param_groups": sd["param_groups"]}
    if R == BAD:
        bad["state"][0]["momentum_buffer"] = torch.full_like(good["momentum_buffer"], np.nan)
    opt.param_groups[0]["lr"] = 0.003
    with pytest.raises(distmuon.CollectiveError, match=ON_BAD + ".*non-finite"):
        opt.load_state_dict(bad)
    # Nothing changed on any rank: the group's rate and the state are the ones before.
    assert opt.param_groups[0]["lr"] == 0.003
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"],
                       good["momentum_buffer"])


def test_torch_add_param_group_refused_on_one_rank():
    opt, p0, p1 = _two_groups()
    q = torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.float64 if R == BAD else torch.float32))
    with pytest.raises(distmuon.CollectiveError, match=ON_BAD + ".*float64"):
        opt.add_param_group({"params": [q]})
    # A shard that does not fit its layout on one rank (the C++ check).
    rows = M // G + (1 if R == BAD else 0)
    w = torch.nn.Parameter(torch.zeros(rows, N))
    with pytest.raises(distmuon.CollectiveError, match=ON_BAD + ".*local shard"):
        opt.add_param_group({"params": [w], "layouts": [dmt.Layout(rows=M, cols=N, tp_dim=0,
                                                                   tp_group="world")]})
    # Left out on every rank: the optimizer still steps its two groups together.
    assert len(opt.param_groups) == 2 and len(opt._cores) == 2
    before = p0.detach().clone()
    opt.step()
    assert not torch.equal(p0, before)
    assert [core.step_count for core, _ in opt._cores] == [1, 1]


@pytest.mark.parametrize("bad", ["a string", "an int group", "an object group"])
def test_torch_layout_bad_on_one_rank(bad):
    """A layout that is no Layout, or whose group cannot be a communicator, on one rank only:
    checked before the communicators are made (collective), so every rank raises (before: rank 1
    raised alone and rank 0 waited inside the constructor forever)."""
    w = torch.nn.Parameter(torch.zeros(M, N))
    if R == BAD:
        w.distmuon_layout = {"a string": "bogus",
                             "an int group": dmt.Layout(rows=M, cols=N, tp_dim=0, tp_group=7),
                             "an object group": dmt.Layout(rows=M, cols=N, gtp_group=object())
                             }[bad]
    with pytest.raises(distmuon.CollectiveError, match=ON_BAD + ".*(not a distmuon.torch.Layout|"
                       "expected None)"):
        dmt.Muon([w], process_group=COMM)
    w.distmuon_layout = None
    opt = dmt.Muon([w], process_group=COMM)  # the same parameter, a good layout: it works
    w.grad = torch.ones(M, N)
    opt.step()


def test_communicator_agree_or_throw():
    world = distmuon.communicator(COMM)
    world.agree_or_throw(True, "check")
    with pytest.raises(distmuon.CollectiveError, match=r"check failed on " + ON_BAD + ": why"):
        world.agree_or_throw(R != BAD, "check", "why" if R == BAD else "")


def test_collective_error_carries_its_scope():
    world = distmuon.communicator(COMM)
    with pytest.raises(distmuon.CollectiveError) as raised:
        world.agree_or_throw(R != BAD, "check")
    assert raised.value.is_world and raised.value.ranks == list(range(G))
    alone = world.split(R, 0)  # a group of this rank only: agreed there, not by the world
    with pytest.raises(distmuon.CollectiveError) as raised:
        alone.agree_or_throw(False, "alone")
    assert not raised.value.is_world
    assert raised.value.ranks == [R]
    assert f"of {G}" in raised.value.scope, raised.value.scope


def test_calibrate_output_checked_and_written_by_rank_0(tmp_path):
    folder = COMM.bcast(str(tmp_path) if R == 0 else None)
    # A folder as the output: refused on every rank before the measurements.
    with pytest.raises(distmuon.CollectiveError, match=r"rank\(s\) 0 of .*is a directory"):
        distmuon.calibrate(COMM, sizes=(32,), max_bytes=1024, out=folder)
    out = f"{folder}/profile.json"
    profile, _ = distmuon.calibrate(COMM, name="two", sizes=(32,), max_bytes=1024, out=out)
    COMM.Barrier()
    if R == 0:
        import json
        import os

        with open(out) as f:
            assert json.load(f) == profile
        assert os.listdir(folder) == ["profile.json"]  # one writer, no temporary left
    assert profile["name"] == "two"
