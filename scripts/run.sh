#!/usr/bin/env bash
# The main job on its built-in default: installs missing dependencies, builds, and runs it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/build.sh"
exec "$root/build/bin/distmuon" demo "$@"
