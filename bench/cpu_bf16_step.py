#!/usr/bin/env python3
"""distmuon.torch.Muon's bf16 step on the CPU beside torch.optim.Muon's default step, at each
thread count, side by side in one run (docs/precision.md, "bf16 on the CPU").

Per thread count a fresh process (DISTMUON_BLAS_THREADS and torch.set_num_threads set to it)
builds the same weights and gradients (default 2 x 1024x4096 + 2 x 4096x1024), then steps
torch.optim.Muon (its defaults: NS in bf16), distmuon.torch.Muon(precision="bf16") and
distmuon.torch.Muon(precision="fp32") in turn, --reps times interleaved, and prints the median
step of each and their ratios. Beside them: one Newton-Schulz of a 1024x4096 matrix
(distmuon.newton_schulz against torch's own NS function) and torch's bf16 matmul rate on NS's
products, to tell the products from the rest of the step.

The update check: after one step from the same weights and gradients, each bf16 update's
relative distance ||dW - dW_fp32||_F / ||dW_fp32||_F from distmuon's fp32 update, per weight,
against --bound (docs/python.md: bf16 NS's update bound, 3e-2). Exit status 1 when it fails.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SHAPES = [(1024, 4096), (1024, 4096), (4096, 1024), (4096, 1024)]


def worker(threads, reps, bound, cpu_time=False):
    # The process's CPU time is not inflated by other processes of a loaded machine; it only
    # measures the work at one thread (at more, it adds the threads' times).
    clock = time.process_time if cpu_time else time.perf_counter
    import torch

    import distmuon
    import distmuon.torch as dmt
    from torch.optim._muon import _zeropower_via_newtonschulz

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    weights = [torch.randn(m, n) / n**0.5 for m, n in SHAPES]
    grads = [torch.randn(m, n) for m, n in SHAPES]
    makers = {
        "torch": lambda ps: torch.optim.Muon(ps),
        "bf16": lambda ps: dmt.Muon(ps, precision="bf16"),
        "fp32": lambda ps: dmt.Muon(ps, precision="fp32"),
    }
    opts, updates = {}, {}
    for name, make in makers.items():
        params = [torch.nn.Parameter(w.clone()) for w in weights]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opts[name] = make(params)
        opts[name].step()
        updates[name] = [p.detach() - w for p, w in zip(params, weights)]

    def rel(a, b):
        return [float((x - y).norm() / y.norm()) for x, y in zip(a, b)]

    bf16_err = rel(updates["bf16"], updates["fp32"])
    torch_err = rel(updates["torch"], updates["fp32"])

    times = {name: [] for name in opts}
    x = torch.randn(1024, 4096)
    ns = {"distmuon bf16": [], "torch": []}
    for _ in range(reps):
        for name, opt in opts.items():
            t0 = clock()
            opt.step()
            times[name].append(clock() - t0)
        t0 = clock()
        distmuon.newton_schulz(x, precision="bf16")
        ns["distmuon bf16"].append(clock() - t0)
        t0 = clock()
        _zeropower_via_newtonschulz(x, (3.4445, -4.7750, 2.0315), 5, 1e-7)
        ns["torch"].append(clock() - t0)

    rates = {}
    a = torch.randn(1024, 4096).bfloat16()
    s = torch.randn(1024, 1024).bfloat16()
    for label, fn, flops in (("X X^T", lambda: a @ a.T, 2 * 1024 * 1024 * 4096),
                             ("A A", lambda: s @ s, 2 * 1024**3),
                             ("B X", lambda: s @ a, 2 * 1024 * 1024 * 4096)):
        fn()
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        rates[label] = flops / statistics.median(samples) / 1e9
    return {
        "threads": threads,
        "step_s": {k: statistics.median(v) for k, v in times.items()},
        "ns_1024x4096_s": {k: statistics.median(v) for k, v in ns.items()},
        "torch_bf16_matmul_gflops": rates,
        "bf16_update_from_fp32": bf16_err,
        "torch_update_from_fp32": torch_err,
        "bound": bound,
        "ok": max(bf16_err) <= bound,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--bound", type=float, default=3e-2)
    ap.add_argument("--out", default="cpu_bf16_step.json")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time steps and NS by the process's CPU time (meaningful at 1 thread)")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.reps, args.bound, args.cpu_time)))
        return
    results = []
    for t in args.threads:
        env = dict(os.environ, DISTMUON_BLAS_THREADS=str(t))
        out = subprocess.run([sys.executable, __file__, "--worker", str(t), "--reps",
                              str(args.reps), "--bound", str(args.bound)] +
                             (["--cpu-time"] if args.cpu_time else []),
                             env=env, check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        results.append(r)
        s, ns = r["step_s"], r["ns_1024x4096_s"]
        print(f"{t} thread(s): step torch.optim.Muon {s['torch']:.3f} s, distmuon bf16 "
              f"{s['bf16']:.3f} s ({s['bf16'] / s['torch']:.2f}x torch), distmuon fp32 "
              f"{s['fp32']:.3f} s ({s['fp32'] / s['torch']:.2f}x torch, "
              f"bf16/fp32 {s['bf16'] / s['fp32']:.2f})")
        print(f"  NS of 1024x4096: distmuon bf16 {ns['distmuon bf16']:.3f} s, torch "
              f"{ns['torch']:.3f} s; torch bf16 matmul GFLOP/s: " +
              ", ".join(f"{k} {v:.0f}" for k, v in r["torch_bf16_matmul_gflops"].items()))
        print("  update from distmuon's fp32 update: bf16 " +
              ", ".join(f"{e:.1e}" for e in r["bf16_update_from_fp32"]) + "; torch " +
              ", ".join(f"{e:.1e}" for e in r["torch_update_from_fp32"]) +
              f" (bound {r['bound']:.0e}: {'ok' if r['ok'] else 'FAILED'})")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    raise SystemExit(0 if all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
