#!/usr/bin/env bash
# Side-by-side rates of the BLAS kernels distmuon can run on, rounds interleaved (a shared
# machine's slow spells hit every variant alike); docs/bench.md shows the figures.
#
#   bench/compare_blas.sh [BUILD_DIR] [ROUNDS]
#
# 1. `distmuon demo` (NS of 1024x4096, 1 BLAS thread) on a CPU model OpenBLAS does not know:
#    with no environment (distmuon's fix), with OPENBLAS_CORETYPE=SkylakeX set by hand, and with
#    DISTMUON_NO_BLAS_FIX=1 (OpenBLAS's generic fallback). Unless FAKE_CPU_MODEL=none, the model
#    (default 207) is shown to the program by the test shim (build target cpuid_model_shim, an
#    LD_AUDIT library; needs an Intel CPU with CPUID faulting); with none the machine's own CPU is
#    used, which must be one that OpenBLAS does not know for the comparison to mean anything.
# 2. The same BLAS calls (bench/blas_backends.c, linked against libblas.so.3) on OpenBLAS as it
#    chooses, on its Prescott, Haswell and SkylakeX kernels, and on BLIS when installed
#    (libblis4-pthread; used through LD_LIBRARY_PATH for one command, never system-wide), as it
#    chooses and with its AVX-512 kernels forced (BLIS_ARCH_TYPE=skx).
set -euo pipefail
build=${1:-build}
rounds=${2:-3}
here=$(cd "$(dirname "$0")" && pwd)
cli="$build/bin/distmuon"
shim="$build/tests/apps/cpuid_model_shim.so"
blis_dir=/usr/lib/x86_64-linux-gnu/blis-pthread
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fake=()
if [[ "${FAKE_CPU_MODEL:-207}" != none ]]; then
  [[ -f "$shim" ]] || { echo "build $shim first (cmake --build $build --target cpuid_model_shim)" >&2; exit 1; }
  fake=("LD_AUDIT=$(realpath "$shim")" "FAKE_CPU_MODEL=${FAKE_CPU_MODEL:-207}")
fi
cc -O2 -o "$work/blas_backends" "$here/blas_backends.c" -lblas -ldl

# Nothing of the caller's BLAS environment leaks in: each variant sets what it names.
clean=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE -u OPENBLAS_VERBOSE -u DISTMUON_NO_BLAS_FIX
       -u DISTMUON_BLAS_FIX -u DISTMUON_BLAS_THREADS OPENBLAS_NUM_THREADS=1 BLIS_NUM_THREADS=1)
demo_variants=("fix" "hand" "generic")
demo_env() {
  case $1 in
    fix) echo "${fake[*]}" ;;
    hand) echo "${fake[*]} OPENBLAS_CORETYPE=SkylakeX" ;;
    generic) echo "${fake[*]} DISTMUON_NO_BLAS_FIX=1" ;;
  esac
}
blas_variants=("openblas-auto" "openblas-Prescott" "openblas-Haswell" "openblas-SkylakeX")
[[ -f "$blis_dir/libblas.so.3" ]] && blas_variants+=("blis" "blis-skx")
blas_env() {
  case $1 in
    openblas-auto) echo "" ;;
    openblas-*) echo "OPENBLAS_CORETYPE=${1#openblas-}" ;;
    blis) echo "LD_LIBRARY_PATH=$blis_dir BLIS_ARCH_DEBUG=1" ;;
    blis-skx) echo "LD_LIBRARY_PATH=$blis_dir BLIS_ARCH_DEBUG=1 BLIS_ARCH_TYPE=skx" ;;
  esac
}

for ((r = 1; r <= rounds; ++r)); do
  for v in "${demo_variants[@]}"; do
    # shellcheck disable=SC2046
    out=$("${clean[@]}" $(demo_env "$v") "$cli" demo 2>&1)
    rate=$(sed -n 's/^  rate *\([0-9.]*\) GFLOP.*/\1/p' <<<"$out")
    core=$(sed -n 's/^  BLAS *OpenBLAS [^,]*, core \([^,]*\),.*/\1/p' <<<"$out")
    echo "demo $v $core $rate" | tee -a "$work/rates"
  done
  for v in "${blas_variants[@]}"; do
    # shellcheck disable=SC2046
    out=$("${clean[@]}" $(blas_env "$v") "$work/blas_backends" 1024 4096 3 2>&1)
    kernel=$(sed -n "s/^libblis: selecting sub-configuration '\(.*\)'.*/blis:\1/p" <<<"$out")
    read -r name rate < <(tail -n 1 <<<"$out")
    echo "ns-blas $v ${kernel:-$name} $rate" | tee -a "$work/rates"
  done
done

echo
echo "medians over $rounds round(s), GFLOP/s (1 thread):"
awk '{ k = $1 " " $2 " " $3; v[k] = v[k] " " $4 } END { for (k in v) print k, v[k] }' "$work/rates" |
  sort | while read -r what variant kernel values; do
    median=$(tr ' ' '\n' <<<"$values" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
    printf '  %-8s %-18s %-14s %7s   (%s)\n' "$what" "$variant" "$kernel" "$median" "$values"
  done
fix=$(awk '$1 == "demo" && $2 == "fix" { print $4 }' "$work/rates" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
hand=$(awk '$1 == "demo" && $2 == "hand" { print $4 }' "$work/rates" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
awk -v f="$fix" -v h="$hand" 'BEGIN { printf "demo with no environment / with OPENBLAS_CORETYPE by hand: %.2f\n", f / h }'
