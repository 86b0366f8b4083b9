// The CLI's BLAS line and its fix for OpenBLAS kernels below what the CPU supports
// (apps/distmuon/blas_fix.cpp). The expected line is derived in this process from the same
// OpenBLAS and CPUID (recommended_blas_core), so the tests hold on a machine whose OpenBLAS picks
// the right core and on one where it falls back. A CPU model that OpenBLAS does not know is shown
// to the CLI by an LD_AUDIT library (cpuid_model_shim.c) where CPUID faulting is available.
#include <gtest/gtest.h>

#if defined(__x86_64__)
#include <asm/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "cli_runner.h"
#include "distmuon/blas_info.h"
#include "distmuon/compute.h"

namespace distmuon::test {
namespace {

struct BlasLine {
  std::string core, chosen;  // chosen: what OpenBLAS picked when distmuon set the core
  int threads = 0;
};

// The "BLAS ..." line of demo, bench and calibrate output.
BlasLine parse_blas_line(const std::string& output) {
  static const std::regex line(
      R"(BLAS:?\s+OpenBLAS \S+, core (\S+), ([0-9]+) threads?( \(OPENBLAS_CORETYPE set by distmuon; OpenBLAS chose (\S+)\))?)");
  std::smatch m;
  if (!std::regex_search(output, m, line)) {
    ADD_FAILURE() << "no BLAS line in:\n" << output;
    return {};
  }
  return {m[1].str(), m[4].str(), std::stoi(m[2].str())};
}

bool user_set_core() {
  return std::getenv("OPENBLAS_CORETYPE") != nullptr;
}

// The core the CLI must end up with, started from the environment of this test.
std::string expected_core(const std::string& chosen_by_openblas) {
  const char* off = std::getenv(kBlasFixOff);
  if (user_set_core() || (off && std::string(off) == "1") || !blas_info().dynamic_arch)
    return chosen_by_openblas;
  return recommended_blas_core(chosen_by_openblas, cpu_features()).value_or(chosen_by_openblas);
}

void expect_line_as_derived(const BlasLine& got) {
  const std::string core = blas_core();  // this process: same library, same CPU, no fix
  EXPECT_EQ(got.core, expected_core(core));
  EXPECT_EQ(got.chosen, got.core == core ? "" : core);
  EXPECT_EQ(got.threads, blas_threads());
}

TEST(CliBlas, DemoPrintsTheCoreItRuns) {
  const auto dir = fresh_test_dir("cli_blas");
  const CliRun r = run_cli(0, "demo --rows 64 --cols 256 --reps 1", dir / "demo.log");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_line_as_derived(parse_blas_line(r.output));
  // The fix, when it ran, leaves no warning behind: the kernels in use are the recommended ones.
  if (!user_set_core()) EXPECT_EQ(r.output.find("[warning]"), std::string::npos) << r.output;
}

TEST(CliBlas, BenchAndCalibrateUnderMpirunPrintIt) {
  const auto dir = fresh_test_dir("cli_blas");
  CliRun r = run_cli(2, "bench --shape 64x128 --modes duplicated --reps 1 --rate-reps 1",
                     dir / "bench.log");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_line_as_derived(parse_blas_line(r.output));

  r = run_cli(2, "bench --shape 64x128 --modes duplicated --reps 1 --rate-reps 1 --json",
              dir / "bench_json.log");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  ASSERT_TRUE(j.contains("blas")) << r.output;
  EXPECT_EQ(j["blas"]["core"], expected_core(blas_core()));
  EXPECT_EQ(j["blas"]["threads"], 1);

  r = run_cli(0,
              "calibrate --out " + (dir / "p.json").string() +
                  " --sizes 32,64 --reps 1 --comm-reps 1 --max-bytes 4096",
              dir / "calibrate.log");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_line_as_derived(parse_blas_line(r.output));
}

TEST(CliBlas, FailedSelfCheckGoesBackOnceAndFinishes) {
  // A re-executed process whose requested core is not the one running (here: none requested)
  // must go back to the original kernels once, say why, and finish normally: no loop.
  if (user_set_core()) GTEST_SKIP() << "OPENBLAS_CORETYPE is set in this environment";
  const auto dir = fresh_test_dir("cli_blas");
  const CliRun r = run_cli(0, "demo --rows 64 --cols 256 --reps 1", dir / "demo.log",
                           std::string(kBlasFixMarker) + "=try:Prescott");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("failed its self-check"), std::string::npos) << r.output;
  const BlasLine got = parse_blas_line(r.output);
  EXPECT_EQ(got.core, blas_core());
  EXPECT_EQ(got.chosen, "");
}

#if defined(__x86_64__)
bool cpuid_faulting_available() {
  if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) return false;
  syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
  return true;
}
#endif

class CliBlasUnknownCpu : public ::testing::Test {
 protected:
  void SetUp() override {
#if defined(__x86_64__)
    if (!DISTMUON_CPUID_SHIM_USABLE) GTEST_SKIP() << "the sanitizers replace the shim's handler";
    if (user_set_core()) GTEST_SKIP() << "OPENBLAS_CORETYPE is set in this environment";
    if (cpu_features().vendor != "intel" || !cpuid_faulting_available())
      GTEST_SKIP() << "needs an Intel CPU with CPUID faulting";
#else
    GTEST_SKIP() << "x86-64 only";
#endif
  }
  // Family 6 model 207 (a Xeon that OpenBLAS 0.3.21 does not know) with the real features.
  const std::string shim = std::string("LD_AUDIT=") + DISTMUON_CPUID_SHIM + " FAKE_CPU_MODEL=207";
};

TEST_F(CliBlasUnknownCpu, WithoutTheFixTheWarningNamesIt) {
  const auto dir = fresh_test_dir("cli_blas");
  const CliRun r = run_cli(0, "demo --rows 64 --cols 256 --reps 1", dir / "off.log",
                           shim + " " + kBlasFixOff + "=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const BlasLine got = parse_blas_line(r.output);
  EXPECT_EQ(got.chosen, "");
  const auto better = recommended_blas_core(got.core, cpu_features());
  if (better) {  // this OpenBLAS does not know the model: the warning says what to set
    EXPECT_NE(r.output.find("[warning] OpenBLAS"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("OPENBLAS_CORETYPE=" + *better), std::string::npos) << r.output;
  } else {
    EXPECT_EQ(r.output.find("[warning]"), std::string::npos) << r.output;
  }
}

TEST_F(CliBlasUnknownCpu, TheFixRunsTheRecommendedKernelsOnEveryRank) {
  const auto dir = fresh_test_dir("cli_blas");
  const CliRun off = run_cli(0, "demo --rows 64 --cols 256 --reps 1", dir / "off.log",
                             shim + " " + kBlasFixOff + "=1");
  ASSERT_EQ(off.exit_code, 0) << off.output;
  const std::string fallback = parse_blas_line(off.output).core;
  const auto better = recommended_blas_core(fallback, cpu_features());

  for (int np : {0, 2}) {
    const CliRun r = run_cli(np, "demo --rows 64 --cols 256 --reps 1",
                             dir / ("fixed" + std::to_string(np) + ".log"), shim);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const BlasLine got = parse_blas_line(r.output);
    EXPECT_EQ(got.core, better.value_or(fallback)) << r.output;
    EXPECT_EQ(got.chosen, better ? fallback : "") << r.output;
    EXPECT_EQ(r.output.find("[warning]"), std::string::npos) << r.output;  // no rank warns
  }
}

}  // namespace
}  // namespace distmuon::test
