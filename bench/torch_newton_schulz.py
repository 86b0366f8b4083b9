#!/usr/bin/env python3
"""Newton-Schulz in PyTorch on a GPU: the reference the CUDA backend's NS is timed against
(scripts/device-check.sh runs bench/cuda/bench_cuda_ns.cpp, then this script, and
bench/device_summary.py puts their JSON side by side).

The same algorithms as distmuon with its defaults (src/ns/newton_schulz.cpp,
src/ns/gram_newton_schulz.cpp, src/ns/coefficients.cpp): the "quintic" coefficients, 5 steps,
X = G / max(||G||_F, 1e-15), the Gram matrix on the smaller side.
  standard: per step A = X X^T, B = b A + c A A + a I, X = B X.
  gram:     R = X X^T once; per step P = c R R + b R + a I, Q = P Q (Q = P on the first step),
            R = R P^2 (not on the last step; re-formed from X = Q X_0 on a restart); X = Q X_0.
  muon:     torch.optim.Muon's order (torch/optim/_muon.py, _zeropower_via_newtonschulz) with the
            same per-step coefficients, bf16 only: X in bf16, A = X X^T, B = addmm(A, A, A,
            beta=b, alpha=c), X = addmm(X, B, X, beta=a); every product writes bf16. The order
            distmuon's CUDA backend runs bf16 standard NS in (Compute::newton_schulz_bf16).
  muon_compiled: the same function under torch.compile (compiled once per shape, before timing;
            --no-compile leaves it out).
Precisions: fp32 (TF32 off), tf32 (fp32 tensors, TF32 matmuls), bf16 (bf16 tensors, which
matmul accumulates in fp32). The input is random (torch.randn). Times are the median of --reps
runs after --warmup runs, with CUDA events (a host clock on --device cpu, which the device check's
dry run uses at small --shapes). Prints a table and writes JSON (--out).
"""
import argparse
import json
import statistics
import time

import torch

QUINTIC = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
           (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]
STEPS = 5
# distmuon's automatic Gram restart rule: the growth limit per precision (docs/precision.md).
GRAM_GROWTH_LIMIT = {"fp32": 5e4, "tf32": 12.0, "bf16": 12.0}
SHAPES = [(1024, 1024), (2048, 2048), (4096, 4096), (4096, 14336), (8192, 8192)]


def coefficients(step):
    return QUINTIC[step % len(QUINTIC)]  # the quintic set cycles past its table


def gram_restarts_after(step, limit):
    """distmuon's automatic rule (gram_restarts_after with gram_restart = 0)."""
    if step < 0 or step + 1 >= STEPS:
        return False
    growth = 1.0
    for k in range(step + 1):
        a = coefficients(k)[0]
        growth *= a * a
        restart = k + 1 < STEPS and growth > limit
        if k == step:
            return restart
        if restart:
            growth = 1.0
    return False


def normalise(g, dtype):
    x = g.to(dtype)
    norm = torch.linalg.vector_norm(g.double()).clamp_min(1e-15)
    return x / norm.to(dtype)


def standard_ns(g, dtype, precision=None):
    tall = g.shape[0] > g.shape[1]
    x = normalise(g.T if tall else g, dtype)
    for step in range(STEPS):
        a, b, c = coefficients(step)
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c) if c != 0 else gram * b
        poly.diagonal().add_(a)
        x = poly @ x
    return x.T if tall else x


def muon_ns(g, dtype, precision=None):
    """torch.optim.Muon's _zeropower_via_newtonschulz with per-step coefficients."""
    tall = g.shape[0] > g.shape[1]
    x = normalise(g.T if tall else g, dtype)
    for step in range(STEPS):
        a, b, c = coefficients(step)
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, poly, x, beta=a)
    return x.T if tall else x


def gram_ns(g, dtype, precision):
    tall = g.shape[0] > g.shape[1]
    x0 = normalise(g.T if tall else g, dtype)
    r = x0 @ x0.T
    q = None
    for step in range(STEPS):
        a, b, c = coefficients(step)
        p = torch.addmm(r, r, r, beta=b, alpha=c) if c != 0 else r * b
        p.diagonal().add_(a)
        q = p if q is None else p @ q
        if step + 1 == STEPS:
            break
        if gram_restarts_after(step, GRAM_GROWTH_LIMIT[precision]):
            x0 = q @ x0
            r = x0 @ x0.T
            q = None
            continue
        r = r @ (p @ p)
    x = q @ x0
    return x.T if tall else x


_compiled = None


def compiled_muon_ns(g, dtype, precision=None):
    """muon_ns under torch.compile (made on first use; the warm-up runs compile it)."""
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(muon_ns)
    return _compiled(g, dtype, precision)


def time_ms(fn, g, dtype, precision, warmup, reps):
    for _ in range(warmup):
        fn(g, dtype, precision)
    times = []
    for _ in range(reps):
        if g.is_cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn(g, dtype, precision)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn(g, dtype, precision)
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def shape(text):
    m, n = (int(v) for v in text.lower().split("x"))
    return m, n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="torch_ns.json", help="JSON results")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="cuda", help="cuda (default), or cpu for a dry run")
    ap.add_argument("--shapes", type=shape, nargs="+", default=SHAPES, help="MxN ...")
    ap.add_argument("--no-compile", action="store_true",
                    help="leave out muon_compiled (torch.compile of the muon order)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("torch_newton_schulz.py: no CUDA device")
    results = []
    torch.manual_seed(0)
    for m, n in args.shapes:
        g = torch.randn(m, n, device=args.device, dtype=torch.float32)
        for precision in ("fp32", "tf32", "bf16"):
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
            dtype = torch.bfloat16 if precision == "bf16" else torch.float32
            algorithms = [("standard", standard_ns), ("gram", gram_ns)]
            if precision == "bf16":
                algorithms.append(("muon", muon_ns))
                if not args.no_compile:
                    algorithms.append(("muon_compiled", compiled_muon_ns))
            for algorithm, fn in algorithms:
                try:
                    ms = time_ms(fn, g, dtype, precision, args.warmup, args.reps)
                except Exception as e:  # torch.compile needs a working compiler backend
                    if algorithm != "muon_compiled":
                        raise
                    print(f"torch {algorithm}: not timed ({type(e).__name__}: {e})"[:300],
                          flush=True)
                    continue
                results.append({"algorithm": algorithm, "precision": precision, "m": m, "n": n,
                                "ms": ms})
                print(f"torch {algorithm:8s} {precision:4s} {m:5d}x{n:<5d} {ms:9.3f} ms",
                      flush=True)
        del g
    torch.backends.cuda.matmul.allow_tf32 = False
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    with open(args.out, "w") as f:
        json.dump({"device": name, "torch": torch.__version__,
                   "steps": STEPS, "coefficients": "quintic", "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
