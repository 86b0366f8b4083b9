"""distmuon.Muon over mpi4py (run under mpirun -np 2 and -np 4; one rank works too): sharded
weights with their layouts against a single-rank full-weight reference, checkpoints and
state_dict round trips."""
import os

import numpy as np
import pytest
from mpi4py import MPI

import distmuon

COMM = MPI.COMM_WORLD
G = COMM.Get_size()
R = COMM.Get_rank()


def full_weight(m, n, seed):
    return np.random.default_rng(seed).standard_normal((m, n)).astype(np.float32) * 0.1


def full_grad(m, n, seed, step):
    return np.random.default_rng(1000 * seed + step).standard_normal((m, n)).astype(np.float32)


def shard(full, dim, parts, index):
    return np.ascontiguousarray(np.split(full, parts, axis=dim)[index])


# (name, m, n, tp_dim); every weight split over all ranks.
WEIGHTS = [("w0", 8 * 4, 24, 0), ("w1", 16, 8 * 4, 1), ("w2", 8 * 4, 40, 0)]


def sharded_run(mode, steps, comm=COMM):
    opt = distmuon.Muon(comm, tp_mode=mode, lr=0.05, weight_decay=0.01)
    assert opt.world.size == G and opt.world.backend == "mpi"
    shards = []
    for k, (name, m, n, dim) in enumerate(WEIGHTS):
        s = shard(full_weight(m, n, k), dim, G, R)
        opt.add_parameter(s, name, m, n, tp_dim=dim, tp_group=comm)
        shards.append(s)
    for step in range(1, steps + 1):
        opt.step([shard(full_grad(m, n, k, step), dim, G, R)
                  for k, (_, m, n, dim) in enumerate(WEIGHTS)])
    return opt, shards


def reference_run(steps):
    opt = distmuon.Muon(None, tp_mode="duplicated", lr=0.05, weight_decay=0.01)
    fulls = []
    for k, (name, m, n, _) in enumerate(WEIGHTS):
        f = full_weight(m, n, k)
        opt.add_parameter(f, name)
        fulls.append(f)
    for step in range(1, steps + 1):
        opt.step([full_grad(m, n, k, step) for k, (_, m, n, _) in enumerate(WEIGHTS)])
    return fulls


def replicated_run(replica_mode, steps):
    """Every weight whole on every rank (data parallelism), declared replicated over COMM."""
    opt = distmuon.Muon(COMM, tp_mode="auto", replica_mode=replica_mode, lr=0.05,
                        weight_decay=0.01)
    fulls = []
    for k, (name, m, n, _) in enumerate(WEIGHTS):
        f = full_weight(m, n, k)
        opt.add_parameter(f, name, data_parallel_group=COMM)
        fulls.append(f)
    for step in range(1, steps + 1):
        opt.step([full_grad(m, n, k, step) for k, (_, m, n, _) in enumerate(WEIGHTS)])
    return opt, fulls


def test_replicated_weights_on_homes_equal_every_rank_ns():
    # The home runs the NS every replica would run on the same bits: equal, not close.
    opt, homes = replicated_run("home", 3)
    _, every = replicated_run("every_rank", 3)
    for h, e in zip(homes, every):
        assert np.array_equal(h, e)
    info = opt.parameters()
    assert all(p["dp_size"] == G and p["home"] == (G > 1) for p in info)
    if G > 1:
        assert {p["owner"] for p in info} <= set(range(G))


def test_duplicated_shards_equal_the_full_reference():
    _, shards = sharded_run("duplicated", 4)
    ref = reference_run(4)
    for s, f, (_, _, _, dim) in zip(shards, ref, WEIGHTS):
        # Duplicated mode gathers the full matrix and runs the same NS: bit-equal.
        assert np.array_equal(s, shard(f, dim, G, R))


def test_auto_and_distributed_within_tolerance():
    ref = reference_run(4)
    for mode in ("auto", "distributed"):
        opt, shards = sharded_run(mode, 4)
        for s, f, (_, _, _, dim) in zip(shards, ref, WEIGHTS):
            want = shard(f, dim, G, R)
            # Sharded Gram sums and Gram NS change the rounding only: fp32 over 4 steps.
            assert np.linalg.norm(s - want) <= 1e-4 * np.linalg.norm(want), mode
        if G > 1:
            assert all(p["mode"] is not None for p in opt.parameters())


def test_gtp_layout_with_padding_and_split_groups():
    if G < 2 or G % 2:
        pytest.skip("needs an even number of ranks (TP x GTP groups)")
    tp = 2
    groups = distmuon.process_groups(COMM, tp, G // tp)
    m, n, pad = 2 * 7, 12, (-7) % (G // tp)  # 7 TP-local rows padded to a multiple of GTP
    f = full_weight(m, n, 9)
    tp_local = np.split(f, tp, axis=0)[groups.tp.rank]
    padded = np.vstack([tp_local, np.zeros((pad, n), np.float32)])
    s = np.ascontiguousarray(np.split(padded, G // tp, axis=0)[groups.gtp.rank])
    opt = distmuon.Muon(COMM, tp_mode="duplicated", lr=0.05)
    opt.add_parameter(s, "w", m, n, tp_dim=0, tp_group=groups.tp, gtp_group=groups.gtp, pad=pad)
    g = full_grad(m, n, 9, 1)
    gl = np.vstack([np.split(g, tp, axis=0)[groups.tp.rank], np.zeros((pad, n), np.float32)])
    opt.step([np.ascontiguousarray(np.split(gl, G // tp, axis=0)[groups.gtp.rank])])
    ref = distmuon.Muon(None, tp_mode="duplicated", lr=0.05)
    ref.add_parameter(f, "w")
    ref.step([g])
    want = np.vstack([np.split(f, tp, axis=0)[groups.tp.rank], np.zeros((pad, n), np.float32)])
    want = np.split(want, G // tp, axis=0)[groups.gtp.rank]
    assert np.array_equal(s, want)


def test_bad_shard_shape_refused():
    opt = distmuon.Muon(COMM, tp_mode="duplicated")
    wrong = np.zeros((5, 24), np.float32)
    with pytest.raises(distmuon.Error, match="the local shard is 5x24"):
        opt.add_parameter(wrong, "w", 8 * G, 24, tp_dim=0, tp_group=COMM)
    with pytest.raises(distmuon.Error, match="unknown option 'lrr'"):
        distmuon.Muon(COMM, lrr=0.1)
    # The role is parsed by the C++ core's table: its error names the parameter and every role.
    with pytest.raises(distmuon.Error, match="Muon parameter 'b': unknown parameter role 'head'; "
                                             "valid: hidden, embedding, output_head, other"):
        opt.add_parameter(np.zeros((4, 3), np.float32), "b", role="head")


def test_bad_option_values_name_the_option():
    # A non-finite number (JSON cannot hold it) and a value of the wrong type are refused naming
    # the option, not with a JSON parser's message.
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="option 'lr' must be a finite number"):
            distmuon.Muon(COMM, lr=bad)
    with pytest.raises(ValueError, match="option 'adamw.eps' must be a finite number"):
        distmuon.Muon(COMM, adamw={"eps": float("nan")})
    with pytest.raises(distmuon.Error, match="option 'lr' must be a number, got string \"0.1\""):
        distmuon.Muon(COMM, lr="0.1")
    with pytest.raises(distmuon.Error, match="option 'steps' must be an integer"):
        distmuon.Muon(COMM, steps=2.5)
    with pytest.raises(TypeError, match="option 'lr' has type list"):
        distmuon.Muon(COMM, lr=[0.1])


def test_step_deadline_option():
    # Checked like every option; with every rank on time the gate changes nothing (the same
    # weights as without it, bit for bit).
    with pytest.raises(distmuon.Error, match="step_timeout_s = -1 is invalid"):
        distmuon.Muon(COMM, step_timeout_s=-1)
    with pytest.raises(ValueError, match="option 'step_timeout_s' must be a finite number"):
        distmuon.Muon(COMM, step_timeout_s=float("inf"))
    gated = distmuon.Muon(COMM, tp_mode="duplicated", lr=0.05, step_timeout_s=30)
    plain = distmuon.Muon(COMM, tp_mode="duplicated", lr=0.05)
    assert gated.options["step_timeout_s"] == 30
    shards = []
    for opt in (gated, plain):
        s = shard(full_weight(32, 24, 0), 0, G, R)
        opt.add_parameter(s, "w0", 32, 24, tp_dim=0, tp_group=COMM)
        shards.append(s)
    for step in range(1, 4):
        g = shard(full_grad(32, 24, 0, step), 0, G, R)
        gated.step([g])
        plain.step([g])
    assert gated.step_count == 3
    np.testing.assert_array_equal(shards[0], shards[1])  # tolerance 0: the gate moves no data
    if G > 1:
        # A step count changed on one rank only (AdamW's bias correction would differ silently):
        # the gate sees the ranks at different steps, every rank raises, nothing changes.
        before = shards[0].copy()
        if R == G - 1:
            gated._core.step_count = 7
        with pytest.raises(distmuon.CollectiveError,
                           match=rf"optimizer step 4: the ranks are at different steps "
                                 rf"\(rank:step {G - 1}:8\)"):
            gated.step([shard(full_grad(32, 24, 0, 4), 0, G, R)])
        np.testing.assert_array_equal(shards[0], before)


def test_bad_gradient_raises_on_every_rank():
    opt, _ = sharded_run("duplicated", 0)
    grads = [shard(full_grad(m, n, k, 1), dim, G, R) for k, (_, m, n, dim) in enumerate(WEIGHTS)]
    if R == 0:
        grads[1][0, 0] = np.inf
    with pytest.raises(distmuon.CollectiveError, match="non-finite"):
        opt.step(grads)


def test_adamw_overflow_on_one_rank_is_refused_on_every_rank():
    # A finite gradient of 1e20 in an embedding on the last rank: AdamW's second moment would be
    # 0.05 x 1e40, past float32's range. Every rank raises naming it; nothing is written.
    opt, shards = sharded_run("duplicated", 0)
    emb = full_weight(6, 4, 9)
    opt.add_parameter(emb, "emb", role="embedding")
    grads = [shard(full_grad(m, n, k, 1), dim, G, R) for k, (_, m, n, dim) in enumerate(WEIGHTS)]
    g_emb = full_grad(6, 4, 9, 1)
    if R == G - 1:
        g_emb[4, 1] = 1e20
    kept = [s.copy() for s in shards] + [emb.copy()]
    with pytest.raises(distmuon.CollectiveError, match=r"AdamW step of parameter 'emb' would "
                                                       r"overflow.*at \(4, 1\)"):
        opt.step(grads + [g_emb])
    assert opt.step_count == 0
    for a, b in zip(shards + [emb], kept):
        assert np.array_equal(a, b)
    assert all(np.array_equal(t, np.zeros_like(t)) for t in opt.state_tensors(len(WEIGHTS)))


def _resume(tmp, how):
    """Runs 3 steps, keeps the state (checkpoint or state_dict) and the weights, runs 2 more;
    then rebuilds from the kept state and runs the same 2 steps: bit-exact."""
    opt, shards = sharded_run("auto", 3)
    kept_weights = [s.copy() for s in shards]
    if how == "checkpoint":
        opt.save(tmp)
    else:
        state = opt.state_dict()
    for step in (4, 5):
        opt.step([shard(full_grad(m, n, k, step), dim, G, R)
                  for k, (_, m, n, dim) in enumerate(WEIGHTS)])
    opt2 = distmuon.Muon(COMM, tp_mode="auto", lr=0.05, weight_decay=0.01)
    resumed = [w.copy() for w in kept_weights]
    for s, (name, m, n, dim) in zip(resumed, WEIGHTS):
        opt2.add_parameter(s, name, m, n, tp_dim=dim, tp_group=COMM)
    if how == "checkpoint":
        opt2.load(tmp)
    else:
        opt2.load_state_dict(state)
    assert opt2.step_count == 3
    for step in (4, 5):
        opt2.step([shard(full_grad(m, n, k, step), dim, G, R)
                   for k, (_, m, n, dim) in enumerate(WEIGHTS)])
    for a, b in zip(resumed, shards):
        assert np.array_equal(a, b)


def test_checkpoint_round_trip_bit_exact(tmp_path):
    path = COMM.bcast(str(tmp_path / "ckpt") if R == 0 else None, root=0)
    _resume(path, "checkpoint")


@pytest.mark.skipif(G < 2, reason="needs 2 ranks")
def test_ranks_saving_into_different_folders_are_refused(tmp_path):
    # opt.save(f"ckpt_{rank}"): every rank raises, naming rank 0's folder and rank 1's; nothing
    # is written.
    base = COMM.bcast(str(tmp_path) if R == 0 else None, root=0)
    opt, _ = sharded_run("duplicated", 1)
    with pytest.raises(distmuon.CollectiveError, match="the ranks name different folders") as e:
        opt.save(f"{base}/ckpt_{R}")
    assert f"{base}/ckpt_0" in str(e.value) and f"{base}/ckpt_1" in str(e.value)
    COMM.Barrier()
    assert not any(os.path.exists(f"{base}/ckpt_{r}") for r in range(G))


def test_state_dict_round_trip_bit_exact():
    _resume(None, "state_dict")


def test_state_tensors_are_views():
    opt, _ = sharded_run("duplicated", 1)
    (mom,) = opt.state_tensors(0)
    sd = opt.state_dict()
    assert np.array_equal(mom, sd["params"][0]["state"][0])
    assert np.abs(mom).sum() > 0
    sd["params"][0]["state"][0][:] = 0  # a copy: the optimizer keeps its state
    assert np.abs(opt.state_tensors(0)[0]).sum() > 0


def test_mpi4py_split_as_tp_group():
    # Pairs of ranks (or the one rank) from mpi4py's own Split, each pair holding one weight.
    pair = COMM.Split(R // 2, R)
    try:
        t, r = pair.Get_size(), pair.Get_rank()
        m, n = 8 * 2, 12
        f = full_weight(m, n, 5)
        s = shard(f, 0, t, r)
        opt = distmuon.Muon(COMM, tp_mode="duplicated", lr=0.05)
        opt.add_parameter(s, "w", m, n, tp_dim=0, tp_group=pair)
        opt.step([shard(full_grad(m, n, 5, 1), 0, t, r)])
        assert opt.parameters()[0]["tp_size"] == t
        ref = distmuon.Muon(None, tp_mode="duplicated", lr=0.05)
        ref.add_parameter(f, "w")
        ref.step([full_grad(m, n, 5, 1)])
        assert np.array_equal(s, shard(f, 0, t, r))
    finally:
        pair.Free()


def test_owner_mode_equals_duplicated():
    # Owner mode over the weights sharing the world as TP group (one bucket: the same mpi4py
    # communicator object is converted once), standard NS: bit-equal to duplicated.
    opt, owner = sharded_run("owner", 3)
    _, dup = sharded_run("duplicated", 3)
    assert [p["mode"] for p in opt.parameters()] == ["owner"] * len(WEIGHTS)
    for a, b in zip(owner, dup):
        assert np.array_equal(a, b)
