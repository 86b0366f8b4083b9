#!/usr/bin/env bash
# Side-by-side optimizer step times of `distmuon train --weights replicated` with every Muon
# weight's NS on one home rank (replica_mode home) and on every rank (every_rank), pairs
# alternating (a shared machine's slow spells hit both modes alike); docs/data-parallel.md shows
# the figures.
#
#   bench/compare_replica_modes.sh [BUILD_DIR] [PAIRS] [STEPS]
#
# Per run: the median opt_ms of steps 2..STEPS of its --log (step 1 allocates and plans), 2 ranks,
# one BLAS thread each. Prints each pair's medians and ratio, the load average before each run
# and the OpenBLAS kernel. Both modes must train to the same losses bit for bit (checked).
set -euo pipefail
build=${1:-build}
pairs=${2:-3}
steps=${3:-8}
cli="$build/bin/distmuon"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ $(id -u) == 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export DISTMUON_BLAS_THREADS=1 OMP_NUM_THREADS=1

echo "blas: $(OPENBLAS_VERBOSE=2 "$cli" demo --rows 64 --cols 64 2>&1 | grep -m1 -i 'core' || true)"
median() {  # the median opt_ms of steps 2.. of a log
  python3 -c '
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("%.1f" % statistics.median(r["opt_ms"] for r in rows if r["step"] >= 2))' "$1"
}
losses() { python3 -c '
import json, sys
print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1]) if l.strip()))' "$1"; }
for ((p = 1; p <= pairs; ++p)); do
  declare -A ms load
  for mode in home every_rank; do
    load[$mode]=$(cut -d' ' -f1 /proc/loadavg)
    mpirun -np 2 "$cli" train --weights replicated --replica-mode "$mode" --steps "$steps" \
      --log "$work/$mode-$p.jsonl" > "$work/$mode-$p.out" 2>&1 ||
      { cat "$work/$mode-$p.out" >&2; exit 1; }
    ms[$mode]=$(median "$work/$mode-$p.jsonl")
  done
  if [[ $(losses "$work/home-$p.jsonl") != $(losses "$work/every_rank-$p.jsonl") ]]; then
    echo "pair $p: the modes' losses differ" >&2
    exit 1
  fi
  ratio=$(python3 -c "print(f'{${ms[home]} / ${ms[every_rank]}:.3f}')")
  echo "pair $p: home ${ms[home]} ms (load ${load[home]}), every_rank ${ms[every_rank]} ms (load ${load[every_rank]}), ratio $ratio"
done
