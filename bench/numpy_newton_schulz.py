#!/usr/bin/env python3
"""The same Newton-Schulz in NumPy, for a side-by-side speed comparison with distmuon.

Run with one BLAS thread (OPENBLAS_NUM_THREADS=1) on the same OpenBLAS (Debian's python3-numpy
links the system libblas, which is OpenBLAS). NumPy routes X @ X.T to syrk by itself; A @ A is a
plain gemm. Prints the median time in milliseconds over --reps runs after one warm-up.
"""
import argparse
import time

import numpy as np

QUINTIC = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
           (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]


def newton_schulz(g, steps=5, eps=1e-15):
    x = g.T if g.shape[0] > g.shape[1] else g
    x = x / max(np.linalg.norm(x), eps)
    for i in range(steps):
        a_, b_, c_ = QUINTIC[i % len(QUINTIC)]
        a = x @ x.T
        b = b_ * a + c_ * (a @ a)
        x = a_ * x + b @ x
    return x.T if g.shape[0] > g.shape[1] else x


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    g = np.random.default_rng(0).standard_normal((args.rows, args.cols), dtype=np.float32)
    newton_schulz(g)
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        out = newton_schulz(g)
        times.append(time.perf_counter() - t0)
    assert out.dtype == np.float32
    print(f"numpy {args.rows}x{args.cols} median_ms {1e3 * sorted(times)[len(times) // 2]:.2f}")


if __name__ == "__main__":
    main()
