#!/usr/bin/env python3
"""Memory per parameter of distmuon.torch.Muon beside torch.optim.Muon's, for float32 and bfloat16
parameters (docs/python.md, "Memory per parameter").

distmuon's figures are its backend's own accounting (`memory_stats()`: every buffer the C++
optimizer allocates, the same code on the CPU and on CUDA) plus the float32 working copies the
Python front door keeps for low-precision parameters; torch.optim.Muon's are the bytes of its
state tensors (the momentum, in the parameter's dtype). Neither counts the parameters or the
gradients themselves.

    python bench/python_memory.py [--shapes 1024x4096 4096x1024 ...]

bfloat16 parameters are measured with the default float32 momentum and with momentum_dtype
"param" (the momentum in bfloat16, as torch keeps it).
"""
import argparse

import torch

import distmuon.torch as dmt


def measure(shapes, dtype, **options):
    n = sum(r * c for r, c in shapes)
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(r, c).to(dtype)) for r, c in shapes]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = dmt.Muon(params, **options)
    core, entries = opt._cores[0]
    before = core.memory_stats()["live_bytes"]
    opt.step()
    opt.step()
    stats = core.memory_stats()
    work = sum(e.work.numel() * e.work.element_size() for e in entries if e.work is not None)
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, q in zip(ref, params):
        p.grad = q.grad.clone()
    torch_opt = torch.optim.Muon(ref)
    torch_opt.step()
    state = sum(t.numel() * t.element_size() for s in torch_opt.state.values()
                for t in s.values() if isinstance(t, torch.Tensor))
    return {"before step": before / n, "between steps": (stats["live_bytes"] + work) / n,
            "peak": (stats["peak_bytes"] + work) / n, "working copies": work / n,
            "torch state": state / n}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["1024x4096", "1024x4096", "4096x1024",
                                                    "4096x1024"])
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes]
    print(f"bytes per parameter ({sum(r * c for r, c in shapes)} parameters; the parameters and "
          "gradients not counted)")
    for dtype, options in ((torch.float32, {}), (torch.bfloat16, {}),
                           (torch.bfloat16, {"momentum_dtype": "param"})):
        m = measure(shapes, dtype, **options)
        label = str(dtype)[6:] + (", momentum_dtype param" if options else "")
        print(f"{label}: distmuon {m['before step']:.2f} before its first step, "
              f"{m['between steps']:.2f} between steps (of which {m['working copies']:.2f} "
              f"float32 working copies), peak {m['peak']:.2f}; torch.optim.Muon's state "
              f"{m['torch state']:.2f}")


if __name__ == "__main__":
    main()
