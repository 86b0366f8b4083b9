"""Shared fixtures: the build tree's binaries (set by ctest, tests/python/CMakeLists.txt)."""
import os

import pytest


def _binary(var):
    path = os.environ.get(var)
    if not path or not os.path.exists(path):
        pytest.fail(f"{var} is not set to an existing binary (run these tests through ctest)")
    return path


@pytest.fixture
def cli():
    return _binary("DISTMUON_CLI")


@pytest.fixture
def checkpoint_peer():
    return _binary("DISTMUON_CHECKPOINT_PEER")


@pytest.fixture(scope="module")
def gloo():
    """torch.distributed over gloo for the modules that run under torchrun (`pytestmark =
    pytest.mark.usefixtures("gloo")`), one torch thread per process."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    torch.set_num_threads(1)
    yield
