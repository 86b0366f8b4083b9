"""distmuon.newton_schulz: bit-equal to `distmuon orthogonalize`, zero-copy, refuses bad arrays."""
import subprocess

import numpy as np
import pytest
import torch

import distmuon
from distmuon import _core


def cli_orthogonalize(cli, tmp_path, x, *args):
    src, dst = tmp_path / "in.npy", tmp_path / "out.npy"
    np.save(src, x)
    subprocess.run([cli, "orthogonalize", str(src), str(dst), *args], check=True)
    return np.load(dst)


@pytest.mark.parametrize("shape", [(64, 96), (96, 48)])
@pytest.mark.parametrize("args", [
    dict(),
    dict(algorithm="gram"),
    dict(coefficients="polar_express", steps=8),
    dict(syrk=False),
])
def test_bit_equal_to_cli(cli, tmp_path, shape, args):
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    flags = []
    if "algorithm" in args:
        flags += ["--ns-algorithm", args["algorithm"]]
    if "coefficients" in args:
        flags += ["--coefficients", args["coefficients"], "--steps", str(args["steps"])]
    if args.get("syrk") is False:
        flags += ["--no-syrk"]
    expected = cli_orthogonalize(cli, tmp_path, x, *flags)
    got = distmuon.newton_schulz(x, **args)
    assert got.dtype == np.float32 and got.shape == shape
    assert np.array_equal(got, expected)  # bit for bit: the same C++ code on the same input
    got_t = distmuon.newton_schulz(torch.from_numpy(x.copy()), **args)
    assert isinstance(got_t, torch.Tensor)
    assert np.array_equal(got_t.numpy(), expected)


def test_custom_coefficients_match_cli(cli, tmp_path):
    x = np.random.default_rng(3).standard_normal((32, 40)).astype(np.float32)
    table = [(3.4445, -4.7750, 2.0315), (3.0, -3.2, 1.2)]
    expected = cli_orthogonalize(cli, tmp_path, x, "--coefficients", "custom",
                                 "--custom-coefficients", "3.4445,-4.7750,2.0315;3.0,-3.2,1.2")
    assert np.array_equal(distmuon.newton_schulz(x, coefficients=table), expected)


def test_zero_copy_numpy():
    x = np.random.default_rng(1).standard_normal((48, 64)).astype(np.float32)
    before = x.copy()
    # The core reads the array's own memory.
    assert _core._view_address(x) == x.ctypes.data
    out = distmuon.newton_schulz(x)
    assert np.array_equal(x, before)  # input untouched
    same = distmuon.newton_schulz(x, inplace=True)
    assert same is x and np.array_equal(x, out)
    buf = np.empty_like(x)
    res = distmuon.newton_schulz(before, out=buf)
    assert res is buf and np.array_equal(buf, out)
    # A row-strided view (unit column stride) is read in place too.
    big = np.zeros((48, 80), dtype=np.float32)
    big[:, :64] = before
    view = big[:, :64]
    assert _core._view_address(view) == view.ctypes.data
    assert np.array_equal(distmuon.newton_schulz(view), out)


def test_zero_copy_torch():
    t = torch.randn(40, 24, generator=torch.Generator().manual_seed(2))
    assert _core._view_address(t.numpy()) == t.data_ptr()
    expected = distmuon.newton_schulz(t.numpy().copy())
    r = distmuon.newton_schulz(t, inplace=True)
    assert r is t and r.data_ptr() == t.data_ptr()
    assert np.array_equal(t.numpy(), expected)
    p = torch.nn.Parameter(torch.randn(8, 8))
    assert _core._view_address(distmuon._arrays.as_array(p, "p")) == p.data_ptr()


def test_bad_arrays_refused():
    x = np.ones((8, 8), dtype=np.float64)
    with pytest.raises(distmuon.Error, match="expected a float32 array, got dtype float64"):
        distmuon.newton_schulz(x)
    y = np.random.default_rng(0).standard_normal((8, 12)).astype(np.float32)
    with pytest.raises(distmuon.Error, match="not row-major with unit column stride"):
        distmuon.newton_schulz(y.T)
    ok = distmuon.newton_schulz(y.T, allow_copy=True)  # converted once on request
    assert np.array_equal(ok, distmuon.newton_schulz(np.ascontiguousarray(y.T)))
    assert np.array_equal(distmuon.newton_schulz(x, allow_copy=True),
                          distmuon.newton_schulz(x.astype(np.float32)))
    with pytest.raises(distmuon.Error, match="expected a 2-D array or a 3-D batch"):
        distmuon.newton_schulz(np.ones((2, 3, 4, 5), dtype=np.float32))
    ro = y.copy()
    ro.flags.writeable = False
    with pytest.raises(distmuon.Error, match="read-only"):
        distmuon.newton_schulz(ro, inplace=True)
    with pytest.raises(distmuon.Error, match="output 8x8 for an input 8x12"):
        distmuon.newton_schulz(y, out=np.empty((8, 8), dtype=np.float32))


def test_cpp_errors_keep_their_message():
    y = np.ones((8, 8), dtype=np.float32)
    with pytest.raises(distmuon.Error) as e:
        distmuon.newton_schulz(y, coefficients="nope")
    assert "nope" in str(e.value) and "quintic" in str(e.value)  # the C++ list of valid names
    y[2, 3] = np.nan
    with pytest.raises(distmuon.Error, match="non-finite"):
        distmuon.newton_schulz(y)
    assert isinstance(e.value, RuntimeError)
