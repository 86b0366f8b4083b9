#!/usr/bin/env python3
"""Overhead of distmuon.torch.Muon over the C++ optimizer (docs/python.md).

Times, interleaved in one run, a step of the C++ distmuon::Muon (timed in C++ through the
binding's time_steps: no Python inside the timed region) and a step of distmuon.torch.Muon
(torch.optim.Optimizer.step from Python: gradients gathered from the parameters, schedules
applied, then that same C++ step), both on the one optimizer that distmuon.torch.Muon holds: the
same weights, gradients and workspaces. Prints the median
and spread of each and the ratio of the medians; --json writes them.

    PYTHONPATH=build/python .venv/bin/python bench/python_step_overhead.py [--shape MxN ...]
"""
import argparse
import json
import statistics
import time

import numpy as np
import torch

import distmuon.torch as dmt


def summary(xs):
    xs = sorted(xs)
    return {"min_ms": 1e3 * xs[0], "median_ms": 1e3 * statistics.median(xs), "p10_ms": 1e3 * xs[len(xs) // 10],
            "p90_ms": 1e3 * xs[(9 * len(xs)) // 10]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", action="append",
                    help="MxN of one weight (repeatable; default 4 x 512x128 + 4 x 128x512)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shape] if args.shape else \
        [(512, 128)] * 4 + [(128, 512)] * 4
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(s).astype(np.float32) * 0.02 for s in shapes]
    grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]

    params = [torch.nn.Parameter(torch.from_numpy(w)) for w in weights]
    for p, g in zip(params, grads):
        p.grad = torch.from_numpy(g)
    opt = dmt.Muon(params, lr=0.02, tp_mode="auto")
    # The C++ optimizer inside opt, on the same weights, gradients and workspaces: the two timings
    # differ only by what Python adds around the same C++ step.
    core = opt._cores[0][0]
    grad_arrays = [p.grad.numpy() for p in params]

    core._core.time_steps(grad_arrays, args.warmup)
    for _ in range(args.warmup):
        opt.step()
    cpp, py, own = [], [], []
    # distmuon.torch.Muon.step without torch.optim.Optimizer's step wrapper (profiling hooks,
    # step hooks): what distmuon's Python adds on its own.
    inner = type(opt).step
    while hasattr(inner, "__wrapped__"):
        inner = inner.__wrapped__

    def timed(f, into):
        t0 = time.perf_counter()
        f()
        into.append(time.perf_counter() - t0)

    # Interleaved, alternating which goes first: all see the same machine load and caches.
    for r in range(args.reps):
        if r % 2:
            timed(opt.step, py)
            timed(lambda: inner(opt), own)
        cpp.append(core._core.time_steps(grad_arrays, 1)[0])
        if not r % 2:
            timed(lambda: inner(opt), own)
            timed(opt.step, py)
    pairs = sorted(b / a for a, b in zip(cpp, py))
    out = {"shapes": ["%dx%d" % s for s in shapes], "reps": args.reps, "cpp": summary(cpp),
           "torch_optimizer": summary(py), "without_torch_wrapper": summary(own),
           "ratio_of_medians": statistics.median(py) / statistics.median(cpp),
           "median_pair_ratio": statistics.median(pairs),
           "ratio_of_minima": min(py) / min(cpp),
           "without_wrapper_ratio_of_medians": statistics.median(own) / statistics.median(cpp),
           "without_wrapper_ratio_of_minima": min(own) / min(cpp)}
    print(f"weights: {', '.join(out['shapes'])}; {args.reps} interleaved repetitions")
    for k in ("cpp", "torch_optimizer", "without_torch_wrapper"):
        s = out[k]
        print(f"  {k:21s} min {s['min_ms']:8.3f} ms  median {s['median_ms']:8.3f} ms  (p10 {s['p10_ms']:.3f}, "
              f"p90 {s['p90_ms']:.3f})")
    print(f"  distmuon.torch.Muon / C++ step: {out['ratio_of_medians']:.4f} (ratio of medians), "
          f"{out['median_pair_ratio']:.4f} (median of per-pair ratios), "
          f"{out['ratio_of_minima']:.4f} (ratio of minima)")
    print(f"  without torch's Optimizer.step wrapper / C++ step: "
          f"{out['without_wrapper_ratio_of_medians']:.4f} (ratio of medians), "
          f"{out['without_wrapper_ratio_of_minima']:.4f} (ratio of minima)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
