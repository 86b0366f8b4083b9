"""The OpenBLAS thread count of the Python package (docs/python.md, "Threads").

The C++ library and the CLI run one BLAS thread per process unless told otherwise (ranks share
the cores under mpirun). A Python program is usually one process per machine or per GPU and sets
its threads the way PyTorch does, so the package follows, in this order:

  1. set_blas_threads(n): the count the program chose (None: back to the rules below);
  2. DISTMUON_BLAS_THREADS, then OPENBLAS_NUM_THREADS (read once, at import);
  3. torch.get_num_threads() when torch is imported (which itself follows OMP_NUM_THREADS and
     torch.set_num_threads), read again before each optimizer step / newton_schulz call;
  4. OMP_NUM_THREADS;
  5. the cores this process may run on (OpenBLAS's own default), shared by the processes that
     the launcher started on this machine (mpirun's OMPI_COMM_WORLD_LOCAL_SIZE, torchrun's
     LOCAL_WORLD_SIZE, MPICH's MPI_LOCALNRANKS), at least 1 each.

sync() applies the rule before a call into the library runs its products; it costs one
torch.get_num_threads() and a comparison when nothing changed.
"""

import os
import sys

from . import _core
from ._core import Error

_MAX = 1024


def _parse(var, strict):
    """The thread count an environment variable gives, or None when unset (or, not strict,
    unreadable: OpenBLAS and OpenMP ignore such values too)."""
    text = os.environ.get(var)
    if text is None or text.strip() == "":
        return None
    head = text.split(",")[0].strip()  # OMP_NUM_THREADS may list nested levels: the outer one
    try:
        n = int(head)
    except ValueError:
        n = 0
    if 1 <= n <= _MAX:
        return n
    if strict:
        raise Error(f"{var}='{text}' is not a thread count in [1, {_MAX}]")
    return None


_env = None  # (count, source) from the environment, read once
_chosen = None  # set_blas_threads(n)
_applied = None  # the count last given to OpenBLAS


def _from_environment():
    global _env
    if _env is None:
        found = (None, "")
        for var in ("DISTMUON_BLAS_THREADS", "OPENBLAS_NUM_THREADS"):
            n = _parse(var, strict=var == "DISTMUON_BLAS_THREADS")
            if n is not None:
                found = (n, var)
                break
        _env = found
    return _env


def wanted():
    """(thread count, where it comes from) by the rules above."""
    if _chosen is not None:
        return _chosen, "set_blas_threads"
    n, var = _from_environment()
    if n is not None:
        return n, var
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        return max(1, min(int(torch.get_num_threads()), _MAX)), "torch.get_num_threads()"
    n = _parse("OMP_NUM_THREADS", strict=False)
    if n is not None:
        return n, "OMP_NUM_THREADS"
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    local = 1
    for var in ("OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS"):
        text = os.environ.get(var, "")
        if text.isdigit() and int(text) > 0:
            local = int(text)
            break
    return max(1, min(cores // local, _MAX)), "cores"


def sync():
    """Gives OpenBLAS the count of wanted() when it differs from the one last given."""
    global _applied
    n = wanted()[0]
    if n != _applied:
        _core.set_blas_threads(n)
        _applied = n


def set_blas_threads(threads):
    """Sets the BLAS threads of this process for distmuon's products (an int >= 1), or None to
    follow the environment and torch again (docs/python.md, "Threads")."""
    global _chosen
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or \
                not 1 <= threads <= _MAX:
            raise ValueError(f"set_blas_threads: threads must be an int in [1, {_MAX}] or None, "
                             f"got {threads!r:.40}")
    _chosen = threads
    sync()


def blas_threads():
    """The BLAS threads distmuon's next product runs on (after applying the rules)."""
    sync()
    return int(_core.blas_threads())
