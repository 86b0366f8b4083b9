#!/usr/bin/env bash
# The main job on its built-in default: installs missing dependencies, builds, and trains the
# character-level model on 2 ranks with Muon on sharded weights (tp-mode auto). Extra arguments
# go to `distmuon train` (e.g. --steps 50, --profile FILE.json, --plot loss.png).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/build.sh"
ranks=${DISTMUON_RANKS:-2}
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
exec mpirun -np "$ranks" --oversubscribe --bind-to none "$root/build/bin/distmuon" train "$@"
