#!/usr/bin/env bash
# The GPU check of distmuon's CUDA backend: one command, run on a machine with an NVIDIA GPU, the
# CUDA compiler, CMake, ninja and a Python with PyTorch, but no package registry (docs/gpu.md,
# "The device check").
#
#   scripts/device-check.sh --prepare   here, with Debian's registry: fetches into device-debs/
#                                       (git-ignored, ~15 MiB; carry it to the GPU machine) the
#                                       Debian packages the build needs that such a machine lacks
#   scripts/device-check.sh             on the GPU machine: the check
#   scripts/device-check.sh --dry-run   anywhere: the check without a GPU (its steps that need a
#                                       device are rehearsed on the CPU at small sizes)
#
# Steps, each under a hard time cap (the whole run within 8 minutes, build included):
#   0. preflight (10 s): OS, nvcc, cmake, compiler and Python versions, where cuBLAS and NCCL
#      are (the CUDA toolkit, else the Python environment's nvidia-* wheels, as PyTorch takes
#      them), the driver's device count or its error string;
#   1. the packages of device-debs/ unpacked into a private prefix (dpkg -x, else ar + tar);
#   2. a Release build with CUDA (for this GPU's architecture only), MPI and the command-line
#      tool off: the library, the CUDA tests, the CUDA benchmark and the Python module;
#   3. distmuon's tests: ctest (labels compute and gpu; a test that skips while a GPU is present
#      is a failure; test_cuda_ns includes bf16 storage NS, Compute::newton_schulz_bf16, against
#      the CPU's emulation of its rounding order: bit-equal with no step, >= 95% of the elements
#      bit-equal after one, within 2e-2 after five, the strided batch too; test_cuda_graphs:
#      DISTMUON_CUDA_GRAPHS=1's captured and replayed NS bit-equal to the plain calls), then the Python CUDA tests (pytest: CUDA tensors, FSDP2 on CUDA at world
#      size 1), then the multi-rank GPU path under torchrun: two ranks sharing one GPU (gloo,
#      the host-staged data plane), and with two or more GPUs two ranks over NCCL (owner,
#      distributed, auto; a skip while a GPU is present is a failure);
#   4. distmuon's benchmark (bench_cuda_ns: GEMM rates on random data, NS in each precision at
#      1024^2, 2048^2, 4096^2, 4096x14336 and 8192^2);
#   5. PyTorch's comparison, after: the same NS in PyTorch (bench/torch_newton_schulz.py: also
#      torch.optim.Muon's bf16 NS order, eager and under torch.compile) and
#      distmuon.torch.Muon's step on CUDA tensors beside a PyTorch reference Muon step
#      (bench/torch_muon_step.py);
#   6. the summary table (bench/device_summary.py), also in summary.txt, with bf16 standard NS
#      beside torch.optim.Muon's eager and compiled NS and the speed targets (1.15x eager at
#      4096^2 and 8192^2, 1.0x at the other shapes; a miss fails the check).
# Everything goes to $OUT (else ./device-check-out), at most 8 files: summary.txt, log.txt (all
# output), build.txt, ctest.txt, pytest.txt, cuda_ns.json, torch_ns.json, muon_step.json.
# PYTHON names the interpreter with PyTorch (default: python3 on PATH). Exit status 0 only when
# every step passed.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
debs="${DEVICE_CHECK_DEBS:-$root/device-debs}"
mode=run
case "${1:-}" in
  --prepare) mode=prepare ;;
  --dry-run) mode=dry ;;
  "") ;;
  *)
    echo "usage: scripts/device-check.sh [--prepare | --dry-run]" >&2
    exit 2
    ;;
esac

# What a Release build of the library, its CUDA tests, the benchmark and the Python module needs
# (MPI and the command-line tool off), with the libraries those link: OpenBLAS and LAPACKE,
# JSON, logging, GoogleTest and Google Benchmark. libc, libgcc and libstdc++ come with any
# machine that has a compiler for nvcc.
packages=(
  libopenblas0-pthread libopenblas-pthread-dev libgfortran5 libquadmath0
  liblapacke liblapacke-dev libtmglib3
  nlohmann-json3-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  libgtest-dev libbenchmark-dev libbenchmark1debian
)
if [[ "$mode" == prepare ]]; then
  set -e
  mkdir -p "$debs"
  rm -f "$debs"/*.deb
  if ! apt-cache show "${packages[0]}" >/dev/null 2>&1; then apt-get update -qq; fi
  (cd "$debs" && apt-get download -qq "${packages[@]}" 2>&1 | grep -v "unsandboxed" >&2 || true)
  echo "device-check: $(ls "$debs"/*.deb | wc -l) packages, $(du -sh "$debs" | cut -f1), in $debs"
  exit 0
fi

out="${OUT:-$root/device-check-out}"
build="$root/build-device"
prefix="$build/prefix"
python="${PYTHON:-python3}"
jobs="$(nproc)"
# Seconds for the whole run: 8 minutes on a 16-core GPU machine. DEVICE_CHECK_BUDGET gives a
# slower machine's dry run more (every step's cap grows in proportion).
budget="${DEVICE_CHECK_BUDGET:-480}"
mkdir -p "$out"
exec > >(tee "$out/log.txt") 2>&1
summary="$out/summary.txt"
: >"$summary"
t0=$SECONDS
failures=()
note() { echo "$*" | tee -a "$summary"; }
step() {
  note "[$((SECONDS - t0))s] $*"
}
failed() {
  failures+=("$1")
  note "  FAILED: $1"
}
# The seconds a step may take: its own cap (for the 480 s budget, scaled to the budget), never
# past the whole run's budget (less 20 s kept for the summary).
cap() {
  local want=$(($1 * budget / 480)) left=$((budget - 20 - (SECONDS - t0)))
  ((left < 1)) && left=1
  echo $((want < left ? want : left))
}
finish() {
  step "6. summary"
  timeout 20 "$python" "$root/bench/device_summary.py" --out "$out" --mode "$mode" \
    --failures "$(
      IFS=';'
      echo "${failures[*]:-}"
    )" | tee -a "$summary" || failures+=("summary")
  local files
  files=$(find "$out" -type f | wc -l)
  ((files <= 8)) || failures+=("$files files under $out (at most 8)")
  note "device-check: $mode, total $((SECONDS - t0))s, $files files, ${#failures[@]} failed step(s)${failures[*]:+: ${failures[*]}}"
  ((${#failures[@]} == 0))
  exit $?
}

# The commit, and whether the tree differs from it (a copied tree may keep an older .git).
commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
[[ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ]] &&
  commit="$commit with local changes"
note "distmuon device check $commit, mode $mode"
export PATH="/usr/local/cuda/bin:$PATH"

step "0. preflight"
timeout 10 bash -c '
  echo "  os:       $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME") ($(uname -srm))"
  echo "  nvcc:     $(nvcc --version 2>&1 | grep -o "release [0-9.]*" || echo "not found")"
  echo "  cmake:    $(cmake --version 2>&1 | head -1)"
  echo "  ninja:    $(ninja --version 2>&1 || echo "not found")"
  echo "  compiler: $(${CXX:-c++} --version 2>&1 | head -1)"
  echo "  cores:    $(nproc)"
' | tee -a "$summary"
timeout 10 "$python" - <<'PY' 2>&1 | tee -a "$summary"
import ctypes, glob, os, sys
print(f"  python:   {sys.executable} {sys.version.split()[0]}")
try:
    import torch
    print(f"  torch:    {torch.__version__} (CUDA {torch.version.cuda})")
except Exception as e:  # the check still runs distmuon's own steps
    print(f"  torch:    not importable: {e}")
dirs = ["/usr/local/cuda/lib64", "/usr/local/cuda/lib"]
try:
    import nvidia
    for d in nvidia.__path__:
        dirs += [os.path.join(d, s, "lib") for s in ("cu13", "cublas", "nccl")]
except ImportError:
    pass
for name, pattern in (("cuBLAS", "libcublas.so.*"), ("NCCL", "libnccl.so.*")):
    found = [p for d in dirs for p in sorted(glob.glob(os.path.join(d, pattern)))]
    print(f"  {name}: {' '.join(found) if found else 'not found in ' + ' '.join(dirs)}")
try:
    cuda = ctypes.CDLL("libcuda.so.1")
    rc = cuda.cuInit(0)
    count = ctypes.c_int(0)
    if rc == 0:
        rc = cuda.cuDeviceGetCount(ctypes.byref(count))
    if rc != 0:
        msg = ctypes.c_char_p()
        cuda.cuGetErrorString(rc, ctypes.byref(msg))
        print(f"  driver:   error {rc}: {msg.value.decode() if msg.value else '?'}")
    else:
        version = ctypes.c_int(0)
        cuda.cuDriverGetVersion(ctypes.byref(version))
        print(f"  driver:   CUDA {version.value // 1000}.{version.value % 1000 // 10}, {count.value} device(s)")
except OSError as e:
    print(f"  driver:   cannot load libcuda.so.1: {e}")
PY
gpu_present=0
grep -Eq "^  driver: .* [1-9][0-9]* device\(s\)" "$summary" && gpu_present=1
note "  a GPU is present: $gpu_present"
if [[ "$mode" == run && "$gpu_present" != 1 ]]; then
  failed "preflight: no GPU (use --dry-run on a machine without one)"
fi

step "1. unpacking $debs"
if ! ls "$debs"/*.deb >/dev/null 2>&1; then
  failed "no .deb files in $debs: run scripts/device-check.sh --prepare where Debian's registry is reachable, and carry device-debs/"
  finish
fi
rm -rf "$prefix"
mkdir -p "$prefix"
for deb in "$debs"/*.deb; do
  if command -v dpkg >/dev/null; then
    dpkg -x "$deb" "$prefix"
  else
    tmp="$(mktemp -d)"
    (cd "$tmp" && ar x "$deb" && tar -xf data.tar.* -C "$prefix")
    rm -rf "$tmp"
  fi
done
# The packages' library folder, wherever their multiarch path puts it; what Debian's
# alternatives would link: OpenBLAS as libblas.so.3 and liblapack.so.3.
blas_so="$(find "$prefix" -name 'libopenblasp-r*.so' | head -1)"
[[ -n "$blas_so" ]] || {
  failed "no OpenBLAS in $debs"
  finish
}
blas_dir="$(dirname "$blas_so")"
lib="$(dirname "$blas_dir")"
include="$(find "$prefix" -type d -path '*/include' | head -1)"
ln -sf "$(basename "$blas_so")" "$blas_dir/libopenblas.so.0"
ln -sf "$(basename "$blas_so")" "$blas_dir/libopenblas.so"
ln -sf "$(basename "$blas_so")" "$blas_dir/libblas.so.3"
ln -sf "$(basename "$blas_so")" "$blas_dir/liblapack.so.3"
blas_include="$(find "$prefix" -type d -name 'openblas-pthread' -path '*include*' | head -1)"
export LD_LIBRARY_PATH="$lib:$blas_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
note "  $(ls "$debs"/*.deb | wc -l) packages; libraries in $lib"

step "2. configure and build (CUDA for this GPU, $jobs jobs)"
arch=90
if [[ "$gpu_present" == 1 ]]; then
  arch="$(timeout 10 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')"
  [[ "$arch" =~ ^[0-9]+$ ]] || arch=90
fi
build_ok=1
{
  timeout "$(cap 60)" cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DDISTMUON_ENABLE_CUDA=ON -DDISTMUON_CUDA_ARCHITECTURES="$arch" -DDISTMUON_ENABLE_MPI=OFF \
    -DDISTMUON_ENABLE_APPS=OFF -DDISTMUON_ENABLE_TESTS=ON -DDISTMUON_ENABLE_BENCH=ON \
    -DPython3_EXECUTABLE="$(command -v "$python")" \
    -DCMAKE_PREFIX_PATH="$(dirname "$include")" \
    -DCMAKE_CXX_FLAGS="-isystem $blas_include -isystem $include" \
    -DBLAS_LIBRARIES="$blas_dir/libopenblas.so" -DLAPACK_LIBRARIES="$blas_dir/libopenblas.so" \
    -DDISTMUON_LAPACKE_LIBRARY="$lib/liblapacke.so" &&
    timeout "$(cap 200)" cmake --build "$build" --parallel "$jobs" --target \
      test_cuda_libraries test_cuda_compute test_cuda_ns test_cuda_accounting test_cuda_graphs bench_cuda_ns
} >"$out/build.txt" 2>&1 || build_ok=0
grep -E "^-- distmuon:" "$out/build.txt" | sed 's/^/  /' | tee -a "$summary"
if [[ "$build_ok" != 1 ]]; then
  tail -30 "$out/build.txt"
  failed "build (build.txt)"
  finish
fi
# Every build dependency came from the prefix (a machine without them has nothing else).
for var in fmt_DIR spdlog_DIR nlohmann_json_DIR GTest_DIR benchmark_DIR DISTMUON_LAPACKE_LIBRARY; do
  value="$(grep -E "^$var:" "$build/CMakeCache.txt" | cut -d= -f2-)"
  [[ "$value" == "$prefix"/* ]] || failed "$var is not in the private prefix: $value"
done
# The Python module apart: without Python's headers there, the C++ steps still run.
python_ok=1
timeout "$(cap 90)" cmake --build "$build" --parallel "$jobs" --target distmuon_python \
  >>"$out/build.txt" 2>&1 || python_ok=0
if [[ "$python_ok" != 1 ]]; then
  grep -E "Python|pybind11|error" "$out/build.txt" | tail -5
  failed "the Python module's build (build.txt)"
fi
note "  built in $((SECONDS - t0))s since the start"

step "3a. distmuon's tests (ctest -L 'compute|gpu')"
(
  cd "$build" &&
    DISTMUON_TEST_REQUIRE_GPU="$gpu_present" timeout "$(cap 120)" \
      ctest -L 'compute|gpu' -R 'cuda|nccl' --output-on-failure --timeout 100
) >"$out/ctest.txt" 2>&1
ctest_rc=$?
grep -E "tests passed|tests failed|\(Skipped\)|\(Failed\)|\(Timeout\)|Not Run" "$out/ctest.txt" | sed 's/^/  /' | tee -a "$summary"
((ctest_rc == 0)) || failed "ctest (ctest.txt, rc $ctest_rc)"
if [[ "$gpu_present" == 1 ]] && grep -q "(Skipped)" "$out/ctest.txt"; then
  failed "a gpu test skipped while a GPU is present"
fi

step "3b. distmuon's Python CUDA tests (pytest)"
[[ "$python_ok" == 1 ]] && PYTHONPATH="$build/python" DISTMUON_TEST_REQUIRE_GPU="$gpu_present" timeout "$(cap 90)" \
  "$python" -m pytest -q -rs -p no:cacheprovider "$root/tests/python/test_cuda_tensors.py" \
  "$root/tests/python/test_cuda_fsdp2.py" >"$out/pytest.txt" 2>&1
pytest_rc=$?
tail -3 "$out/pytest.txt" 2>/dev/null | sed 's/^/  /' | tee -a "$summary"
((pytest_rc == 0)) || failed "pytest (pytest.txt, rc $pytest_rc)"
if [[ "$gpu_present" == 1 ]] && grep -qi "skipped" "$out/pytest.txt"; then
  failed "a Python CUDA test skipped while a GPU is present"
fi

# Two ranks under torchrun on the CUDA backend (pytest output appended to pytest.txt): sharing
# one GPU over gloo (DISTMUON_CUDA_DATA_PLANE=host: NCCL refuses two ranks on one device), then,
# with two or more GPUs, one GPU each over NCCL (distmuon's NCCL data plane).
multirank() {
  local what="$1" backend="$2" plane="$3"
  echo "=== $what" >>"$out/pytest.txt"
  PYTHONPATH="$build/python" DISTMUON_TEST_TORCH_BACKEND="$backend" \
    DISTMUON_CUDA_DATA_PLANE="$plane" timeout "$(cap 60)" "$python" -m torch.distributed.run \
    --standalone --nproc-per-node 2 -m pytest -q -rs -p no:cacheprovider \
    "$root/tests/python/test_cuda_multirank.py" >>"$out/pytest.txt" 2>&1
  local rc=$?
  note "  $what: rc $rc"
  ((rc == 0)) || failed "$what (pytest.txt, rc $rc)"
  if [[ "$gpu_present" == 1 ]] && tail -5 "$out/pytest.txt" | grep -qi "skipped"; then
    failed "$what skipped while a GPU is present"
  fi
}
step "3c. two ranks on the CUDA backend (torchrun)"
gpus=0
[[ "$gpu_present" == 1 ]] && gpus="$(timeout 10 nvidia-smi -L 2>/dev/null | grep -c '^GPU')"
if [[ "$python_ok" == 1 && "$gpu_present" == 1 ]]; then
  multirank "two ranks sharing one GPU (gloo, host-staged data plane)" gloo host
  if ((gpus >= 2)); then
    multirank "two ranks over NCCL, one GPU each" nccl nccl
  else
    note "  $gpus GPU: the NCCL run at 2 ranks needs two (not run)"
  fi
elif [[ "$python_ok" == 1 ]]; then
  note "  no GPU: the two-rank runs are not rehearsed (they need CUDA tensors)"
fi

step "4. distmuon's benchmark (bench_cuda_ns)"
if [[ "$gpu_present" == 1 ]]; then
  timeout "$(cap 120)" "$build/bin/bench_cuda_ns" --json "$out/cuda_ns.json" ||
    failed "bench_cuda_ns"
else
  timeout "$(cap 30)" "$build/bin/bench_cuda_ns" --help && note "  no GPU: bench_cuda_ns --help only"
fi

step "5a. PyTorch's Newton-Schulz (bench/torch_newton_schulz.py)"
small=()
[[ "$gpu_present" == 1 ]] || small=(--device cpu --shapes 64x64 64x192 --reps 1 --warmup 0)
# 180 s: torch.compile compiles the muon order once per shape (five shapes) before timing it.
timeout "$(cap 180)" "$python" "$root/bench/torch_newton_schulz.py" --out "$out/torch_ns.json" \
  "${small[@]}" || failed "torch_newton_schulz.py"

step "5b. distmuon.torch.Muon beside a PyTorch reference Muon (bench/torch_muon_step.py)"
[[ "$python_ok" == 1 ]] && PYTHONPATH="$build/python" timeout "$(cap 90)" "$python" \
  "$root/bench/torch_muon_step.py" --out "$out/muon_step.json" "${small[@]}" ||
  failed "torch_muon_step.py"

finish
