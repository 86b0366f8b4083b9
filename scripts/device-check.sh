#!/usr/bin/env bash
# The GPU check of distmuon's CUDA backend, in one run on a machine with an NVIDIA GPU, CUDA
# (/usr/local/cuda), CMake, ninja and PyTorch but no package registry (docs/gpu.md):
#   1. unpacks the Debian packages of device-debs/ (fetched beforehand by
#      scripts/fetch-device-debs.sh) into a private prefix with dpkg -x (or ar + tar);
#   2. configures and builds, against that prefix only, a Release build with CUDA on and MPI,
#      the command-line tool and the Python module off, and only the targets it needs: the gpu
#      tests and bench_cuda_ns;
#   3. runs the gpu tests (ctest -L gpu: the CUDA backend against the CPU backend);
#   4. times Newton-Schulz in PyTorch (bench/torch_newton_schulz.py) and in distmuon
#      (bench_cuda_ns: the same algorithms and precisions, with the GEMM rates of the GPU).
# Everything goes to $OUT (else ./device-check-out): device-check.log (all output), summary.txt
# (step times and results), ctest-gpu.log, torch_ns.json, bench.txt and cuda_ns.json.
# DEVICE_CHECK_DRY_RUN=1 runs steps 1-2 and the tests (which then skip themselves: no device) and
# checks that every library came from the prefix; it skips the benchmarks. PYTHON names the
# interpreter with PyTorch (default python3). Budget: 8 minutes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:-$root/device-check-out}"
dry="${DEVICE_CHECK_DRY_RUN:-0}"
debs="${DEVICE_CHECK_DEBS:-$root/device-debs}"
build="$root/build-device"
prefix="$build/prefix"
jobs="$(nproc)"
mkdir -p "$out"
exec > >(tee "$out/device-check.log") 2>&1
summary="$out/summary.txt"
: > "$summary"
t0=$SECONDS
step_start=$SECONDS
note() { echo "$*" | tee -a "$summary"; }
step() { note "[$((SECONDS - t0))s] $*"; step_start=$SECONDS; }
done_step() { note "      done in $((SECONDS - step_start))s"; }
fail() { note "device-check: FAILED: $*"; exit 1; }

note "distmuon device check $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'), dry run: $dry"
if [[ "$dry" != 1 ]]; then
  command -v nvidia-smi >/dev/null && nvidia-smi | tee "$out/nvidia-smi.txt" || true
fi
export PATH="/usr/local/cuda/bin:$PATH"

step "1. unpacking $(ls "$debs"/*.deb 2>/dev/null | wc -l) packages of $debs into $prefix"
ls "$debs"/*.deb >/dev/null 2>&1 || fail "no .deb files in $debs (run scripts/fetch-device-debs.sh first)"
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
lib="$prefix/usr/lib/x86_64-linux-gnu"
blas_dir="$lib/openblas-pthread"
# What Debian's alternatives would link: OpenBLAS as libblas.so.3 and liblapack.so.3.
ln -sf openblas-pthread/libopenblas.so "$lib/libopenblas.so"
ln -sf "$(basename "$(ls "$blas_dir"/libopenblasp-r*.so | head -1)")" "$blas_dir/libopenblas.so.0"
ln -sf openblas-pthread/libopenblas.so.0 "$lib/libopenblas.so.0"
ln -sf openblas-pthread/libblas.so.3 "$lib/libblas.so.3"
ln -sf openblas-pthread/liblapack.so.3 "$lib/liblapack.so.3"
export LD_LIBRARY_PATH="$lib:$blas_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done_step

step "2. configuring and building (Release, CUDA on; $jobs jobs)"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DDISTMUON_ENABLE_CUDA=ON -DDISTMUON_ENABLE_MPI=OFF -DDISTMUON_ENABLE_APPS=OFF \
  -DDISTMUON_ENABLE_PYTHON=OFF -DDISTMUON_ENABLE_TESTS=ON -DDISTMUON_ENABLE_BENCH=ON \
  -DCMAKE_PREFIX_PATH="$prefix/usr" \
  -DCMAKE_CXX_FLAGS="-isystem $prefix/usr/include/x86_64-linux-gnu/openblas-pthread -isystem $prefix/usr/include" \
  -DBLAS_LIBRARIES="$blas_dir/libopenblas.so" -DLAPACK_LIBRARIES="$blas_dir/libopenblas.so" \
  -DDISTMUON_LAPACKE_LIBRARY="$lib/liblapacke.so" | tee "$out/configure.log"
# Every dependency must come from the prefix (a machine without them has nothing else).
for var in fmt_DIR spdlog_DIR nlohmann_json_DIR GTest_DIR benchmark_DIR DISTMUON_LAPACKE_LIBRARY; do
  value="$(grep -E "^$var:" "$build/CMakeCache.txt" | cut -d= -f2-)"
  note "      $var = $value"
  [[ "$value" == "$prefix"/* ]] || fail "$var is not in the private prefix: $value"
done
targets=(test_cuda_compute test_cuda_ns bench_cuda_ns)
cmake --build "$build" --parallel "$jobs" --target "${targets[@]}"
# The binaries load the prefix's libraries.
for bin in "$build/tests/compute/test_cuda_compute" "$build/bin/bench_cuda_ns"; do
  for so in libopenblas libfmt libspdlog liblapacke; do
    path="$(ldd "$bin" | awk -v so="$so" '$1 ~ "^"so {print $3}' | head -1)"
    if [[ -n "$path" ]]; then
      note "      $(basename "$bin"): $so -> $path"
      [[ "$(readlink -f "$path")" == "$prefix"/* ]] || fail "$(basename "$bin") loads $path, not the prefix's $so"
    fi
  done
done
done_step

step "3. gpu tests (ctest -L gpu)"
set +e
(cd "$build" && ctest -L gpu --output-on-failure --timeout 300) 2>&1 | tee "$out/ctest-gpu.log"
tests_rc=${PIPESTATUS[0]}
set -e
grep -E "tests passed|tests failed|Skipped|Not Run|Failed|Passed" "$out/ctest-gpu.log" | sed 's/^/      /' >> "$summary" || true
done_step

if [[ "$dry" == 1 ]]; then
  note "dry run: benchmarks skipped. total $((SECONDS - t0))s, ctest rc $tests_rc"
  exit "$tests_rc"
fi

step "4a. PyTorch Newton-Schulz"
bench_rc=0
timeout 240 "${PYTHON:-python3}" "$root/bench/torch_newton_schulz.py" --out "$out/torch_ns.json" 2>&1 |
  tee "$out/torch_ns.txt" || bench_rc=1
done_step
step "4b. distmuon CUDA Newton-Schulz and the GEMM rates"
torch_json=()
[[ -s "$out/torch_ns.json" ]] && torch_json=("$out/torch_ns.json")
timeout 240 "$build/bin/bench_cuda_ns" "${torch_json[@]}" --json "$out/cuda_ns.json" 2>&1 |
  tee "$out/bench.txt" || bench_rc=1
cat "$out/bench.txt" >> "$summary"
done_step
note "total $((SECONDS - t0))s, ctest rc $tests_rc, benchmarks rc $bench_rc"
[[ $tests_rc == 0 && $bench_rc == 0 ]]
