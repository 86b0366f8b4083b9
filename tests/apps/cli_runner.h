#pragma once
// Runs the distmuon CLI from a test: single-process or under mpirun -np N, with a time limit so a
// hang fails instead of blocking, output (stdout and stderr) captured.

#include <cstddef>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace distmuon::test {

struct CliRun {
  int exit_code = -1;
  std::string output;
};

// Runs `distmuon ARGS` (np 0: without mpirun); log is where the output is captured; env
// ("NAME=VALUE ...", passed to env(1)) is added to the environment of the launcher and the ranks.
// A run killed by the 60 s limit is reported as a test failure (exit code 124).
CliRun run_cli(int np, const std::string& args, const std::filesystem::path& log,
               const std::string& env = "");

// A fresh, empty temporary directory named after the running test.
std::filesystem::path fresh_test_dir(const std::string& prefix);

// A small training job in dir: writes dir/text.txt (a repeated line, at least text_bytes long) and
// returns the config of a one-layer model on it: `steps` steps of batch 8, validation every 2
// steps on 16 windows.
nlohmann::json tiny_training_config(const std::filesystem::path& dir, int steps,
                                    std::size_t text_bytes = 4000);

}  // namespace distmuon::test
