// What every user of the tool sees first: `--version`, an error agreed on by every rank printed
// once (not once per rank), and no topology line on a machine without an NVIDIA driver.
#include <dlfcn.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "cli_runner.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1))
    ++n;
  return n;
}

TEST(CliBasics, VersionIsTheProjectVersion) {
  const auto dir = test::fresh_test_dir("distmuon_cli_basics");
  const test::CliRun r = test::run_cli(0, "--version", dir / "log.txt");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, std::string("distmuon ") + DISTMUON_PROJECT_VERSION + "\n");
  fs::remove_all(dir);
}

// --version or --help given to one rank only: that rank prints it and ends normally (no
// collective left waiting: the others learn it in the command line's agreement), the others say
// once which rank printed what instead of running their command; no abort, no hang.
TEST(CliBasics, VersionOrHelpOnOneRankIsSaidOnce) {
  const auto dir = test::fresh_test_dir("distmuon_cli_basics");
  const std::string demo = fmt::format("{} demo --rows 64 --cols 64 --reps 1", DISTMUON_CLI);
  const test::CliRun version =
      test::run_cli(1, fmt::format("--version : -np 1 {}", demo), dir / "log.txt");
  EXPECT_EQ(version.exit_code, 1) << version.output;  // the job did not run its command
  EXPECT_NE(version.output.find(std::string("distmuon ") + DISTMUON_PROJECT_VERSION + "\n"),
            std::string::npos)
      << version.output;
  EXPECT_EQ(count(version.output, "distmuon: error"), 1u) << version.output;
  EXPECT_NE(version.output.find("rank 0 of 2 printed the version (--version) and ran nothing"),
            std::string::npos)
      << version.output;
  const test::CliRun help = test::run_cli(
      1, fmt::format("demo --rows 64 --cols 64 --reps 1 : -np 1 {} train --help", DISTMUON_CLI),
      dir / "log.txt");
  EXPECT_EQ(help.exit_code, 1) << help.output;
  EXPECT_NE(help.output.find("Usage:"), std::string::npos) << help.output;
  EXPECT_EQ(count(help.output, "distmuon: error"), 1u) << help.output;
  EXPECT_NE(help.output.find("rank 1 of 2 printed the help (--help) and ran nothing"),
            std::string::npos)
      << help.output;
  for (const test::CliRun* r : {&version, &help}) {
    EXPECT_EQ(r->output.find("MPI_ABORT"), std::string::npos) << r->output;
    EXPECT_EQ(r->output.find("This should be caught"), std::string::npos) << r->output;
  }
  fs::remove_all(dir);
}

TEST(CliBasics, AnErrorOfEveryRankIsPrintedOnce) {
  const auto dir = test::fresh_test_dir("distmuon_cli_basics");
  // Rank 0 cannot read the input; the ranks agree on it and each ends without MPI_Abort.
  const test::CliRun r = test::run_cli(
      2, "orthogonalize " + (dir / "missing.npy").string() + " " + (dir / "out.npy").string(),
      dir / "log.txt");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "distmuon: error"), 1u) << r.output;
  EXPECT_NE(r.output.find("missing.npy"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("MPI_ABORT"), std::string::npos) << r.output;
  // Options every rank finds wrong alike: one message, no abort.
  const test::CliRun demo = test::run_cli(2, "demo --coefficients custom", dir / "log.txt");
  EXPECT_NE(demo.exit_code, 0) << demo.output;
  EXPECT_EQ(count(demo.output, "distmuon: error"), 1u) << demo.output;
  EXPECT_EQ(demo.output.find("MPI_ABORT"), std::string::npos) << demo.output;
  // A mistake on the command line: one message too.
  const test::CliRun bad = test::run_cli(2, "train --tp-mode fastest", dir / "log.txt");
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_EQ(count(bad.output, "fastest"), 1u) << bad.output;
  fs::remove_all(dir);
}

// A check whose outcome differs by rank (the memory each rank has) failing on rank 1 only: the
// ranks agree on it, so rank 0 prints rank 1's reason once and every rank ends without an abort.
// Rank 1 runs under `ulimit -v` 512 MiB (its MPI mappings take a few hundred), which leaves too
// little for the demo's 0.8 GiB estimate; rank 0 has the machine's memory.
TEST(CliBasics, AnErrorOfRankOneOnlyIsPrintedByRankZero) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer maps terabytes of shadow memory: no address-space limit fits";
#endif
  const auto dir = test::fresh_test_dir("distmuon_cli_basics");
  const std::string demo = "demo --rows 4096 --cols 4096 --reps 1";
  const test::CliRun r = test::run_cli(
      1, fmt::format("{} : -np 1 sh -c 'ulimit -v 524288 && exec {} {}'", demo, DISTMUON_CLI, demo),
      dir / "log.txt");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(count(r.output, "distmuon: error"), 1u) << r.output;
  EXPECT_NE(r.output.find("demo failed on rank(s) 1 of 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("demo of a 4096x4096 matrix needs about"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("MPI_ABORT"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

TEST(CliBasics, NoTopologyLineWithoutAnNvidiaDriver) {
  void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (nvml != nullptr) {
    dlclose(nvml);
    GTEST_SKIP() << "an NVIDIA driver is installed here";
  }
  const auto dir = test::fresh_test_dir("distmuon_cli_basics");
  const test::CliRun r = test::run_cli(2, "topology", dir / "log.txt");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("NVML"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("hostname"), std::string::npos) << r.output;
  // The reason is still there for whoever asks for it.
  const test::CliRun debug = test::run_cli(0, "--log-level debug topology", dir / "log.txt");
  EXPECT_NE(debug.output.find("no NVML fabric information"), std::string::npos) << debug.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace distmuon
