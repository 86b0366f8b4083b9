"""The tp-mode x layout matrix (tp_matrix.py) over MPI, under mpirun -np 2 and -np 4, for both
optimizers and two kinds of communicator: mpi4py's own (the world MPI.COMM_WORLD, the groups
mpi4py Splits that distmuon duplicates) and distmuon's (a distmuon.Communicator world and the
groups of distmuon.process_groups, split in C++)."""
import numpy as np
import pytest
from mpi4py import MPI

import distmuon
import tp_matrix

COMM = MPI.COMM_WORLD
G, R = COMM.Get_size(), COMM.Get_rank()

pytestmark = pytest.mark.skipif(G < 2 or G % 2, reason="the matrix needs an even world")


class Mpi4pyFamily:
    name = "mpi4py"

    def __init__(self):
        self.world, self.size, self.rank = COMM, G, R
        self._cache, self._splits = {}, []

    def _split(self, color, key):
        c = COMM.Split(color, key)
        self._splits.append(c)
        return c

    def groups(self, tp, gtp):
        if (tp, gtp) not in self._cache:
            tp_rank, gtp_rank, rep = R % tp, (R // tp) % gtp, R // (tp * gtp)
            t = COMM if tp == G else self._split(gtp_rank + gtp * rep, tp_rank)
            g = COMM if gtp == G else self._split(tp_rank + tp * rep, gtp_rank)
            self._cache[(tp, gtp)] = (t, g)
        return self._cache[(tp, gtp)]

    def close(self):
        for c in self._splits:
            c.Free()


def own_family():
    world = distmuon.communicator(COMM)
    assert isinstance(world, distmuon.Communicator) and world.backend == "mpi"
    return tp_matrix.SplitFamily("distmuon", world)


@pytest.fixture(scope="module", params=["mpi4py", "distmuon"])
def checker(request):
    family = Mpi4pyFamily() if request.param == "mpi4py" else own_family()
    yield tp_matrix.Checker(family)
    family.close()


@pytest.mark.parametrize("kind", tp_matrix.KINDS)
@pytest.mark.parametrize("mode", tp_matrix.MODES)
def test_matrix(checker, kind, mode):
    errors, _ = checker.check(kind, mode)
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("group", ["world", "split"])
def test_collectives(group):
    """Each collective on NumPy arrays over the world and over a C++ split of it: uneven
    all_to_all_v counts (zeros included), in-place all_gather, reduce_scatter / all_reduce with
    each op, broadcast from the last rank, in every dtype."""
    import collectives_check

    world = distmuon.communicator(COMM)
    comm = world if group == "world" else distmuon.process_groups(world, 2, G // 2).gtp
    collectives_check.check_all(comm)
