#!/usr/bin/env python3
"""How fast a Muon step could be on PyTorch's own bf16 CPU kernels (docs/precision.md, "Other
libraries, measured against the 0.8x aim"): torch.optim.Muon's step beside the same step written
lean with the same kernels, side by side in one process, interleaved, medians.

The lean step does torch.optim.Muon's maths (momentum lerp, Nesterov, bf16 NS with its
coefficients and steps, its learning-rate adjustment and decoupled weight decay) with every saving
that keeps those kernels: the iterate cast to bf16 once per NS, the two symmetric products
(X X^T and A A) computed as 2 row panels of the upper block triangle (3/4 of the work) and
mirrored, the polynomial folded into one addmm. It is the ceiling of a distmuon bf16 step built on
PyTorch's kernels: were it not below 0.8x of torch.optim.Muon's step, no integration of those
kernels would be. Weights: 2 x 1024x4096 + 2 x 4096x1024 (bench/cpu_bf16_step.py's).

    python bench/cpu_bf16_torch_kernels_step.py --threads 1 2 --reps 8

At one thread the clock is the process's CPU time (not inflated by other processes); at more, the
wall clock. Also prints the lean update's distance from torch's (both bf16 NS).
"""
import argparse
import statistics
import time

import torch
from torch.optim._muon import _zeropower_via_newtonschulz

SHAPES = [(1024, 4096), (1024, 4096), (4096, 1024), (4096, 1024)]
A, B, C = 3.4445, -4.7750, 2.0315
LR, WD, MU, EPS, STEPS = 1e-3, 0.1, 0.95, 1e-7, 5


def symmetric_product(x, out):
    """out = x x^T (x: s x n, bf16): the upper block triangle in 2 row panels, then mirrored."""
    h = x.shape[0] // 2
    torch.mm(x[:h], x.T, out=out[:h])
    torch.mm(x[h:], x[h:].T, out=out[h:, h:])
    out[h:, :h].copy_(out[:h, h:].T)
    return out


def lean_ns(u):
    tall = u.shape[0] > u.shape[1]
    x = (u.T if tall else u)
    x = x.div(x.norm().clamp(min=EPS)).to(torch.bfloat16).contiguous()  # one cast
    s = x.shape[0]
    gram = torch.empty(s, s, dtype=torch.bfloat16)
    square = torch.empty_like(gram)
    for _ in range(STEPS):
        symmetric_product(x, gram)
        symmetric_product(gram, square)  # A A = A A^T: A is symmetric
        poly = torch.add(gram, square, alpha=C / B)  # (b A + c A^2) / b
        x = torch.addmm(x, poly, x, beta=A, alpha=B)
    return x.T if tall else x


@torch.no_grad()
def lean_step(params, bufs):
    for p, buf in zip(params, bufs):
        buf.lerp_(p.grad, 1 - MU)
        update = lean_ns(p.grad.lerp(buf, MU))
        p.mul_(1 - LR * WD)
        p.add_(update, alpha=-LR * max(1, p.shape[0] / p.shape[1]) ** 0.5)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=8)
    args = ap.parse_args()
    torch.manual_seed(0)
    weights = [torch.randn(m, n) / n**0.5 for m, n in SHAPES]
    grads = [torch.randn(m, n) for m, n in SHAPES]
    torch_params = [torch.nn.Parameter(w.clone()) for w in weights]
    lean_params = [torch.nn.Parameter(w.clone()) for w in weights]
    for p, q, g in zip(torch_params, lean_params, grads):
        p.grad, q.grad = g.clone(), g.clone()
    opt = torch.optim.Muon(torch_params)  # its defaults: the lean step's constants
    bufs = [torch.zeros_like(w) for w in weights]
    opt.step()
    lean_step(lean_params, bufs)
    dist = [float(((q.detach() - w) - (p.detach() - w)).norm() / (p.detach() - w).norm())
            for p, q, w in zip(torch_params, lean_params, weights)]
    print("lean update from torch.optim.Muon's (both bf16 NS): " +
          ", ".join(f"{d:.1e}" for d in dist))
    for t in args.threads:
        torch.set_num_threads(t)
        clock = time.process_time if t == 1 else time.perf_counter
        ours, theirs = [], []
        for _ in range(args.reps):
            t0 = clock()
            opt.step()
            theirs.append(clock() - t0)
            t0 = clock()
            lean_step(lean_params, bufs)
            ours.append(clock() - t0)
        a, b = statistics.median(theirs), statistics.median(ours)
        print(f"{t} thread(s), {'CPU time' if t == 1 else 'wall clock'}: torch.optim.Muon "
              f"{a:.3f} s, lean step on its kernels {b:.3f} s: {b / a:.2f}x")
    # The NS alone, 1024x4096, at the last thread count.
    x = torch.randn(1024, 4096)
    ns_t, ns_l = [], []
    for _ in range(args.reps):
        t0 = clock()
        _zeropower_via_newtonschulz(x, (A, B, C), STEPS, EPS)
        ns_t.append(clock() - t0)
        t0 = clock()
        lean_ns(x)
        ns_l.append(clock() - t0)
    print(f"NS of 1024x4096: torch {statistics.median(ns_t) * 1e3:.1f} ms, lean "
          f"{statistics.median(ns_l) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
