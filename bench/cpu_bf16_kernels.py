#!/usr/bin/env python3
"""NS's bf16 products on the CPU libraries distmuon could use, beside PyTorch's, in one process
(docs/precision.md, "bf16 on the CPU (oneDNN)").

Each library is a build of bench/cpu_bf16_kernels/cpu_bf16_kernels.cpp (a shared object, made
here with g++), loaded beside torch with RTLD_DEEPBIND so that it keeps its own oneDNN; products of a 1024x4096
NS step (X X^T, A A, B X; bf16 operands, fp32 output) are timed in turn, interleaved with torch's
bf16 matmul of the same shapes, medians of --reps. At one thread the clock is the process's CPU
time (time.process_time), which the other processes of a loaded machine do not inflate; at more
threads it is wall time. Beside the products: one Newton-Schulz of a 1024x4096 matrix,
distmuon.newton_schulz(precision="bf16") against torch.optim.Muon's own NS function.

  python bench/cpu_bf16_kernels.py                                # Debian's oneDNN
  python bench/cpu_bf16_kernels.py --mkl DIR --mkl-include DIR    # + oneMKL (PyPI mkl)
  python bench/cpu_bf16_kernels.py --onednn3 LIBDIR --onednn3-include DIR

--mkl: the folder holding libmkl_core.so.N (e.g. the unpacked `mkl` wheel's data/lib);
--onednn3: the folder holding a oneDNN 3.x libdnnl.so.3 (the PyPI `onednn` wheel's; it runs its
CPU engine through SYCL, so its runtimes must be on LD_LIBRARY_PATH and an OpenCL CPU device
given by OCL_ICD_FILENAMES).
"""
import argparse
import ctypes
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "cpu_bf16_kernels", "cpu_bf16_kernels.cpp")
PRODUCTS = ["X X^T", "A A", "B X"]


def build(out, flags, libs):
    subprocess.run(["g++", "-O2", "-std=c++20", "-fPIC", "-shared", SOURCE, "-o", out, *flags,
                    *libs], check=True)
    return ctypes.CDLL(out, mode=os.RTLD_LOCAL | os.RTLD_DEEPBIND)


def one(pattern):
    found = sorted(glob.glob(pattern))
    if not found:
        raise SystemExit(f"not found: {pattern}")
    return found[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--mkl", help="folder of oneMKL's libmkl_*.so.N")
    ap.add_argument("--mkl-include", help="folder of mkl.h")
    ap.add_argument("--onednn3", help="folder of a oneDNN 3.x libdnnl.so.3")
    ap.add_argument("--onednn3-include", help="folder holding oneapi/dnnl/dnnl.hpp for it")
    args = ap.parse_args()

    import torch
    torch.set_num_threads(args.threads)
    os.environ.setdefault("DISTMUON_BLAS_THREADS", str(args.threads))
    import distmuon
    from torch.optim._muon import _zeropower_via_newtonschulz

    tmp = tempfile.mkdtemp()
    impls = {}
    a = torch.randn(1024, 4096).bfloat16()
    s = torch.randn(1024, 1024).bfloat16()
    torch_fns = [lambda: a @ a.T, lambda: s @ s, lambda: s @ a]
    impls[f"torch {torch.__version__} matmul (bf16 output)"] = lambda w: torch_fns[w]() is None  # 0: done

    def add(lib, variants):
        lib.bench_library.restype = ctypes.c_char_p
        print(lib.bench_library().decode())
        for variant, name in variants:
            impls[name] = lambda w, lib=lib, v=variant: lib.bench_run(v, w)

    deb = build(os.path.join(tmp, "deb.so"), [], ["-ldnnl"])
    add(deb, [(0, "oneDNN (Debian) plain layouts"), (1, "oneDNN (Debian) weights any + reorder")])
    if args.mkl:
        libs = [one(os.path.join(args.mkl, f"libmkl_{n}.so*"))
                for n in ("intel_lp64", "sequential", "core")]
        mkl = build(os.path.join(tmp, "mkl.so"),
                    ["-DWITH_MKL", f"-I{args.mkl_include}", f"-Wl,-rpath,{args.mkl}"],
                    ["-ldnnl", *libs])
        add(mkl, [(2, "oneMKL cblas_gemm_bf16bf16f32 (sequential)")])
    if args.onednn3:
        lib3 = build(os.path.join(tmp, "onednn3.so"), [f"-I{args.onednn3_include}"],
                     [one(os.path.join(args.onednn3, "libdnnl.so.3"))])
        add(lib3, [(0, "oneDNN 3.x plain layouts")])

    clock = time.process_time if args.threads == 1 else time.perf_counter
    times = {(name, w): [] for name in impls for w in range(3)}
    x = torch.randn(1024, 4096)
    ns = {"distmuon.newton_schulz bf16": [], "torch.optim.Muon NS": []}
    for rep in range(args.reps + 1):
        for w in range(3):
            for name, fn in impls.items():
                t0 = clock()
                if fn(w):
                    raise SystemExit(f"{name}: product {w} failed")
                if rep:  # the first round warms up (primitive creation, JIT)
                    times[(name, w)].append(clock() - t0)
        t0 = clock()
        distmuon.newton_schulz(x, precision="bf16")
        t1 = clock()
        _zeropower_via_newtonschulz(x, (3.4445, -4.7750, 2.0315), 5, 1e-7)
        if rep:
            ns["distmuon.newton_schulz bf16"].append(t1 - t0)
            ns["torch.optim.Muon NS"].append(clock() - t1)
    print(f"threads {args.threads}, clock {clock.__name__}, medians of {args.reps} (ms)")
    print("| library | " + " | ".join(PRODUCTS) + " |")
    print("|---|" + "---|" * len(PRODUCTS))
    for name in impls:
        print(f"| {name} | " + " | ".join(
            f"{1e3 * statistics.median(times[(name, w)]):.1f}" for w in range(3)) + " |")
    for name, t in ns.items():
        print(f"NS of 1024x4096, {name}: {1e3 * statistics.median(t):.0f} ms")


if __name__ == "__main__":
    sys.exit(main())
