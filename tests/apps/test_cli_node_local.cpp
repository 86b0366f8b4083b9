// Inputs agreed by what they hold (docs/reliability.md, "Bad inputs", rows 154-165). Each rank
// is given its own view of the same paths, as node-local disks give it: a wrapper script run by
// mpirun enters DIR/r<rank> before it starts distmuon, so a relative path (a checkpoint folder, a
// preset, DISTMUON_DATA_DIR) names another file on each rank. Where the views differ every rank
// must end with one agreed error naming the difference, within the time limit (a hang fails as a
// timeout); where they hold the same content, or options equal in meaning, the run must work.
// Also the inputs refused before they are read: a device, a file past its limit, a matrix past
// the memory, a step count past the bound, each within 2 s.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_runner.h"
#include "test_util.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Every message these runs print speaks to the user: no library or type name, no text of the
// standard library's or the JSON parser's exceptions, no crash report.
void expect_plain_messages(const std::string& output) {
  for (const char* internal :
       {"std::", "json.exception", "basic_filebuf", "bad_alloc", "what():", "terminate called",
        "This should be caught", "free():", "munmap_chunk", "MPI_ERR_", "Assertion", "KeyError"}) {
    EXPECT_EQ(output.find(internal), std::string::npos) << internal << " in:\n" << output;
  }
}

class CliNodeLocal : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::fresh_test_dir("distmuon_node_local");
    std::ofstream(dir_ / "tiny.json") << test::tiny_training_config(dir_, 3);
    // view.sh: the rank's own folder DIR/r<rank> as its working directory and data folder.
    write_script("view.sh", fmt::format("cd '{}/r'\"$OMPI_COMM_WORLD_RANK\" || exit 97\n"
                                        "DISTMUON_DATA_DIR=\"$PWD/data\" exec '{}' \"$@\"\n",
                                        dir_.string(), DISTMUON_CLI));
    // argv.sh A B ARGS...: rank 0 runs distmuon ARGS A, the others distmuon ARGS B.
    write_script("argv.sh",
                 fmt::format("if [ \"$OMPI_COMM_WORLD_RANK\" = 0 ]; then a=\"$1\"; else a=\"$2\"; "
                             "fi\nshift 2\nexec '{}' \"$@\" $a\n",
                             DISTMUON_CLI));
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write_script(const std::string& name, const std::string& body) {
    std::ofstream(dir_ / name) << "#!/bin/sh\n" << body;
    fs::permissions(dir_ / name, fs::perms::owner_all);
  }
  // `mpirun -np np PROGRAM ARGS` (np 0: PROGRAM ARGS alone) under a 60 s limit.
  test::CommandRun launch(int np, const std::string& program, const std::string& args) {
    const std::string launcher =
        np > 0 ? fmt::format("{} -np {} {} --mca odls_base_sigkill_timeout 0 ",
                             DISTMUON_TEST_MPIEXEC, np, DISTMUON_TEST_MPI_FLAGS)
               : "";
    const std::string cmd = fmt::format("timeout -k 5 60 {}{} {}", launcher, program, args);
    test::CommandRun run = test::run_command(cmd, dir_ / "out.log");
    if (run.exit_code == 124) ADD_FAILURE() << "timed out (a hang?): " << cmd << "\n" << run.output;
    expect_plain_messages(run.output);
    return run;
  }
  std::string view() const { return (dir_ / "view.sh").string(); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // The view of rank r: DIR/r<r>.
  fs::path rank_dir(int r) const { return dir_ / fmt::format("r{}", r); }

  // A checkpoint of 3 steps written by a run on np ranks with extra options, into DIR/<name>.
  void train(int np, const std::string& name, const std::string& extra) {
    const auto run = launch(
        np, DISTMUON_CLI,
        fmt::format("train --config {} --checkpoint {} {}", path("tiny.json"), path(name), extra));
    ASSERT_EQ(run.exit_code, 0) << run.output;
  }
  // Rank r's view holds the checkpoint DIR/<source> as r<r>/ckpt.
  void place(int r, const std::string& source) {
    fs::create_directories(rank_dir(r));
    fs::copy(dir_ / source, rank_dir(r) / "ckpt", fs::copy_options::recursive);
  }
  // A model preset named "tiny" in rank r's data folder, of the given hidden size.
  void preset(int r, int hidden) {
    fs::create_directories(rank_dir(r) / "data" / "models");
    std::ofstream(rank_dir(r) / "data" / "models" / "tiny.json")
        << json{{"name", "tiny"}, {"hidden", hidden}, {"ffn", 2 * hidden}, {"heads", 2},
                {"kv_heads", 2},  {"layers", 1},      {"vocab", 64}};
  }

  fs::path dir_;
};

// Half the ranks see one run's checkpoint under ckpt, the other half another run's (the same
// step, other options): every rank refuses, naming the differing checkpoint, before the state
// is restored (today: a silent mixture, or a hang in the first step's collectives).
void expect_refused_mix(const test::CommandRun& run) {
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("the ranks read different checkpoints"), std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find("resumed at step"), std::string::npos) << run.output;
}

TEST_F(CliNodeLocal, ResumeRefusesCheckpointsThatDifferBetweenRanksAtTwoRanks) {
  train(2, "a", "");
  train(2, "b", "--tp-mode blockwise");
  // The same content on both ranks: resumed.
  place(0, "a");
  place(1, "a");
  auto run = launch(2, view(), fmt::format("train --config {} --resume ckpt", path("tiny.json")));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("resumed at step 3"), std::string::npos) << run.output;
  fs::remove_all(rank_dir(1) / "ckpt");
  place(1, "b");
  expect_refused_mix(
      launch(2, view(), fmt::format("train --config {} --resume ckpt", path("tiny.json"))));
}

TEST_F(CliNodeLocal, ResumeRefusesCheckpointsThatDifferBetweenRanksAtFourRanks) {
  train(4, "a", "");
  train(4, "b", "--tp-mode blockwise");
  for (int r = 0; r < 4; ++r)
    place(r, r < 3 ? "a" : "b");
  expect_refused_mix(
      launch(4, view(), fmt::format("train --config {} --resume ckpt", path("tiny.json"))));
}

// `bench --model tiny` looks the preset up in each rank's DISTMUON_DATA_DIR: presets of other
// shapes end in one agreed error (today: heap corruption, MPI_ERR_TRUNCATE or an assertion).
TEST_F(CliNodeLocal, BenchModelRefusesPresetsThatDifferBetweenRanks) {
  for (const int np : {2, 4}) {
    for (int r = 0; r < np; ++r)
      preset(r, r == np - 1 ? 48 : 32);
    const auto run = launch(np, view(), "bench --model tiny --reps 1 --warmup 0");
    EXPECT_NE(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("the ranks read different models or profiles"), std::string::npos)
        << run.output;
    EXPECT_NE(run.output.find(fmt::format("rank(s) {} of {}", np - 1, np)), std::string::npos)
        << run.output;
  }
}

// A preset file of 3 MiB named by the same relative path whose copies differ only in the middle:
// the command line's file fingerprints read the whole content (today: the first and last MiB).
// A copy that is only reformatted (other indentation) holds the same JSON and is accepted.
TEST_F(CliNodeLocal, FileFingerprintsCoverTheWholeContent) {
  const std::string pad(3 << 20, 'x');
  for (int r = 0; r < 2; ++r) {
    fs::create_directories(rank_dir(r));
    std::string source = pad;
    if (r == 1) source[source.size() / 2] = 'y';
    std::ofstream(rank_dir(r) / "model.json")
        << json{{"name", "big"}, {"hidden", 32}, {"ffn", 64},   {"heads", 2},
                {"kv_heads", 2}, {"layers", 1},  {"vocab", 64}, {"source", source}}
               .dump(r == 0 ? -1 : 2);
  }
  auto run = launch(2, view(), "bench --model model.json --reps 1 --warmup 0");
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("file bench --model=model.json"), std::string::npos) << run.output;
  // The same JSON, written with other indentation on rank 1: one content.
  std::ofstream(rank_dir(1) / "model.json")
      << json{{"name", "big"}, {"hidden", 32}, {"ffn", 64},   {"heads", 2},
              {"kv_heads", 2}, {"layers", 1},  {"vocab", 64}, {"source", pad}}
             .dump(4);
  run = launch(2, view(), "plan --model model.json --group-size 2");
  EXPECT_EQ(run.exit_code, 0) << run.output;
}

// Options equal in meaning agree: the parsed values are compared, not the text.
TEST_F(CliNodeLocal, OptionsAgreeByTheirParsedValues) {
  for (const int np : {2, 4}) {
    const auto run =
        launch(np, path("argv.sh"), "'--steps 05' '--steps 5' demo --rows 32 --cols 16 --reps 1");
    EXPECT_EQ(run.exit_code, 0) << run.output;
  }
  const auto run = launch(2, path("argv.sh"), "'--steps 05' '--steps 6' demo --rows 32 --cols 16");
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("--steps=6 where rank 0 has demo --steps=5"), std::string::npos)
      << run.output;
}

// A device, a FIFO or a file past its limit is refused before it is read, and so is a matrix
// past the memory or a step count past the bound, each within 2 s, naming the need and the limit.
TEST_F(CliNodeLocal, CostsAreCheckedBeforeTheyArePaid) {
  // A sparse 3 GiB text (no disk space used) and a .npy header claiming 100000 x 100000 floats
  // (40 GB) on a sparse file of that size.
  {
    std::ofstream(dir_ / "big.txt") << "x";
    fs::resize_file(dir_ / "big.txt", std::uintmax_t{3} << 30);
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000), }";
    header.append(64 - (10 + header.size() + 1) % 64, ' ');
    header.push_back('\n');
    std::ofstream npy(dir_ / "huge.npy", std::ios::binary);
    npy << "\x93NUMPY" << '\x01' << '\x00' << static_cast<char>(header.size() & 0xff)
        << static_cast<char>(header.size() >> 8) << header;
    npy.close();
    fs::resize_file(dir_ / "huge.npy", fs::file_size(dir_ / "huge.npy") + 40000000000ull);
  }
  const std::string config = path("tiny.json");
  const struct {
    std::string args, env, needle;
  } cases[] = {
      {"train --config " + config + " --data /dev/zero", "", "is not a regular file"},
      {"train --config /dev/zero", "", "is not a regular file"},
      {"topology", "DISTMUON_TOPOLOGY_FILE=/dev/zero", "is not a regular file"},
      {"train --config " + config + " --data " + path("big.txt"), "", "more than the"},
      {"orthogonalize " + path("huge.npy") + " " + path("o.npy"), "", "GiB available"},
      {"orthogonalize " + path("huge.npy") + " " + path("o.npy") + " --steps 10000000", "",
       "between 1 and 100"},
  };
  for (const auto& c : cases) {
    const auto run = launch(
        0, c.env.empty() ? std::string(DISTMUON_CLI) : "env " + c.env + " " + DISTMUON_CLI, c.args);
    EXPECT_NE(run.exit_code, 0) << c.args << "\n" << run.output;
    EXPECT_NE(run.output.find(c.needle), std::string::npos) << c.args << "\n" << run.output;
    EXPECT_LT(run.seconds, 2.0) << c.args;
  }
}

}  // namespace
}  // namespace distmuon
