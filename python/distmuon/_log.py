"""The library's log lines through Python's `logging` (docs/python.md, "Logging").

The C++ library logs with spdlog; in Python its lines (tp_mode=auto's choices, warnings) are kept
by the extension (python/src/log.cpp) and emitted here, after each call into it, on the logger
"distmuon", as torch's libraries log: nothing is shown below WARNING unless the program asks
(`logging.getLogger("distmuon").setLevel(logging.INFO)` with a handler, or
`logging.basicConfig(level=logging.INFO)`). INFO and DEBUG lines are emitted on rank 0 only;
warnings and errors on every rank.
"""

import logging
import os
import sys

from . import _core

logger = logging.getLogger("distmuon")

# spdlog's levels (trace, debug, info, warn, err, critical) as logging's.
_LEVELS = (logging.DEBUG, logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR,
           logging.CRITICAL)


def _process_rank():
    """This process's rank: torch.distributed's when initialised, else the launcher's."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.distributed.is_available() and \
                torch.distributed.is_initialized():
            return torch.distributed.get_rank()
    except (AttributeError, RuntimeError):
        pass
    for var in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        text = os.environ.get(var, "")
        if text.isdigit():
            return int(text)
    return 0


def drain(rank=None):
    """Emits the library's lines logged since the last drain. rank: the caller's rank in its
    world (None: this process's rank)."""
    lines = _core.take_log_lines()
    if not lines:
        return
    root = (_process_rank() if rank is None else rank) == 0
    for level, text in lines:
        py_level = _LEVELS[min(max(level, 0), len(_LEVELS) - 1)]
        if py_level >= logging.WARNING or root:
            logger.log(py_level, "%s", text)
