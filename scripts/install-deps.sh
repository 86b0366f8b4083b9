#!/usr/bin/env bash
# Installs distmuon's build and run dependencies from Debian's registry, only when missing, then
# the Python ones from PyPI into the project's virtual environment (scripts/python-env.sh).
# Idempotent, quiet, non-interactive. Needs root (or sudo) only when something is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libopenblas-dev liblapacke-dev libdnnl-dev
  openmpi-bin libopenmpi-dev
  libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  gnuplot-nox ccache
  python3-dev python3-venv
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "distmuon: installing missing packages: ${missing[*]}" >&2
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then
    sudo_cmd=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
bash "$(dirname "${BASH_SOURCE[0]}")/python-env.sh"
