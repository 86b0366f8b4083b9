#pragma once
// The CLI's fix for OpenBLAS kernels below what the CPU supports (include/distmuon/blas_info.h):
// re-execute this program once with OPENBLAS_CORETYPE set, keep it only after a numerical
// self-check of those kernels, never over a value the user set. See docs/architecture.md.

#include <nlohmann/json.hpp>

namespace distmuon::cli {

// The BLAS in use for --json reports: {"library", "core", "threads", "summary"} (blas_info.h).
nlohmann::json blas_json();

// Called first in main(), before MPI_Init, so that every rank of a job decides alike (same CPU,
// same environment) before any communication. May replace the process image (execv); returns
// when nothing is to be done, when DISTMUON_NO_BLAS_FIX=1, or when the re-execution could not
// happen (then the library's warning names the fix). Throws distmuon::Error when the kernels
// failed their self-check and the process cannot re-execute itself without them.
void fix_blas_core(char** argv);

}  // namespace distmuon::cli
