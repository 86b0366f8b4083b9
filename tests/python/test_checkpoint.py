"""Checkpoints between C++ and Python: tests/python/checkpoint_peer.cpp writes or resumes the
same 5-step run that this file mirrors; the resumed weights are bit-equal either way."""
import json
import subprocess

import numpy as np
import pytest

import distmuon

WEIGHTS = [("a", 24, 16, "hidden"), ("b", 16, 1, "other")]


def initial(m, n):
    i, j = np.meshgrid(np.arange(m), np.arange(n), indexing="ij")
    return (((i * 7 + j * 13) % 17 - 8) / 8.0).astype(np.float32)


def gradient(m, n, step):
    i, j = np.meshgrid(np.arange(m), np.arange(n), indexing="ij")
    return (((i * 5 + j * 3 + step * 11) % 19 - 9) / 16.0).astype(np.float32)


def optimizer(weights):
    opt = distmuon.Muon(None, lr=0.02, weight_decay=0.01, tp_mode="duplicated",
                        adamw={"lr": 0.01})
    for w, (name, m, n, role) in zip(weights, WEIGHTS):
        opt.add_parameter(w, name, m, n, role=role)
    return opt


def run(opt, first, last):
    for s in range(first, last + 1):
        opt.step([gradient(m, n, s) for _, m, n, _ in WEIGHTS])


def python_write(ckpt):
    weights = [initial(m, n) for _, m, n, _ in WEIGHTS]
    opt = optimizer(weights)
    run(opt, 1, 3)
    opt.save(ckpt)
    for w, (name, *_) in zip(weights, WEIGHTS):
        np.save(ckpt / f"weight-{name}.npy", w)
    run(opt, 4, 5)
    return weights


def python_resume(ckpt):
    weights = [np.load(ckpt / f"weight-{name}.npy") for name, *_ in WEIGHTS]
    opt = optimizer(weights)
    opt.load(ckpt)
    assert opt.step_count == 3
    run(opt, 4, 5)
    return weights


def final_of(out):
    return [np.load(out / f"weight-{name}.npy") for name, *_ in WEIGHTS]


def test_cpp_checkpoint_resumes_in_python(checkpoint_peer, tmp_path):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    subprocess.run([checkpoint_peer, "write", str(ckpt), str(out)], check=True)
    uninterrupted = final_of(out)
    resumed = python_resume(ckpt)
    for a, b in zip(resumed, uninterrupted):
        assert np.array_equal(a, b)
    # The Python run without a break equals the C++ one too (same library).
    for a, b in zip(python_write(tmp_path / "py"), uninterrupted):
        assert np.array_equal(a, b)


def test_python_checkpoint_resumes_in_cpp(checkpoint_peer, tmp_path):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    uninterrupted = python_write(ckpt)
    subprocess.run([checkpoint_peer, "resume", str(ckpt), str(out)], check=True)
    for a, b in zip(final_of(out), uninterrupted):
        assert np.array_equal(a, b)


def test_python_checkpoint_round_trip(tmp_path):
    ckpt = tmp_path / "ckpt"
    uninterrupted = python_write(ckpt)
    for a, b in zip(python_resume(ckpt), uninterrupted):
        assert np.array_equal(a, b)


def test_bad_checkpoint_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    python_write(ckpt)
    opt = distmuon.Muon(None, tp_mode="duplicated")
    opt.add_parameter(np.zeros((24, 16), np.float32), "a")  # one parameter, not two
    try:
        opt.load(ckpt)
    except distmuon.Error as e:
        assert "the checkpoint has 2 parameters, the optimizer 1" in str(e)
    else:
        raise AssertionError("load accepted a checkpoint of other parameters")


def _stepped():
    weights = [initial(m, n) for _, m, n, _ in WEIGHTS]
    opt = optimizer(weights)
    run(opt, 1, 2)
    return opt, weights


def _same_state(a, b):
    assert a["step"] == b["step"]
    for pa, pb in zip(a["params"], b["params"]):
        for ta, tb in zip(pa["state"], pb["state"]):
            assert np.array_equal(ta, tb)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_load_state_dict_refuses_non_finite_values_and_changes_nothing(bad):
    opt, _ = _stepped()
    before = opt.state_dict()
    state = opt.state_dict()
    state["params"][0]["state"][0][:] = 0.5  # would be written first
    state["params"][1]["state"][1][3, 0] = bad  # AdamW's exp_avg_sq of 'b'
    state["step"] = 7
    with pytest.raises(distmuon.Error, match=r"state tensor 1 of 'b' has a non-finite value "
                                             r"\((-?inf|nan)\) at \(3, 0\)"):
        opt.load_state_dict(state)
    _same_state(opt.state_dict(), before)


@pytest.mark.parametrize("step", [float("inf"), float("nan"), -1, 2.5, "3"])
def test_load_state_dict_refuses_a_bad_step_count(step):
    opt, _ = _stepped()
    before = opt.state_dict()
    state = opt.state_dict()
    state["params"][0]["state"][0][:] = 0.5
    state["step"] = step
    with pytest.raises(distmuon.Error, match="the step count must be an integer >= 0"):
        opt.load_state_dict(state)
    _same_state(opt.state_dict(), before)


def test_adamw_gradient_past_float32_range_is_refused():
    # 0.05 x (1e20)^2 = 5e38: AdamW's second moment would be infinite. Refused naming the
    # parameter; weights and state unchanged, and the next good step runs.
    opt, weights = _stepped()
    kept = [w.copy() for w in weights]
    before = opt.state_dict()
    grads = [gradient(m, n, 3) for _, m, n, _ in WEIGHTS]
    grads[1][2, 0] = 1e20
    with pytest.raises(distmuon.CollectiveError,
                       match=r"AdamW step of parameter 'b' would overflow: its gradient 1e\+20 "
                             r"at \(2, 0\)"):
        opt.step(grads)
    _same_state(opt.state_dict(), before)
    for w, k in zip(weights, kept):
        assert np.array_equal(w, k)
    run(opt, 3, 3)
    assert opt.step_count == 3
    assert all(np.isfinite(t).all() for p in opt.state_dict()["params"] for t in p["state"])


def _fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
    return f"{h:016x}"


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_load_refuses_a_checkpoint_holding_a_non_finite_value(tmp_path, bad):
    # A rank file holding an infinity or a NaN with a checksum that matches (written by another
    # program): Muon.load raises naming the state and changes nothing.
    opt, _ = _stepped()
    opt.save(tmp_path / "ckpt")
    rank_file = tmp_path / "ckpt" / "rank-00000.bin"
    data = bytearray(rank_file.read_bytes())
    data[0:4] = np.float32(bad).tobytes()  # the first momentum element
    rank_file.write_bytes(bytes(data))
    manifest_path = tmp_path / "ckpt" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["ranks"][0]["fnv1a64"] = _fnv1a64(data)
    manifest_path.write_text(json.dumps(manifest))
    fresh, _ = _stepped()
    run(fresh, 3, 3)
    before = fresh.state_dict()
    with pytest.raises(distmuon.Error, match="momentum of parameter 'a' has a non-finite value"):
        fresh.load(tmp_path / "ckpt")
    _same_state(fresh.state_dict(), before)
