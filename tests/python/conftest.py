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
