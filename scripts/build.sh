#!/usr/bin/env bash
# Configures and builds distmuon (Release) into build/. Installs missing dependencies first.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/install-deps.sh"
# ccache (when installed): paths relative to the checkout, so any clone of it shares the cache.
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
# Only distmuon's own configure lines are shown: whether CUDA is on and what its kernels are
# built for (machine code and PTX per architecture), where the Python module goes.
# DISTMUON_WERROR=ON (scripts/test.sh sets it): distmuon's own code with warnings as errors.
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DDISTMUON_WERROR="${DISTMUON_WERROR:-OFF}" -DPython3_EXECUTABLE="${DISTMUON_VENV:-$root/.venv}/bin/python" | { grep '^-- distmuon' || true; }
cmake --build "$root/build" --parallel "$(nproc)"
