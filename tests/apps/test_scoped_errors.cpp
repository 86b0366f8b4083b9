// How a program ends its ranks after a CollectiveError (docs/reliability.md, "Failures and their
// scope"): scoped_error_program runs Muon (tp_mode auto) on a 2 x 2 TP x GTP layout at 4 ranks.
// With a topology file that lacks rank 3's entry, the domain probe fails on rank 3, agreed over
// the world: every rank ends normally, the error said once. With a check that fails in the GTP
// group {1, 3} only, ranks 0 and 2 wait for ranks 1 and 3 in the step: the program aborts the job.
// Every rank must end within the limit, with the error printed.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "test_util.h"

namespace {

namespace fs = std::filesystem;

using ProgramRun = distmuon::test::CommandRun;

// `mpirun -np 4 scoped_error_program [argument]` with DISTMUON_TOPOLOGY_FILE=topology, stopped
// after 30 s (exit code 124, or 137 when it had to be killed: a hang).
ProgramRun run_program(const fs::path& dir, const std::string& topology,
                       const std::string& argument = "") {
  const fs::path file = dir / "topology.json", log = dir / "out.txt";
  std::ofstream(file) << topology;
  const std::string cmd = fmt::format(
      "DISTMUON_TOPOLOGY_FILE='{}' timeout -k 5 30 {} -np 4 --oversubscribe --bind-to none -x "
      "DISTMUON_TOPOLOGY_FILE --mca odls_base_sigkill_timeout 0 {} {}",
      file.string(), DISTMUON_MPIEXEC, SCOPED_ERROR_PROGRAM, argument);
  return distmuon::test::run_command(cmd, log);
}

fs::path fresh_dir() {
  const fs::path dir = fs::temp_directory_path() /
                       fmt::format("distmuon_scoped_errors_{}_{}", ::getpid(),
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

constexpr const char* kEveryEntry = R"({"ranks": [{"rank": 0, "domain": "a"},
                                                {"rank": 1, "domain": "a"},
                                                {"rank": 2, "domain": "a"},
                                                {"rank": 3, "domain": "a"}]})";

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++n;
  return n;
}

TEST(ScopedErrors, AProbeFailingOnOneRankEndsEveryRankWithOneError) {
  const fs::path dir = fresh_dir();
  const ProgramRun r = run_program(dir, R"({"ranks": [{"rank": 0, "domain": "a"},
                                               {"rank": 1, "domain": "a"},
                                               {"rank": 2, "domain": "a"}]})");
  EXPECT_TRUE(r.exit_code != 124 && r.exit_code != 137)
      << "a rank was left waiting (killed after 30 s):\n"
      << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.seconds, 30.0) << r.output;
  // Agreed over the world: said once (by rank 0), no abort (mpirun then says that a process
  // returned a non-zero status, its own text).
  EXPECT_EQ(count_of(r.output, "distmuon: error"), 1u) << r.output;
  EXPECT_NE(r.output.find("distmuon: error: tp_mode=auto: NVLink-domain probe failed on rank(s) 3 "
                          "of 4: topology file"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("no entry for rank 3"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("the job is aborted"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

TEST(ScopedErrors, AnErrorOfOneGtpGroupAbortsTheJob) {
  const fs::path dir = fresh_dir();
  const ProgramRun r = run_program(dir, kEveryEntry, "gtp-check");
  EXPECT_TRUE(r.exit_code != 124 && r.exit_code != 137)
      << "a rank was left waiting (killed after 30 s):\n"
      << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(r.seconds, 30.0) << r.output;
  EXPECT_NE(r.output.find("world rank 3's check"), std::string::npos) << r.output;
  // Said with its scope: the GTP group of world ranks 1 and 3, not the world.
  EXPECT_NE(r.output.find("agreed by ranks 1,3 of 4, not by every rank: the job is aborted"),
            std::string::npos)
      << r.output;
  fs::remove_all(dir);
}

// The control: the same program with every rank's entry runs its step and ends normally.
TEST(ScopedErrors, TheSameLayoutWithEveryEntrySteps) {
  const fs::path dir = fresh_dir();
  const ProgramRun r = run_program(dir, kEveryEntry);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step done"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

}  // namespace
