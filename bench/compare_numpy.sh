#!/usr/bin/env bash
# Side-by-side: distmuon's NS of 1024x4096 (quintic, 5 steps, 1 BLAS thread) against the same
# algorithm in NumPy on the same OpenBLAS, alternating the two ROUNDS times on a quiet machine.
# Needs Debian's python3-numpy (it links the system OpenBLAS): apt-get install python3-numpy.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rounds=${ROUNDS:-3}
export OPENBLAS_NUM_THREADS=1 DISTMUON_BLAS_THREADS=1
for r in $(seq "$rounds"); do
  d=$("$root/build/bin/distmuon" demo --reps 5 | awk '/time/ {print $2}')
  n=$(/usr/bin/python3 "$root/bench/numpy_newton_schulz.py" --reps 5 | awk '{print $4}')
  awk -v d="$d" -v n="$n" -v r="$r" 'BEGIN {printf "round %d: distmuon %.1f ms, numpy %.1f ms, numpy/distmuon = %.2fx\n", r, d, n, n / d}'
done
