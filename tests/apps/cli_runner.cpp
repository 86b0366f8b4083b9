#include "cli_runner.h"

#include "test_util.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

namespace distmuon::test {

CliRun run_cli(int np, const std::string& args, const std::filesystem::path& log,
               const std::string& env) {
  // odls_base_sigkill_timeout 0: when ranks exit non-zero, mpirun tears the job down at once
  // instead of waiting about 2 s per failing run.
  const std::string launcher = np > 0
                                   ? fmt::format("{} -np {} {} --mca odls_base_sigkill_timeout 0 ",
                                                 DISTMUON_TEST_MPIEXEC, np, DISTMUON_TEST_MPI_FLAGS)
                                   : "";
  const std::string cmd =
      fmt::format("{}timeout -k 5 60 {}{} {}", env.empty() ? "" : "env " + env + " ", launcher,
                  DISTMUON_CLI, args);
  const CommandRun run = run_command(cmd, log);
  CliRun r{run.exit_code, run.output};
  if (r.exit_code == 124) ADD_FAILURE() << "timed out (a hang?): " << cmd << "\n" << r.output;
  return r;
}

std::filesystem::path fresh_test_dir(const std::string& prefix) {
  const auto dir = std::filesystem::temp_directory_path() /
                   fmt::format("{}_{}_{}", prefix, ::getpid(),
                               ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

nlohmann::json tiny_training_config(const std::filesystem::path& dir, int steps,
                                    std::size_t text_bytes) {
  std::string text;
  while (text.size() < text_bytes)
    text += "free software for all, copies of the licence\n";
  std::ofstream(dir / "text.txt") << text;
  return {{"model", {{"context", 8}, {"embed", 8}, {"hidden", 16}, {"ffn", 64}, {"layers", 1}}},
          {"data", {{"path", (dir / "text.txt").string()}}},
          {"train", {{"steps", steps}, {"batch", 8}, {"eval_every", 2}, {"eval_windows", 16}}}};
}

}  // namespace distmuon::test
