"""Checkpoints between C++ and Python: tests/python/checkpoint_peer.cpp writes or resumes the
same 5-step run that this file mirrors; the resumed weights are bit-equal either way."""
import subprocess

import numpy as np

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
