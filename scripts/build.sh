#!/usr/bin/env bash
# Configures and builds distmuon (Release) into build/. Installs missing dependencies first.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/install-deps.sh"
# ccache (when installed): paths relative to the checkout, so that this tree's builds share the
# cache (a unity batch names its sources by absolute path: another clone compiles its own).
# The tests' precompiled header (tests/CMakeLists.txt) is cacheable with the sloppiness ccache's
# manual gives for it.
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1 CCACHE_SLOPPINESS=pch_defines,time_macros
# Only distmuon's own configure lines are shown: whether CUDA is on and what its kernels are
# built for (machine code and PTX per architecture), where the Python module goes.
# DISTMUON_WERROR=ON (scripts/test.sh sets it): distmuon's own code with warnings as errors.
# A unity build (DISTMUON_UNITY=OFF turns it off): sources compiled in batches, the heavy headers
# parsed once per batch, in half the time of a file-by-file build from scratch (a change to one
# file recompiles its batch). A name clash between two sources of a batch is a compile error,
# fixed by giving the helpers distinct names or one shared header.
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_UNITY_BUILD="${DISTMUON_UNITY:-ON}" -DDISTMUON_WERROR="${DISTMUON_WERROR:-OFF}" -DPython3_EXECUTABLE="${DISTMUON_VENV:-$root/.venv}/bin/python" | { grep '^-- distmuon' || true; }
cmake --build "$root/build" --parallel "$(nproc)"
