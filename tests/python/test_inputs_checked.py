"""Nothing non-finite stored, every cost checked before it is paid (docs/reliability.md): a
refused Newton-Schulz call leaves the caller's out (or x, in place) as it was, whole batches
included; settings past float32's range and step counts past the bound are refused at once."""
import time

import numpy as np
import pytest
import torch

import distmuon


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
