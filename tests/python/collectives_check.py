"""Every collective of a distmuon.Communicator on NumPy arrays, checked against values each rank
computes itself (shared by test_matrix_mpi.py and test_matrix_torch.py): exact, since every
value is a small integer."""
import numpy as np

DTYPES = (np.float32, np.float64, np.int32, np.int64, np.uint8)


def check_all(comm):
    n, r = comm.size, comm.rank
    for dt in DTYPES:
        what = f"{comm!r} {np.dtype(dt).name}"
        # all_gather, out of place and in place (this rank's chunk at the start of recv).
        send = (np.arange(3) + 10 * r).astype(dt)
        want = np.concatenate([np.arange(3) + 10 * q for q in range(n)]).astype(dt)
        recv = np.zeros(3 * n, dt)
        comm.all_gather(send, recv)
        assert np.array_equal(recv, want), what
        recv = np.zeros(3 * n, dt)
        recv[:3] = send
        comm.all_gather(recv[:3], recv)
        assert np.array_equal(recv, want), f"{what} in place"
        # all_reduce and reduce_scatter, each op.
        for op, fold in (("sum", sum), ("max", max), ("min", min)):
            buf = np.array([r + 1, n - r, 7], dt)
            comm.all_reduce(buf, op)
            rows = [np.array([q + 1, n - q, 7]) for q in range(n)]
            want = np.array([fold(v[i] for v in rows) for i in range(3)], dt)
            assert np.array_equal(buf, want), f"{what} all_reduce {op}"
            send = (np.arange(2 * n) + r).astype(dt)
            recv = np.zeros(2, dt)
            comm.reduce_scatter(send, recv, op)
            js = np.arange(2 * r, 2 * r + 2)
            want = np.array([fold(j + q for q in range(n)) for j in js], dt)
            assert np.array_equal(recv, want), f"{what} reduce_scatter {op}"
        # broadcast from the last rank.
        buf = np.full(4, r, dt)
        comm.broadcast(buf, n - 1)
        assert np.array_equal(buf, np.full(4, n - 1, dt)), f"{what} broadcast"
        # all_to_all_v with uneven counts, some zero: rank s sends (s + d) % 3 values to d.
        sc = [(r + d) % 3 for d in range(n)]
        send = np.concatenate([np.full(sc[d], 10 * r + d) for d in range(n)]).astype(dt)
        rc = [(s + r) % 3 for s in range(n)]
        recv = np.zeros(sum(rc), dt)
        comm.all_to_all_v(send, sc, recv, rc)
        want = np.concatenate([np.full(rc[s], 10 * s + r) for s in range(n)]).astype(dt)
        assert np.array_equal(recv, want), f"{what} all_to_all_v"
