#!/usr/bin/env bash
# Creates the project's Python virtual environment (.venv, or $DISTMUON_VENV) and installs
# python/requirements.txt (and python/requirements-cuda.txt, see below) into it from PyPI, only
# when something is missing or of another version. Idempotent and quiet; once installed, it needs no network. Prints nothing on success.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${DISTMUON_VENV:-$root/.venv}"
req="$root/python/requirements.txt"
# With a CUDA compiler whose toolkit lacks cuBLAS, NCCL or cuobjdump, their wheels too (the CUDA
# backend's build needs their headers, test_cuda_fatbin cuobjdump; python/requirements-cuda.txt).
cuda="${CUDAToolkit_ROOT:-/usr/local/cuda}"
if [ -x "$cuda/bin/nvcc" ] && { [ ! -e "$cuda/include/cublas_v2.h" ] || [ ! -e "$cuda/include/nccl.h" ] ||
  [ ! -x "$cuda/bin/cuobjdump" ]; }; then
  merged="$(mktemp)"
  trap 'rm -f "$merged"' EXIT
  cat "$req" "$root/python/requirements-cuda.txt" > "$merged"
  req="$merged"
fi
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
# The requirements already satisfied? (pip's own resolver, offline: no index is asked.)
if "$venv/bin/python" - "$req" <<'PY' 2>/dev/null; then exit 0; fi
import sys
from importlib.metadata import version, PackageNotFoundError
from packaging.requirements import Requirement
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    r = Requirement(line)
    try:
        if not r.specifier.contains(version(r.name), prereleases=True):
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PY
echo "distmuon: installing the Python requirements into $venv" >&2
"$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip packaging >/dev/null
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
