#!/usr/bin/env bash
# Configures and builds distmuon (Release) into build/. Installs missing dependencies first.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/install-deps.sh"
# ccache (when installed): paths relative to the checkout, so any clone of it shares the cache.
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPython3_EXECUTABLE="${DISTMUON_VENV:-$root/.venv}/bin/python" >/dev/null
cmake --build "$root/build" --parallel "$(nproc)"
