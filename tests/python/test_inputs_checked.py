"""Nothing non-finite stored, every cost checked before it is paid (docs/reliability.md): a
refused Newton-Schulz call leaves the caller's out (or x, in place) as it was, whole batches
included; settings past float32's range and step counts past the bound are refused at once."""
import time

import numpy as np
import pytest
import torch

import distmuon
import distmuon.torch


def _batch_with_a_bad_last_matrix(kind):
    x = np.random.default_rng(4).standard_normal((3, 12, 20)).astype(np.float32)
    x[2, 1, 2] = np.nan  # the last matrix only: the first two would succeed
    return torch.from_numpy(x) if kind == "torch" else x


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_refused_newton_schulz_writes_nothing(kind):
    # One matrix with out=: the caller's out untouched.
    x = np.random.default_rng(1).standard_normal((12, 20)).astype(np.float32)
    x[3, 4] = np.inf
    out = np.full_like(x, 7.0)
    if kind == "torch":
        x, out = torch.from_numpy(x), torch.from_numpy(out)
    with pytest.raises(distmuon.Error):
        distmuon.newton_schulz(x, out=out)
    assert (np.asarray(out) == 7.0).all()
    # A batch, in place and with out=: no matrix of it is written, the earlier ones neither.
    x = _batch_with_a_bad_last_matrix(kind)
    before = (x.numpy() if kind == "torch" else x).copy()
    with pytest.raises(distmuon.Error):
        distmuon.newton_schulz(x, inplace=True)
    assert np.array_equal(np.asarray(x), before, equal_nan=True)
    out = np.full(before.shape, 7.0, dtype=np.float32)
    if kind == "torch":
        out = torch.from_numpy(out)
    with pytest.raises(distmuon.Error):
        distmuon.newton_schulz(x, out=out)
    assert (np.asarray(out) == 7.0).all()


@pytest.mark.parametrize("options", [
    dict(lr=1e39), dict(lr=3.5e38), dict(weight_decay=1e39),
    dict(lr=1e20, weight_decay=1e20),  # its decay factor 1 - lr x wd is -1e40
    dict(extra_scale_factor=1e39), dict(adamw=dict(lr=1e39)),
])
def test_settings_past_float32_range_are_refused(options):
    with pytest.raises(distmuon.Error, match="float32"):
        distmuon.Muon(tp_mode="duplicated", **options)


def test_learning_rates_past_float32_range_change_nothing():
    opt = distmuon.Muon(tp_mode="duplicated")
    w = np.random.default_rng(2).standard_normal((16, 8)).astype(np.float32)
    opt.add_parameter(w, "hidden.w")
    with pytest.raises(distmuon.Error, match="float32"):
        opt.set_learning_rates(1e39, 1e-3)
    g = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)
    opt.step([g])
    assert np.isfinite(w).all()


@pytest.mark.parametrize("options", [dict(lr=3e38), dict(adamw=dict(lr=3e38))])
def test_finite_settings_whose_step_leaves_float32_range_change_nothing(options):
    """Settings within float32's range whose step would not be (a learning rate of 3e38): the
    step is refused naming the parameter, nothing written, every value finite, also when the
    weights are the ones that grow (set_learning_rates, torch's API)."""
    opt = distmuon.Muon(tp_mode="duplicated", **options)
    w = np.random.default_rng(2).standard_normal((16, 8)).astype(np.float32)
    b = np.random.default_rng(5).standard_normal((6, 1)).astype(np.float32)
    opt.add_parameter(w, "hidden.w")
    opt.add_parameter(b, "bias", role="other")
    w0, b0 = w.copy(), b.copy()
    g = [np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32),
         np.random.default_rng(4).standard_normal((6, 1)).astype(np.float32)]
    name = "hidden.w" if "lr" in options else "bias"
    with pytest.raises(distmuon.Error, match=f"'{name}' could take its weights past float32"):
        opt.step(g)
    assert np.array_equal(w, w0) and np.array_equal(b, b0) and opt.step_count == 0
    opt.set_learning_rates(0.02, 1e-3)
    opt.step(g)
    assert np.isfinite(w).all() and np.isfinite(b).all() and opt.step_count == 1
    t = torch.nn.Parameter(torch.randn(16, 8))
    topt = distmuon.torch.Muon([t], lr=3e38)
    t0 = t.detach().clone()
    t.grad = torch.randn(16, 8)
    with pytest.raises(distmuon.Error, match="float32"):
        topt.step()
    assert torch.equal(t.detach(), t0)


@pytest.mark.parametrize("call", [
    lambda: distmuon.Muon(tp_mode="duplicated", steps=10**7),
    lambda: distmuon.newton_schulz(np.eye(8, dtype=np.float32), steps=10**7),
    lambda: distmuon.plan([(1024, 1024)], steps=100000),
])
def test_step_counts_past_the_bound_are_refused_at_once(call):
    start = time.monotonic()
    with pytest.raises(distmuon.Error, match="1 and 100|\\[1, 100\\]"):
        call()
    assert time.monotonic() - start < 2.0
