#!/usr/bin/env bash
# Fetches the Debian packages that scripts/device-check.sh unpacks on a GPU machine without a
# package registry (it has CUDA, CMake, ninja and PyTorch, maybe nothing else distmuon needs) into
# device-debs/ (git-ignored; about 15 MiB). Run here, on a Debian 12 machine with its registry.
# The list: what a Release build of the library, the gpu tests and the CUDA benchmark needs with
# MPI, the command-line tool and the Python module off (device-check.sh's configuration), and the
# libraries those link. libc6, libgcc-s1 and libstdc++6 are not fetched: any machine with a
# compiler for nvcc has them. libblas.so.3 and liblapack.so.3 (liblapacke's) come from OpenBLAS
# (device-check.sh links them, as Debian's alternatives do).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/device-debs"
packages=(
  libopenblas0-pthread libopenblas-pthread-dev libgfortran5 libquadmath0  # BLAS + LAPACK
  liblapacke liblapacke-dev libtmglib3                                    # LAPACKE
  nlohmann-json3-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9       # JSON, logging
  libgtest-dev libbenchmark-dev libbenchmark1debian                       # tests, benchmarks
)
mkdir -p "$dest"
rm -f "$dest"/*.deb
if ! apt-cache show "${packages[0]}" >/dev/null 2>&1; then apt-get update -qq; fi
(cd "$dest" && apt-get download -q "${packages[@]}")
du -sh "$dest"
ls "$dest"
