"""The device path of the Python module without a GPU: device="opaque" runs the code CUDA tensors
run (python/src/device.h), on CPU tensors uploaded to the opaque backend, whose memory the host
cannot address, and downloaded after. Its results are bit-equal to device="cpu" (the opaque
backend runs the CPU backend's arithmetic on its own storage). Run under mpirun -np 1 and -np 2:
the optimizers' world is MPI.COMM_WORLD (sharded weights over it)."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

import distmuon
import distmuon.torch as dmt

COMM = MPI.COMM_WORLD
G = COMM.Get_size()
R = COMM.Get_rank()


def rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def stats():
    return distmuon._core.backend("opaque").memory_stats()


def delta(before, after):
    return {k: after[k] - before[k] for k in before}


# --- newton_schulz ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape,algorithm", [((24, 40), "standard"), ((48, 16), "gram"),
                                             ((3, 12, 20), "standard")])
def test_newton_schulz_opaque_equals_cpu(shape, algorithm):
    x = rand(shape, 1)
    before = stats()
    got = distmuon.newton_schulz(x, algorithm=algorithm, device="opaque")
    d = delta(before, stats())
    want = distmuon.newton_schulz(x, algorithm=algorithm, device="cpu")
    assert np.array_equal(got, want)
    matrices = shape[0] if len(shape) == 3 else 1
    # One upload (the input into the output's copy) and one download per matrix, nothing
    # else: the work ran on the backend's memory. Every allocation was released but the
    # backend's kept scratch (its normalisation slot, made on first use: one double).
    assert d["uploads"] == matrices and d["downloads"] == matrices
    assert d["upload_bytes"] == x.nbytes and d["download_bytes"] == x.nbytes
    assert d["allocations"] > 0 and d["allocations"] - d["releases"] in (0, 1)
    assert d["live_bytes"] <= 8


def test_newton_schulz_opaque_in_place_and_out():
    x = rand((16, 24), 2)
    want = distmuon.newton_schulz(x)
    t = torch.from_numpy(x.copy())
    r = distmuon.newton_schulz(t, inplace=True, device="opaque")
    assert r is t and np.array_equal(t.numpy(), want)
    out = torch.empty(16, 24)
    before = stats()
    assert distmuon.newton_schulz(torch.from_numpy(x), out=out, device="opaque") is out
    assert np.array_equal(out.numpy(), want)
    assert delta(before, stats())["uploads"] == 1


def test_newton_schulz_bf16_through_a_float32_copy():
    x = torch.from_numpy(rand((20, 32), 3)).to(torch.bfloat16)
    got = distmuon.newton_schulz(x, device="opaque")
    want = distmuon.newton_schulz(x, device="cpu")
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    # The same as NS of the float32 value of x, rounded to bfloat16 once at the end.
    ref = distmuon.newton_schulz(x.float()).to(torch.bfloat16)
    assert torch.equal(got, ref)
    y = x.clone()
    distmuon.newton_schulz(y, inplace=True, device="opaque")
    assert torch.equal(y, want)


def test_device_errors():
    x = torch.from_numpy(rand((8, 8), 4))
    with pytest.raises(distmuon.Error, match="unknown device 'tpu'"):
        distmuon.newton_schulz(x, device="tpu")
    with pytest.raises(distmuon.Error, match="mixed devices \\(cpu, meta"):
        distmuon.newton_schulz(x, out=torch.empty(8, 8, device="meta"))
    with pytest.raises(distmuon.Error, match="a tensor on meta"):
        distmuon.newton_schulz(torch.empty(8, 8, device="meta"))
    cuda = "cuda" in distmuon._core.backend_names()
    with pytest.raises(distmuon.Error,
                       match="with CPU tensors" if torch.cuda.is_available() else
                       "PyTorch sees no CUDA device" if cuda else "no CUDA backend"):
        distmuon.newton_schulz(x, device="cuda")
    with pytest.raises(distmuon.Error, match="expected a float32 array, got dtype float64"):
        distmuon.newton_schulz(x.double().numpy(), device="opaque")
    # The backend refuses a host array for a CUDA backend and a non-array whatever the backend.
    with pytest.raises(distmuon.Error, match="expected a NumPy array or a CUDA tensor"):
        distmuon._core.newton_schulz([[1.0]], x.numpy(), distmuon._core.backend("opaque"),
                                     "quintic", [], 5, "standard", True, 0, "auto")


# --- distmuon.Muon, sharded over the world ----------------------------------------------------

WEIGHTS = [("w0", 8 * 2, 12, 0), ("w1", 10, 8 * 2, 1)]


def muon_run(device, mode, steps=3):
    opt = distmuon.Muon(COMM, device=device, tp_mode=mode, lr=0.05, weight_decay=0.01)
    shards = []
    for k, (name, m, n, dim) in enumerate(WEIGHTS):
        s = np.ascontiguousarray(np.split(rand((m, n), k) * 0.1, G, axis=dim)[R])
        opt.add_parameter(s, name, m, n, tp_dim=dim, tp_group=COMM)
        shards.append(s)
    bias = rand((7,), 9)
    opt.add_parameter(bias, "bias", role="other")
    shards.append(bias)
    for step in range(steps):
        grads = [np.ascontiguousarray(np.split(rand((m, n), 100 + 10 * step + k), G, axis=dim)[R])
                 for k, (_, m, n, dim) in enumerate(WEIGHTS)]
        opt.step(grads + [rand((7,), 200 + step)])
    return opt, shards


@pytest.mark.parametrize("mode", ["duplicated", "distributed"])
def test_muon_opaque_equals_cpu(mode):
    before = stats()
    opt, got = muon_run("opaque", mode)
    d = delta(before, stats())
    _, want = muon_run("cpu", mode)
    for g, w in zip(got, want):
        assert np.array_equal(g, w)
    # Per step: every parameter and every gradient up, every parameter down; at registration
    # every parameter up once.
    n = len(got)
    assert d["uploads"] == n + 3 * 2 * n and d["downloads"] == 3 * n
    assert d["upload_bytes"] == sum(s.nbytes for s in got) * (1 + 3 * 2)
    # The state lives in the backend's memory: state_tensors are downloaded copies, and
    # load_state_dict writes them back through the backend.
    state = opt.state_dict()
    assert np.abs(state["params"][0]["state"][0]).sum() > 0
    for p in state["params"]:
        p["state"] = [np.zeros_like(s) for s in p["state"]]
    opt.load_state_dict(state)
    assert all(np.abs(t).sum() == 0 for t in opt.state_tensors(0))


def test_muon_opaque_allocates_only_on_the_first_step():
    opt, shards = muon_run("opaque", "distributed", steps=1)
    before = stats()
    opt.step([np.ones_like(s) for s in shards])
    d = delta(before, stats())
    assert d["allocations"] == 0 and d["uploads"] == 2 * len(shards)


def test_muon_refuses_a_tensor_of_another_device():
    opt = distmuon.Muon(None, device="opaque")
    with pytest.raises(distmuon.Error, match="a tensor on meta for an optimizer on device 'opaque'"):
        opt.add_parameter(torch.empty(4, 4, device="meta"), "w")
    # The core takes a CUDA tensor's description as a shard (the CUDA path's type) and refuses it
    # for a backend that is not CUDA with the backend's own error, not a binding TypeError.
    tensor = distmuon._core.DeviceTensor(0, 4, 4, 4, 0)
    with pytest.raises(distmuon.Error, match="a tensor on cuda:0 for the opaque backend"):
        opt._core.add_parameter(tensor, "w", 4, 4, "hidden", True, None, None, None, 0, False, 0,
                                [], 0)


# --- distmuon.torch.Muon ----------------------------------------------------------------------

def torch_run(device, dtype, steps=3):
    """A bias-free MLP with a bias-carrying head (1-D: AdamW), float32 or bfloat16 parameters,
    the first weight sharded by rows over the world (a Layout), the rest whole on every rank."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 8 * G, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(8 * G, 6)).to(dtype)
    full = model[0].weight.detach().clone()
    with torch.no_grad():
        model[0].weight = torch.nn.Parameter(full.chunk(G, 0)[R].clone())
    model[0].weight.distmuon_layout = dmt.Layout(rows=8 * G, cols=12, tp_dim=0, tp_group="world")
    opt = dmt.Muon(model.parameters(), lr=0.02, weight_decay=0.01, process_group=COMM,
                   device=device)
    for step in range(steps):
        g = torch.Generator().manual_seed(50 + step)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g).to(dtype)
        opt.step()
    return [p.detach().clone() for p in model.parameters()], opt


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_muon_opaque_equals_cpu(dtype):
    before = stats()
    got, opt = torch_run("opaque", dtype)
    d = delta(before, stats())
    want, _ = torch_run("cpu", dtype)
    for g, w in zip(got, want):
        assert g.dtype == dtype and torch.equal(g, w)
    assert d["uploads"] > 0 and d["downloads"] > 0
    st = opt.state_dict()["state"]
    assert st[0]["momentum_buffer"].abs().sum() > 0 and "exp_avg" in st[2]
    # A round trip through the backend's memory changes nothing.
    opt.load_state_dict(opt.state_dict())
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], st[0]["momentum_buffer"])


def test_torch_muon_device_refusals_are_agreed():
    p = torch.nn.Parameter(torch.randn(8, 8))
    with pytest.raises(distmuon.CollectiveError, match="device 'cuda' with CPU parameters"):
        dmt.Muon([p], process_group=COMM, device="cuda")
    with pytest.raises(distmuon.CollectiveError, match="unknown device 'tpu'"):
        dmt.Muon([p], process_group=COMM, device="tpu")
