#!/usr/bin/env python3
"""distmuon.torch.Muon's step on CUDA tensors beside PyTorch's own Muon (torch.optim.Muon), on
the same parameters and gradients: the time of one step of each and how far apart their updates
are (scripts/device-check.sh runs it after distmuon's own checks).

Both run with torch.optim.Muon's defaults (lr 1e-3, momentum 0.95, Nesterov, its NS coefficients
(3.4445, -4.7750, 2.0315), 5 steps, "original" lr adjustment); torch's NS runs in bf16 (its only
mode), distmuon's at --precision (default bf16: bf16 operands, fp32 accumulation). The update
difference is ||dW_distmuon - dW_torch||_F / ||dW_torch||_F after one step, per weight; the bound
it is checked against (--tolerance) is the one docs/python.md documents for bf16. Each update's
distance from distmuon's fp32 update (NS in fp32: within 1e-6 of float64) is printed beside it,
to show which of the two reduced-precision updates is nearer the exact one.

Times are the median of --reps steps after --warmup steps, with CUDA events (a host clock on
--device cpu, which the device check's dry run uses at small --shapes). Writes JSON (--out).
"""
import argparse
import json
import statistics
import time

import torch

import distmuon.torch as dmt

SHAPES = [(4096, 4096), (4096, 14336), (8192, 8192)]


def shape(text):
    m, n = (int(v) for v in text.lower().split("x"))
    return m, n


def timed(fn, device, warmup, reps):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def one_step_update(make_opt, weights, grads):
    """The change one step makes to fresh copies of weights, given grads."""
    params = [torch.nn.Parameter(w.clone()) for w in weights]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    opt = make_opt(params)
    opt.step()
    return [p.detach() - w for p, w in zip(params, weights)], params, opt


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="muon_step.json")
    ap.add_argument("--device", default="cuda", help="cuda (default), or cpu for a dry run")
    ap.add_argument("--shapes", type=shape, nargs="+", default=SHAPES, help="MxN ...")
    ap.add_argument("--precision", default="bf16", help="distmuon's NS precision")
    ap.add_argument("--tolerance", type=float, default=3e-2,
                    help="bound on the relative update difference (docs/python.md)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("torch_muon_step.py: no CUDA device")
    torch.manual_seed(0)
    weights = [torch.randn(m, n, device=args.device) / n**0.5 for m, n in args.shapes]
    grads = [torch.randn(m, n, device=args.device) for m, n in args.shapes]

    def ours(params):
        return dmt.Muon(params, precision=args.precision)

    def theirs(params):
        return torch.optim.Muon(params)

    d_ours, p_ours, o_ours = one_step_update(ours, weights, grads)
    d_theirs, p_theirs, o_theirs = one_step_update(theirs, weights, grads)
    d_exact, _, _ = one_step_update(lambda params: dmt.Muon(params, precision="fp32"), weights,
                                    grads)

    def rel(a, b):
        return [float((x - y).norm() / y.norm()) for x, y in zip(a, b)]

    diffs = rel(d_ours, d_theirs)
    ours_err, theirs_err = rel(d_ours, d_exact), rel(d_theirs, d_exact)
    finite = all(bool(torch.isfinite(d).all()) for d in d_ours)
    ms_ours = timed(o_ours.step, args.device, args.warmup, args.reps)
    ms_theirs = timed(o_theirs.step, args.device, args.warmup, args.reps)
    ok = finite and max(diffs) <= args.tolerance
    for (m, n), d, eo, et in zip(args.shapes, diffs, ours_err, theirs_err):
        print(f"  {m}x{n}: update difference {d:.2e} (bound {args.tolerance:.0e}); from the fp32 "
              f"update: distmuon {eo:.2e}, torch {et:.2e}")
    print(f"  one step over {len(args.shapes)} weights: distmuon.torch.Muon {ms_ours:.2f} ms, "
          f"torch.optim.Muon {ms_theirs:.2f} ms (torch/distmuon {ms_theirs / ms_ours:.2f}); "
          f"{'ok' if ok else 'FAILED'}")
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                   "torch": torch.__version__, "precision": args.precision,
                   "shapes": [f"{m}x{n}" for m, n in args.shapes],
                   "update_difference": diffs, "distmuon_from_fp32": ours_err,
                   "torch_from_fp32": theirs_err, "tolerance": args.tolerance, "finite": finite,
                   "ms_distmuon": ms_ours, "ms_torch": ms_theirs, "ok": ok}, f, indent=1)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
