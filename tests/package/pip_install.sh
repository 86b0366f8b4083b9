#!/usr/bin/env bash
# `pip install SOURCE` into a fresh virtual environment, then import distmuon there and run it:
# the package, its extension and its data folders come from the environment, not the checkout.
# Usage: pip_install.sh PYTHON SOURCE WORK_DIR [PIP_OPTION...] (e.g. --config-settings=...)
set -euo pipefail
python=$1 source=$2 work=$3
shift 3
rm -rf "$work"
"$python" -m venv "$work/venv"
# Build isolation as a user gets it: the build requirements come from PyPI (or pip's cache).
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check "$@" "$source"
cd "$work"  # not the checkout: nothing importable from there
"$work/venv/bin/python" - "$work/venv" <<'PY'
import os, sys
import numpy as np
import distmuon

venv = sys.argv[1]
assert distmuon.__file__.startswith(venv + "/"), distmuon.__file__
assert distmuon._core.__file__.startswith(venv + "/"), distmuon._core.__file__
# Newton-Schulz orthogonalises: the singular values of the result lie near 1 (quintic's band).
x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
s = np.linalg.svd(distmuon.newton_schulz(x), compute_uv=False)
assert 0.6 < s.min() and s.max() < 1.25, s
# The data folders travel in the wheel: the built-in hardware profiles are found there.
assert os.environ["DISTMUON_DATA_DIR"].startswith(venv + "/"), os.environ["DISTMUON_DATA_DIR"]
names = [p["name"] if isinstance(p, dict) else str(p) for p in distmuon.profiles()]
assert names, "no built-in hardware profile"
print(f"pip install: distmuon from {os.path.dirname(distmuon.__file__)}, "
      f"{len(names)} profiles, NS singular values [{s.min():.3f}, {s.max():.3f}]")
PY
