#!/usr/bin/env bash
# The test command: installs missing dependencies, builds, and runs every test (1, 2 and 4 ranks).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# CI builds distmuon's own code with warnings as errors (DISTMUON_WERROR).
DISTMUON_WERROR=ON bash "$root/scripts/build.sh"
cd "$root/build"
ctest --output-on-failure --timeout 300 --parallel "$(nproc)" "$@"
