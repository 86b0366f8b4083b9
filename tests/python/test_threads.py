"""The Python package's BLAS threads (docs/python.md, "Threads").

Threads: each case runs in a fresh interpreter with the environment it names (ctest sets
OPENBLAS_NUM_THREADS and DISTMUON_BLAS_THREADS to 1 for every test): importing distmuon forces
no count; the count follows DISTMUON_BLAS_THREADS, then OPENBLAS_NUM_THREADS, then
torch.get_num_threads() (read again at each call), then OMP_NUM_THREADS; set_blas_threads wins
until set back to None. A step at 1 and at 2 threads gives the same weights (OpenBLAS splits the
products by output blocks: each element is summed in the same order; 1e-6 relative allows for a
kernel that would not).
"""
import json
import os
import subprocess
import sys

import pytest
import torch

import distmuon

_VARS = ("DISTMUON_BLAS_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
         "OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS")

_PROBE = r"""
import json, sys
import distmuon
out = {"import": distmuon._threads._applied}
if "torch" in sys.argv:
    import torch
    torch.set_num_threads(2); out["torch2"] = distmuon.blas_threads()
    torch.set_num_threads(1); out["torch1"] = distmuon.blas_threads()
    distmuon.set_blas_threads(2); torch.set_num_threads(1); out["set2"] = distmuon.blas_threads()
    distmuon.set_blas_threads(None); out["unset"] = distmuon.blas_threads()
    w = torch.randn(192, 160, generator=torch.Generator().manual_seed(1))
    for n in (1, 2):
        distmuon.set_blas_threads(n)
        x = distmuon.newton_schulz(w.clone())
        out[f"ns{n}"] = x.flatten().tolist()
else:
    out["plain"] = distmuon.blas_threads()
print(json.dumps(out))
"""


def _probe(env, *args):
    full = {k: v for k, v in os.environ.items() if k not in _VARS}
    full.update(env)
    r = subprocess.run([sys.executable, "-c", _PROBE, *args], env=full, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_threads_follow_torch_and_the_setter():
    out = _probe({}, "torch")
    assert out["import"] is None  # importing set nothing
    assert (out["torch2"], out["torch1"], out["set2"], out["unset"]) == (2, 1, 2, 1)
    a, b = torch.tensor(out["ns1"]), torch.tensor(out["ns2"])
    assert torch.allclose(a, b, rtol=0, atol=1e-6 * float(a.abs().max()))


@pytest.mark.parametrize("env,want", [
    ({"OMP_NUM_THREADS": "2"}, 2),                                   # no torch imported
    ({"OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "1"}, 2),
    ({"DISTMUON_BLAS_THREADS": "1", "OPENBLAS_NUM_THREADS": "2"}, 1),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "100000"}, 1),                   # the cores shared: 1 each
])
def test_threads_follow_the_environment(env, want):
    assert _probe(env)["plain"] == want


def test_bad_thread_counts_refused():
    with pytest.raises(ValueError, match=r"int in \[1, 1024\]"):
        distmuon.set_blas_threads(0)
    full = dict(os.environ, DISTMUON_BLAS_THREADS="many")
    r = subprocess.run([sys.executable, "-c", "import distmuon; distmuon.blas_threads()"],
                       env=full, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "DISTMUON_BLAS_THREADS='many' is not a thread count" in r.stderr
