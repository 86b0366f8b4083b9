// `distmuon` re-executes itself with OPENBLAS_CORETYPE when OpenBLAS runs kernels below what the
// CPU supports. The steps, recorded in DISTMUON_BLAS_FIX so that each happens at most once:
//   (unset)      recommended_blas_core() names a better core and OPENBLAS_CORETYPE is unset:
//                set it and DISTMUON_BLAS_FIX=try:CHOSEN, then execv(/proc/self/exe).
//   try:CHOSEN   OpenBLAS must now run the requested core and pass blas_self_check(): then
//                DISTMUON_BLAS_FIX=done:CHOSEN (the reports say so); otherwise unset
//                OPENBLAS_CORETYPE, DISTMUON_BLAS_FIX=failed:CHOSEN:WHY and execv again.
//   done:, failed:  nothing more (the library warns after a failure).
#include "blas_fix.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "distmuon/blas_info.h"
#include "distmuon/error.h"

namespace distmuon::cli {
namespace {

constexpr const char* kCoreType = "OPENBLAS_CORETYPE";
constexpr const char* kSelf = "/proc/self/exe";

void set_env(const char* name, const std::string& value) {
  if (::setenv(name, value.c_str(), 1) != 0) {
    throw Error(fmt::format("setenv {}={}: {}", name, value, std::strerror(errno)));
  }
}

bool same_core(std::string a, std::string b) {
  for (auto* s : {&a, &b})
    for (char& c : *s)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return a == b;
}

}  // namespace

nlohmann::json blas_json() {
  const BlasInfo info = blas_info();
  return {{"library", info.library},
          {"core", info.core},
          {"threads", info.threads},
          {"summary", blas_summary()}};
}

void fix_blas_core(char** argv) {
  const char* off = std::getenv(kBlasFixOff);
  if (off != nullptr && std::string(off) == "1") return;
  const char* marker_env = std::getenv(kBlasFixMarker);
  const std::string marker = marker_env ? marker_env : "";
  const char* user_core = std::getenv(kCoreType);

  if (marker.starts_with("try:")) {
    // The re-executed process: keep the requested kernels only if they run and compute right.
    const std::string chosen = marker.substr(4);
    const std::string requested = user_core ? user_core : "";
    const std::string running = blas_core();
    std::optional<std::string> failure;
    if (!same_core(running, requested)) {
      failure = fmt::format("OpenBLAS runs {}, not the requested {}", running, requested);
    } else {
      failure = blas_self_check();
    }
    if (!failure) {
      set_env(kBlasFixMarker, "done:" + chosen);
      return;
    }
    spdlog::warn("BLAS: OPENBLAS_CORETYPE={} failed its self-check ({}); going back to {}",
                 requested, *failure, chosen);
    if (::unsetenv(kCoreType) != 0)
      throw Error(fmt::format("unsetenv {}: {}", kCoreType, std::strerror(errno)));
    set_env(kBlasFixMarker, fmt::format("failed:{}:{}", chosen, *failure));
    ::execv(kSelf, argv);
    throw Error(
        fmt::format("BLAS kernels {} failed their self-check and execv({}) to run without "
                    "them failed: {}; run with {}=1 or set {} yourself",
                    requested, kSelf, std::strerror(errno), kBlasFixOff, kCoreType));
  }
  if (!marker.empty() || user_core != nullptr) return;  // done, failed, or the user's choice

  const std::string core = blas_core();
  const auto better = recommended_blas_core(core, cpu_features());
  if (!better) return;
  if (!blas_info().dynamic_arch)
    return;  // OPENBLAS_CORETYPE would change nothing; the library warns
  set_env(kCoreType, *better);
  set_env(kBlasFixMarker, "try:" + core);
  ::execv(kSelf, argv);
  // Not fatal: carry on with the kernels OpenBLAS chose (the library warns at the first BLAS call).
  const int err = errno;
  ::unsetenv(kCoreType);
  ::unsetenv(kBlasFixMarker);
  spdlog::warn("BLAS: could not re-execute {} with {}={}: {}", kSelf, kCoreType, *better,
               std::strerror(err));
}

}  // namespace distmuon::cli
