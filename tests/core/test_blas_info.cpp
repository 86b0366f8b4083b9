// Which OpenBLAS core suits a CPU (recommended_blas_core, a pure function of the core name and the
// CPUID features), the self-check of the kernels in use, and the summary line the reports print.
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>

#include "distmuon/blas_info.h"
#include "distmuon/compute.h"

namespace distmuon {
namespace {

CpuFeatures x86(const std::string& vendor, const std::string& isa) {
  CpuFeatures f;
  f.vendor = vendor;
  f.family = 6;
  f.avx = isa == "avx" || isa == "avx2" || isa == "avx512";
  f.avx2 = f.fma = isa == "avx2" || isa == "avx512";
  f.avx512f = f.avx512vl = f.avx512bw = f.avx512dq = f.avx512cd = isa == "avx512";
  return f;
}

std::string recommended(std::string_view core, const CpuFeatures& cpu) {
  return recommended_blas_core(core, cpu).value_or("none");
}

TEST(RecommendedBlasCore, GenericCoreOnAvx512GetsSkylakeX) {
  // The case of the report: OpenBLAS 0.3.21 does not know family 6 model 207 and runs Prescott.
  CpuFeatures emerald_rapids = x86("intel", "avx512");
  emerald_rapids.model = 207;
  EXPECT_EQ(recommended("Prescott", emerald_rapids), "SkylakeX");
  for (const char* generic : {"Katmai", "Core2", "Penryn", "Nehalem", "Atom", "Barcelona"})
    EXPECT_EQ(recommended(generic, emerald_rapids), "SkylakeX") << generic;
  // AVX and AVX2 cores below what the CPU runs.
  EXPECT_EQ(recommended("Sandybridge", emerald_rapids), "SkylakeX");
  EXPECT_EQ(recommended("Haswell", emerald_rapids), "SkylakeX");
  EXPECT_EQ(recommended("Zen", x86("amd", "avx512")), "SkylakeX");
}

TEST(RecommendedBlasCore, RightOrBetterCoreGetsNothing) {
  for (const char* core : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    EXPECT_EQ(recommended(core, x86("intel", "avx512")), "none") << core;
  EXPECT_EQ(recommended("Haswell", x86("intel", "avx2")), "none");
  EXPECT_EQ(recommended("Zen", x86("amd", "avx2")), "none");
  EXPECT_EQ(recommended("Sandybridge", x86("intel", "avx")), "none");
  EXPECT_EQ(recommended("Prescott", x86("intel", "sse")), "none");
  EXPECT_EQ(recommended("Nehalem", x86("intel", "sse")), "none");
  // A core above what the features say (OPENBLAS_CORETYPE forced it) is not "fixed" downwards.
  EXPECT_EQ(recommended("SkylakeX", x86("intel", "avx2")), "none");
}

TEST(RecommendedBlasCore, NamesAreCaseInsensitiveAsOpenBlasReadsThem) {
  // Non-DYNAMIC_ARCH builds report their compile-time core in capitals.
  EXPECT_EQ(recommended("PRESCOTT", x86("intel", "avx512")), "SkylakeX");
  EXPECT_EQ(recommended("skylakex", x86("intel", "avx512")), "none");
  EXPECT_EQ(recommended("HASWELL", x86("intel", "avx2")), "none");
}

TEST(RecommendedBlasCore, AvxLevelsPickTheirCore) {
  EXPECT_EQ(recommended("Prescott", x86("intel", "avx2")), "Haswell");
  EXPECT_EQ(recommended("Prescott", x86("other", "avx2")), "Haswell");
  EXPECT_EQ(recommended("Barcelona", x86("amd", "avx2")), "Zen");
  EXPECT_EQ(recommended("Barcelona", x86("hygon", "avx2")), "Zen");
  EXPECT_EQ(recommended("Prescott", x86("intel", "avx")), "Sandybridge");
  EXPECT_EQ(recommended("Nehalem", x86("amd", "avx")), "Sandybridge");
}

TEST(RecommendedBlasCore, PartialFeatureSetsStayBelow) {
  // AVX-512F and CD without VL/BW/DQ (Knights Landing): OpenBLAS's SkylakeX kernels need VL.
  CpuFeatures knl = x86("intel", "avx2");
  knl.avx512f = knl.avx512cd = true;
  EXPECT_EQ(recommended("Prescott", knl), "Haswell");
  EXPECT_EQ(recommended("Haswell", knl), "none");
  // AVX2 without FMA is not enough for the Haswell kernels.
  CpuFeatures no_fma = x86("intel", "avx2");
  no_fma.fma = false;
  EXPECT_EQ(recommended("Prescott", no_fma), "Sandybridge");
}

TEST(RecommendedBlasCore, UnknownCoresAndCpusGetNothing) {
  const CpuFeatures avx512 = x86("intel", "avx512");
  for (const char* core : {"", "Unknown", "NEOVERSEN1", "ARMV8", "POWER10", "SomeFutureLake"})
    EXPECT_EQ(recommended(core, avx512), "none") << core;
  EXPECT_EQ(recommended("Prescott", CpuFeatures{}), "none");  // not x86-64: no vendor
}

TEST(BlasInfo, ThisMachineIsConsistent) {
  const BlasInfo info = blas_info();
  EXPECT_FALSE(info.core.empty());
  EXPECT_EQ(info.core, blas_core());
  EXPECT_EQ(info.threads, blas_threads());
  EXPECT_EQ(info.library.rfind("OpenBLAS", 0), 0u) << info.config;
  // The warning is there exactly when a better core exists that OPENBLAS_CORETYPE could select
  // or that this build cannot reach; its text names the fix.
  const auto better = recommended_blas_core(info.core, cpu_features());
  const auto warning = blas_core_warning();
  EXPECT_EQ(better.has_value(), warning.has_value());
  if (warning) {
    EXPECT_NE(warning->find(info.core), std::string::npos) << *warning;
    EXPECT_NE(warning->find(*better), std::string::npos) << *warning;
  }
}

TEST(BlasInfo, SummaryNamesLibraryCoreAndThreads) {
  const BlasInfo info = blas_info();
  const std::string s = blas_summary();
  const std::regex line(R"(OpenBLAS [0-9.]+\S*, core (\S+), ([0-9]+) threads?( \(.*\))?)");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(s, m, line)) << s;
  EXPECT_EQ(m[1].str(), info.core);
  EXPECT_EQ(std::stoi(m[2].str()), info.threads);
}

TEST(BlasInfo, CpuProbeMatchesTheCompiler) {
  const CpuFeatures& f = cpu_features();
#if defined(__x86_64__)
  ASSERT_FALSE(f.vendor.empty());
  EXPECT_GT(f.family, 0);
  // Each level implies the one below (as CPUs and the OS enable them).
  if (f.avx512f) EXPECT_TRUE(f.avx2);
  if (f.avx2) EXPECT_TRUE(f.avx);
#else
  EXPECT_TRUE(f.vendor.empty());
#endif
  EXPECT_EQ(&f, &cpu_features());  // probed once
}

TEST(BlasSelfCheck, KernelsInUsePass) {
  // Whatever core OpenBLAS runs here, its results are within the rounding bound.
  const auto failure = blas_self_check();
  EXPECT_FALSE(failure.has_value()) << *failure;
}

}  // namespace
}  // namespace distmuon
