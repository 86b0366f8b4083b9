// What every user of the tool sees first: `--version`, an error agreed on by every rank printed
// once (not once per rank), and no topology line on a machine without an NVIDIA driver.
#include <dlfcn.h>
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
