// `distmuon orthogonalize` under mpirun -np 2 / 4 in each TP mode against the in-process NS of
// the whole matrix, and bad inputs that must fail on every rank
// (non-zero exit, no output file, no hang).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cli_runner.h"
#include "distmuon/npy.h"
#include "distmuon/tp.h"
#include "test_util.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;

using RunResult = test::CliRun;

class CliTpOrthogonalize : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::fresh_test_dir("distmuon_cli");
    input_ = test::random_matrix(64, 48, 31);
    write_npy(dir_ / "in.npy", input_.view());
  }
  void TearDown() override { fs::remove_all(dir_); }

  RunResult run(int np, const std::string& args) const {
    return test::run_cli(np, "orthogonalize " + args, dir_ / "log.txt");
  }

  std::string in() const { return (dir_ / "in.npy").string(); }
  std::string out() const { return (dir_ / "out.npy").string(); }

  fs::path dir_;
  Matrix input_;
};

NsOptions options(const std::string& set, bool syrk) {
  NsOptions o;
  o.coefficients = coefficient_set(set);
  o.use_syrk = syrk;
  return o;
}

TEST_F(CliTpOrthogonalize, SingleProcessIsTheLocalNs) {
  const RunResult r = run(0, fmt::format("{} {}", in(), out()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // One summary line: shape, output, coefficients, steps, algorithm, where and how long.
  EXPECT_NE(r.output.find(fmt::format("orthogonalized {}x{} -> {}: quintic x 5 steps, standard NS, "
                                      "one process on cpu in ",
                                      input_.rows(), input_.cols(), out())),
            std::string::npos)
      << r.output;
  const Matrix got = read_npy(out());
  const Matrix ref = newton_schulz(input_.view(), options("quintic", true), cpu_compute());
  EXPECT_EQ(relative_error(got.view(), ref.view()), 0.0);  // the same code on the same data
}

// Tolerance 1e-5 relative (Frobenius), the bound for distributed: the Gram matrices are
// summed over ranks in another order than one BLAS call, which changes fp32 rounding (see
// tests/tp). Duplicated runs the single-process NS on the gathered (bit-exact) matrix with the
// same code and one BLAS thread, so it must give the same bits.
TEST_F(CliTpOrthogonalize, MpiRunsMatchTheSingleProcessResult) {
  struct Case {
    int np;
    std::string mode;
    int dim;
    std::string set;
    bool syrk;
  };
  const Case cases[] = {
      {2, "distributed", 0, "quintic", true}, {2, "distributed", 1, "quintic", true},
      {2, "duplicated", 0, "quintic", true},  {2, "duplicated", 1, "polar_express", false},
      {4, "distributed", 0, "cubic5", false}, {4, "duplicated", 1, "quintic", true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("np {} {} dim {} {} syrk={}", c.np, c.mode, c.dim, c.set, c.syrk));
    fs::remove(out());
    const RunResult r =
        run(c.np, fmt::format("{} {} --tp-mode {} --partition-dim {} --coefficients {} {}", in(),
                              out(), c.mode, c.dim, c.set, c.syrk ? "--syrk" : "--no-syrk"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const Matrix got = read_npy(out());
    const Matrix ref = newton_schulz(input_.view(), options(c.set, c.syrk), cpu_compute());
    const double err = relative_error(got.view(), ref.view());
    EXPECT_LE(err, 1e-5);
    if (c.mode == "duplicated") EXPECT_EQ(err, 0.0);
  }
}

TEST_F(CliTpOrthogonalize, BlockwiseIsNsOfEachShard) {
  const RunResult r =
      run(2, fmt::format("{} {} --tp-mode blockwise --partition-dim 1", in(), out()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<Matrix> shards;
  for (int i = 0; i < 2; ++i)
    shards.push_back(newton_schulz(shard_of(input_.view(), 1, 2, i).view(),
                                   options("quintic", true), cpu_compute()));
  EXPECT_LE(relative_error(read_npy(out()).view(), unshard(shards, 1).view()), 1e-6);
}

// Bad inputs fail on every rank with the reader's reason, a non-zero exit and no output file.
TEST_F(CliTpOrthogonalize, BadInputsFailCleanly) {
  const std::string good = [&] {
    std::ifstream f(in(), std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }();
  const auto write_bad = [&](const std::string& name, std::string bytes) {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
    return (dir_ / name).string();
  };
  std::string wrong_dtype = good, wrong_rank = good;
  wrong_dtype.replace(wrong_dtype.find("<f4"), 3, "<i4");
  wrong_rank.replace(wrong_rank.find("(64, 48)"), 8, "(3072,) ");
  struct Case {
    std::string file, expect;
  };
  const Case cases[] = {
      {write_bad("magic.npy", "\x93NUMPX" + good.substr(6)), "bad magic"},
      {write_bad("dtype.npy", wrong_dtype), "dtype '<i4'"},
      {write_bad("rank.npy", wrong_rank), "rank 1"},
      {write_bad("truncated.npy", good.substr(0, good.size() - 10)), "truncated data"},
      {(dir_ / "missing.npy").string(), "cannot open"},
  };
  for (int np : {0, 2}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(fmt::format("np {} {}", np, c.file));
      const RunResult r = run(np, fmt::format("{} {} --tp-mode distributed", c.file, out()));
      EXPECT_NE(r.exit_code, 0) << r.output;
      EXPECT_NE(r.output.find(c.expect), std::string::npos) << r.output;
      EXPECT_EQ(r.output.find("MPI_ABORT"), std::string::npos)
          << "ranks should agree, not abort: " << r.output;
      EXPECT_FALSE(fs::exists(out()));
    }
  }
}

TEST_F(CliTpOrthogonalize, ShapeThatDoesNotSplitEvenlyFails) {
  write_npy(dir_ / "odd.npy", test::random_matrix(63, 48, 1).view());
  const RunResult r =
      run(2, fmt::format("{} {} --partition-dim 0", (dir_ / "odd.npy").string(), out()));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("does not split into 2 equal shards"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out()));
}

TEST_F(CliTpOrthogonalize, UnwritableOutputFailsOnEveryRank) {
  const std::string bad_out = (dir_ / "no_such_dir" / "out.npy").string();
  const RunResult r = run(2, fmt::format("{} {} --tp-mode distributed", in(), bad_out));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("writing the output"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("MPI_ABORT"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace distmuon
