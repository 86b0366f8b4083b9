"""distmuon.newton_schulz: bit-equal to `distmuon orthogonalize`, zero-copy, refuses bad arrays."""
import subprocess

import numpy as np
import pytest
import torch

import distmuon
import distmuon.torch  # noqa: F401  (distmuon.torch.Muon)
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
    table = [(8.2051, -22.9019, 16.4607), (4.0664, -2.8612, 0.5184), (3.9096, -2.8234, 0.5250),
             (3.2856, -2.4153, 0.4853), (2.2779, -1.6198, 0.3985), (1.8726, -1.2307, 0.3585),
             (1.8564, -1.2132, 0.3568), (1.8750, -1.2500, 0.3750)]
    expected = cli_orthogonalize(cli, tmp_path, x, "--coefficients", "custom",
                                 "--custom-coefficients",
                                 ";".join(",".join(str(v) for v in t) for t in table),
                                 "--steps", "8")
    assert np.array_equal(distmuon.newton_schulz(x, coefficients=table, steps=8), expected)


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
    # MuonOptions::ns_options runs the optimizer's "auto" as standard; one matrix has no tp_mode
    # auto to pick per weight, so newton_schulz still refuses it.
    with pytest.raises(distmuon.Error, match="algorithm 'auto' is chosen per weight"):
        distmuon.newton_schulz(np.ones((8, 8), np.float32), algorithm="auto")
    with pytest.raises(distmuon.Error, match="unknown Newton-Schulz algorithm 'gramm'; valid: "
                                             "standard, gram, auto"):
        distmuon.newton_schulz(np.ones((8, 8), np.float32), algorithm="gramm")


@pytest.mark.parametrize("coefficients,steps,needle", [
    ("aol", 5, "'aol' supports 4, 8, 12, 16, 20 steps"),  # a 4-step design, cycled
    ("quintic", 6, "supports 4-5, 9-10, 14-15, 19-20"),    # shrank it ~10x
    ([(100.0, 100.0, 100.0)], 5, "'custom' at 5 steps"),  # returned an all-NaN array
])
def test_schedules_that_do_not_orthogonalise_are_refused_before_any_write(coefficients, steps,
                                                                          needle):
    x = np.random.default_rng(5).standard_normal((24, 40)).astype(np.float32)
    before = x.copy()
    out = np.full_like(x, 7.0)
    with pytest.raises(distmuon.Error, match=needle):
        distmuon.newton_schulz(x, coefficients=coefficients, steps=steps, out=out)
    assert np.all(out == 7.0)  # the caller's output untouched
    with pytest.raises(distmuon.Error, match="does not orthogonalise"):
        distmuon.newton_schulz(x, coefficients=coefficients, steps=steps, inplace=True)
    assert np.array_equal(x, before)


def test_muon_refuses_a_divergent_schedule_before_any_step():
    with pytest.raises(distmuon.Error, match="'custom' at 5 steps does not orthogonalise"):
        distmuon.Muon(coefficients="custom", custom_coefficients="100,100,100")
    with pytest.raises(distmuon.Error, match="'aol' supports 4, 8, 12, 16, 20 steps"):
        distmuon.Muon(coefficients="aol", steps=5)


def test_muon_refuses_a_non_finite_weight_and_keeps_the_others():
    opt = distmuon.Muon(tp_mode="duplicated")
    w = np.random.default_rng(2).standard_normal((16, 8)).astype(np.float32)
    opt.add_parameter(w, "hidden.w")
    g = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)
    opt.step([g])
    w[1, 2] = np.nan
    before = w.copy()
    with pytest.raises(distmuon.Error, match="weight 'hidden.w' has a non-finite value"):
        opt.step([g])
    assert np.array_equal(w, before, equal_nan=True)  # nothing written


def test_precision_option():
    """precision= reaches every product: tf32 and bf16 differ from fp32 by their rounding (the
    CPU emulates them), within the bounds of tests/ns/test_ns_precision.cpp (standard NS against
    fp32: tf32 1e-2, bf16 8e-2, since fp32 is within 1e-5 of float64); None and "auto" are the
    backend's default (fp32 on the CPU); other values are refused with the valid ones."""
    x = np.random.default_rng(3).standard_normal((24, 40)).astype(np.float32)
    fp32 = distmuon.newton_schulz(x)
    assert np.array_equal(distmuon.newton_schulz(x, precision="fp32"), fp32)
    assert np.array_equal(distmuon.newton_schulz(x, precision="auto"), fp32)
    for name, bound in (("tf32", 1e-2), ("bf16", 8e-2)):
        got = distmuon.newton_schulz(x, precision=name)
        err = np.linalg.norm(got - fp32) / np.linalg.norm(fp32)
        assert 1e-5 < err < bound, (name, err)
    for bad in ("fp16", 16, "BF16"):
        with pytest.raises(ValueError, match="precision must be one of fp32, tf32, bf16"):
            distmuon.newton_schulz(x, precision=bad)
        with pytest.raises(ValueError, match="precision must be one of"):
            distmuon.Muon(precision=bad)
        with pytest.raises(ValueError, match="precision must be one of"):
            distmuon.torch.Muon([torch.nn.Parameter(torch.zeros(4, 4))], precision=bad)
    assert distmuon.Muon(precision="bf16").options["precision"] == "bf16"
    assert distmuon.PRECISIONS == ("fp32", "tf32", "bf16")  # the C++ core's table
    assert distmuon.Muon().options["precision"] == "auto"


def test_aol_with_its_input_scaling_orthogonalises_at_4_steps():
    # aol rescales its input by AOL (docs/optimizer.md): every singular value of a Gaussian, a
    # rank-1 and an orthogonal input lands in its band [0.9, 1.15] (0.01 for fp32 rounding).
    rng = np.random.default_rng(35)
    q, _ = np.linalg.qr(rng.standard_normal((40, 16)))
    rank1 = np.outer(rng.standard_normal(24), rng.standard_normal(8))
    inputs = [rng.standard_normal((16, 40)), rank1, q]
    for x in inputs:
        y = distmuon.newton_schulz(x.astype(np.float32), coefficients="aol", steps=4)
        s = np.linalg.svd(y.astype(np.float64), compute_uv=False)
        rank = np.linalg.matrix_rank(x)
        assert np.all(s[:rank] >= 0.89) and np.all(s[:rank] <= 1.16), s
        assert np.all(s[rank:] < 0.01), s


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_cans_is_refused_where_rounding_makes_it_diverge(precision):
    x = np.random.default_rng(5).standard_normal((8, 8)).astype(np.float32)
    out = np.full_like(x, 7.0)
    with pytest.raises(distmuon.Error, match=f"'cans' supports no step count at {precision}"):
        distmuon.newton_schulz(x, coefficients="cans", steps=8, precision=precision, out=out)
    assert np.all(out == 7.0)
    with pytest.raises(distmuon.Error, match=f"at {precision} its rounding"):
        distmuon.Muon(coefficients="cans", steps=8, precision=precision)
