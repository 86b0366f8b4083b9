#!/usr/bin/env python3
"""The device check's summary table (scripts/device-check.sh, last step): distmuon's NS times
(bench_cuda_ns's cuda_ns.json) beside PyTorch's (torch_ns.json), the GEMM rates, the
distmuon.torch.Muon step beside torch.optim.Muon (muon_step.json), and the targets:
  - bf16 standard NS of 8192x8192 at >= 70% of the bf16 GEMM rate measured on random data;
  - the same at >= 1.0x PyTorch's speed (PyTorch's time over distmuon's);
  - bf16 standard NS (syrk on) against torch.optim.Muon's order in eager PyTorch (torch_ns.json's
    "muon"): >= 1.15x at 4096x4096 and 8192x8192, >= 1.0x at 1024x1024, 2048x2048 and
    4096x14336; torch.compile's time ("muon_compiled") printed beside it;
  - the Python step's update within its documented bf16 tolerance of PyTorch's.
Prints a Markdown table; exits 1 when a target measured here is missed.
"""
import argparse
import json
import os


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# bf16 standard NS against torch.optim.Muon's order: the speed-up each shape must reach.
MUON_TARGETS = {(1024, 1024): 1.0, (2048, 2048): 1.0, (4096, 4096): 1.15, (4096, 14336): 1.0,
                (8192, 8192): 1.15}


def muon_table(cuda, torch_ms, missed):
    print()
    print("bf16 standard NS against torch.optim.Muon's NS order (same coefficients and steps):")
    print("| shape | distmuon ms (syrk on) | syrk off | torch eager ms | torch.compile ms "
          "| eager/distmuon | target |")
    print("|---|---|---|---|---|---|---|")
    for (m, n), target in MUON_TARGETS.items():
        ours = {r["syrk"]: r["ms"] for r in cuda["results"]
                if (r["algorithm"], r["precision"], r["m"], r["n"]) == ("standard", "bf16", m, n)}
        eager = torch_ms.get(("muon", "bf16", m, n))
        compiled = torch_ms.get(("muon_compiled", "bf16", m, n))
        on = ours.get(True)
        ratio = eager / on if eager and on else None
        fmt = lambda v: f"{v:.2f}" if v else "-"  # noqa: E731
        print(f"| {m}x{n} | {fmt(on)} | {fmt(ours.get(False))} | {fmt(eager)} | {fmt(compiled)} "
              f"| {fmt(ratio)} | {target:.2f} |")
        if ratio is not None and ratio < target:
            missed.append(f"bf16 standard {m}x{n} at {ratio:.2f}x torch.optim.Muon's eager NS "
                          f"(target {target:.2f})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the device check's output folder")
    ap.add_argument("--mode", default="run")
    ap.add_argument("--failures", default="", help="steps that failed, ';'-separated")
    args = ap.parse_args()
    cuda = load(os.path.join(args.out, "cuda_ns.json"))
    torch_ns = load(os.path.join(args.out, "torch_ns.json"))
    step = load(os.path.join(args.out, "muon_step.json"))
    missed = []

    torch_ms = {}
    if torch_ns:
        for r in torch_ns["results"]:
            torch_ms[(r["algorithm"], r["precision"], r["m"], r["n"])] = r["ms"]
    if cuda:
        rates = cuda["gemm_tflops"]
        print(f"GEMM 8192^3, random data ({cuda['device']}): bf16 {rates['bf16']:.0f}, "
              f"tf32 {rates['tf32']:.0f}, fp32 {rates['fp32']:.1f} TFLOP/s")
        print()
        print("| algorithm | precision | syrk | shape | distmuon ms | TFLOP/s | of GEMM "
              "| PyTorch ms | PyTorch/distmuon |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in cuda["results"]:
            t = torch_ms.get((r["algorithm"], r["precision"], r["m"], r["n"]))
            ratio = t / r["ms"] if t else None
            print(f"| {r['algorithm']} | {r['precision']} | {'on' if r['syrk'] else 'off'} "
                  f"| {r['m']}x{r['n']} | {r['ms']:.2f} | {r['tflops']:.0f} "
                  f"| {100 * r['of_gemm']:.0f}% | {f'{t:.2f}' if t else '-'} "
                  f"| {f'{ratio:.2f}' if ratio else '-'} |")
            if (r["algorithm"], r["precision"], r["m"], r["n"]) == ("standard", "bf16", 8192, 8192):
                if r["of_gemm"] < 0.70:
                    missed.append(f"bf16 standard 8192x8192 at {100 * r['of_gemm']:.0f}% "
                                  "of the bf16 GEMM rate (target 70%)")
                if ratio is not None and ratio < 1.0:
                    missed.append(f"bf16 standard 8192x8192 at {ratio:.2f}x PyTorch (target 1.0)")
        muon_table(cuda, torch_ms, missed)
    elif args.mode == "dry":
        print("distmuon NS on the GPU: not measured (dry run, no GPU)")
        if torch_ns:
            print(f"PyTorch NS rehearsed on {torch_ns['device']}: {len(torch_ns['results'])} "
                  "results")
    if step:
        worst = max(step["update_difference"])
        print()
        print(f"distmuon.torch.Muon ({step['precision']}) beside torch.optim.Muon on "
              f"{step['device']}, weights {' '.join(step['shapes'])}: update difference at most "
              f"{worst:.2e} (bound {step['tolerance']:.0e}); one step {step['ms_distmuon']:.2f} ms "
              f"vs {step['ms_torch']:.2f} ms (PyTorch/distmuon "
              f"{step['ms_torch'] / step['ms_distmuon']:.2f})")
        if "distmuon_from_fp32" in step:
            print(f"  from the fp32 update: distmuon at most {max(step['distmuon_from_fp32']):.2e}, "
                  f"torch at most {max(step['torch_from_fp32']):.2e}")
        if not step["ok"]:
            missed.append("the Python Muon step is outside its bound of PyTorch's")
    failures = [f for f in args.failures.split(";") if f]
    print()
    for f in failures:
        print(f"- step failed: {f}")
    for m in missed:
        print(f"- target missed: {m}")
    if not failures and not missed:
        print("- every step passed and every target measured here was met")
    raise SystemExit(1 if missed else 0)


if __name__ == "__main__":
    main()
