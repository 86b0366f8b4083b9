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
# The ranks' stdout is a pseudo-terminal of OpenMPI's whatever ours is: tell them whether a person
# watches, for the progress line (docs/training.md).
if [ -t 1 ]; then default_progress=1; else default_progress=0; fi
export DISTMUON_PROGRESS=${DISTMUON_PROGRESS:-$default_progress}
exec mpirun -np "$ranks" --oversubscribe --bind-to none -x DISTMUON_PROGRESS \
  "$root/build/bin/distmuon" train "$@"
