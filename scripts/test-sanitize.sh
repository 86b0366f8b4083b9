#!/usr/bin/env bash
# The test suite a second time, built with AddressSanitizer + UndefinedBehaviorSanitizer
# (DISTMUON_SANITIZE=ON, -O1) into build-sanitize/. Any report fails the test that triggered it.
# Skipped here (docs/reliability.md): the package test (it installs the library and builds a
# separate project, which would need the sanitizer runtime too) and the calibrate/bench timing
# tests (label "bench": they measure speed, which the sanitizers change, and are the slowest), and
# the command-line tool with the tests that launch it (the plain pass runs them; the library code
# they exercise is covered here by the library's own tests), and the Python module (an
# uninstrumented interpreter cannot load an ASan-built extension).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/install-deps.sh"
# ccache (when installed): paths relative to the checkout, so any clone of it shares the cache.
# The tests' precompiled header (tests/CMakeLists.txt) is cacheable with the sloppiness ccache's
# manual gives for it.
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1 CCACHE_SLOPPINESS=pch_defines,time_macros
# A unity build (sources compiled in batches: the heavy headers parsed once per batch) takes
# about half the time of a file-by-file one here; a name clash between two sources of a batch is
# a compile error, fixed by giving the helpers distinct names or a shared header.
cmake -S "$root" -B "$root/build-sanitize" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_UNITY_BUILD=ON -DDISTMUON_SANITIZE=ON -DDISTMUON_WERROR=ON -DDISTMUON_ENABLE_CUDA=OFF -DDISTMUON_ENABLE_BENCH=OFF -DDISTMUON_ENABLE_APPS=OFF \
  -DDISTMUON_ENABLE_PYTHON=OFF >/dev/null
cmake --build "$root/build-sanitize" --parallel "$(nproc)"
# Leaks: OpenMPI's libraries keep allocations until exit that LeakSanitizer reports; the
# suppressions name those libraries only, so a leak in distmuon still fails. They match only with
# full stack unwinding on malloc (fast_unwind_on_malloc=0): OpenMPI is built without frame
# pointers, so the fast unwinder stops before reaching its frames.
export ASAN_OPTIONS="abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:fast_unwind_on_malloc=0"
export LSAN_OPTIONS="suppressions=$root/tests/sanitize/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export OPENBLAS_NUM_THREADS=1
cd "$root/build-sanitize"
# A test registered at 2 ranks runs here at 2 ranks only: its 4- and 6-rank runs took half of
# this pass's time; the plain pass runs them. What only they reach (the 2 x 2 TP x GTP grids) is
# then not run under the sanitizers; a test registered only at 4 or more ranks still is
# (docs/reliability.md).
names=$(ctest -N | sed -n 's/^ *Test *#[0-9]*: //p')
skip=()
for name in $names; do
  if [[ $name =~ ^(.*)_np[46]$ ]] && grep -qx "${BASH_REMATCH[1]}_np2" <<< "$names"; then
    skip+=("$name")
  fi
done
skip_regex='^$'
if ((${#skip[@]})); then skip_regex="^($(IFS='|'; echo "${skip[*]}"))\$"; fi
ctest --output-on-failure --timeout 600 --parallel "$(nproc)" -LE '^(package|bench|fault-matrix)$' \
  -E "$skip_regex" "$@"
