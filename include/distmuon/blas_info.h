#pragma once
// Which BLAS kernels run, and whether they are the right ones for this CPU.
//
// OpenBLAS built with DYNAMIC_ARCH (Debian's, conda's) picks its kernels from a table of CPU
// models. A model newer than the table (OpenBLAS 0.3.21 on a Xeon of family 6, model 207, say)
// gets the generic "Prescott" kernels: SSE3 only, several times slower than the AVX-512 ones the
// CPU can run. OPENBLAS_CORETYPE, read when OpenBLAS loads, selects a core by name instead.
//
// distmuon compares the core OpenBLAS runs with what CPUID says the CPU supports
// (recommended_blas_core, a pure function), warns once through spdlog when they disagree
// (naming the fix), and the command-line tool re-executes itself once with OPENBLAS_CORETYPE
// set after a numerical self-check of the better kernels (docs/architecture.md, "BLAS kernels").

#include <optional>
#include <string>
#include <string_view>

namespace distmuon {

// What the CPU and the operating system support, from CPUID and XGETBV: a feature counts only
// when the OS saves its registers (AVX-512 needs the ZMM state enabled).
struct CpuFeatures {
  std::string vendor;  // "intel", "amd", "hygon", "other"; empty when not x86-64
  int family = 0;      // display family and model (extended fields folded in), as in /proc/cpuinfo
  int model = 0;
  bool avx = false, avx2 = false, fma = false;
  bool avx512f = false, avx512vl = false, avx512bw = false, avx512dq = false, avx512cd = false;
  friend bool operator==(const CpuFeatures&, const CpuFeatures&) = default;
};

// This machine's CPU, probed once.
const CpuFeatures& cpu_features();

// The OpenBLAS core (an OPENBLAS_CORETYPE name) that this CPU's features support when it is
// better than `core`, the one OpenBLAS runs (compared case-insensitively); nothing when `core` is
// as good, or when either is unknown (an ARM core, a core name newer than distmuon knows, a CPU
// that is not x86-64). AVX-512 (F, VL, BW, DQ, CD) gives "SkylakeX"; AVX2 and FMA "Haswell"
// ("Zen" on AMD and Hygon); AVX "Sandybridge".
std::optional<std::string> recommended_blas_core(std::string_view core, const CpuFeatures& cpu);

// The BLAS library as it runs now.
struct BlasInfo {
  std::string library;        // "OpenBLAS 0.3.21" (the first words of openblas_get_config())
  std::string config;         // openblas_get_config() in full
  std::string core;           // openblas_get_corename(): "SkylakeX", "Prescott", ...
  bool dynamic_arch = false;  // built with DYNAMIC_ARCH: OPENBLAS_CORETYPE can choose the core
  int threads = 1;            // BLAS threads of this process (blas_threads())
};
BlasInfo blas_info();
std::string blas_core();  // openblas_get_corename()

// One line for the reports: "OpenBLAS 0.3.21, core SkylakeX, 1 thread", with
// "(OPENBLAS_CORETYPE set by distmuon; OpenBLAS chose Prescott)" when the CLI's fix is in force.
std::string blas_summary();

// The warning distmuon logs when OpenBLAS runs a core below what the CPU supports: the core, the
// CPU, and the fix (OPENBLAS_CORETYPE=..., or another OpenBLAS build when the core cannot be
// switched). Nothing when the core is right, unknown, or was chosen by OPENBLAS_CORETYPE as
// recommended. The library logs it once (spdlog::warn) at its first sgemm or ssyrk.
std::optional<std::string> blas_core_warning();

// Numerical self-check of the kernels OpenBLAS runs now: sgemm (every transpose, alpha and beta)
// and ssyrk through cpu_compute() on odd sizes that cross kernel blocks, against a double
// reference. Tolerance per element: 2 (k + 2) u (|alpha| (|A| |B|)_ij + |beta| |C_ij|) with
// u = 2^-24, twice the classical worst-case rounding bound of a k-term float dot product, so that
// any correct kernel passes and a wrong one (O(1) errors) fails. Returns what failed, or nothing.
std::optional<std::string> blas_self_check();

// Environment variables of the fix (docs/architecture.md): the CLI re-executes itself with
// OPENBLAS_CORETYPE set and kBlasFixMarker recording the step ("try:CORE", "done:CORE",
// "failed:CORE:WHY", CORE being the one OpenBLAS chose), so that it happens at most once;
// kBlasFixOff=1 turns the re-execution off (the warning stays).
inline constexpr const char* kBlasFixMarker = "DISTMUON_BLAS_FIX";
inline constexpr const char* kBlasFixOff = "DISTMUON_NO_BLAS_FIX";

}  // namespace distmuon
