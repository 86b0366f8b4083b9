// `distmuon bench` end to end under mpirun -np 2 on tiny shapes: one JSON object with a result per
// (shape, mode), and the usage errors.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace distmuon {
namespace {

TEST(CliBench, JsonHasOneResultPerShapeAndMode) {
  const auto dir = test::fresh_test_dir("distmuon_bench");
  const test::CliRun r = test::run_cli(2,
                                       "bench --shape 32x16 --shape 16x32 --partition-dim 1 --reps "
                                       "2 --warmup 0 --rate-reps 1 --json",
                                       dir / "log.txt");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(r.output)) << "not exactly one JSON object:\n"
                                                       << r.output;
  EXPECT_EQ(j.at("group_size"), 2);
  ASSERT_EQ(j.at("results").size(), 6u);
  const char* modes[] = {"blockwise", "duplicated", "distributed"};
  for (std::size_t i = 0; i < 6; ++i) {
    const auto& res = j["results"][i];
    EXPECT_EQ(res.at("m"), i < 3 ? 32 : 16);
    EXPECT_EQ(res.at("n"), i < 3 ? 16 : 32);
    EXPECT_EQ(res.at("partition_dim"), 1);
    EXPECT_EQ(res.at("mode"), modes[i % 3]);
    EXPECT_LE(res.at("min_ms").get<double>(), res.at("median_ms").get<double>());
    EXPECT_LE(res.at("median_ms").get<double>(), res.at("max_ms").get<double>());
    EXPECT_GT(res.at("bound_ms").get<double>(), 0.0);
    EXPECT_GT(res.at("ratio").get<double>(), 0.0);
  }
  EXPECT_GT(j["results"][1].at("sgemm").at("gflops_per_rank").get<double>(), 0.0);
  EXPECT_EQ(j["results"][1].at("collectives").size(), 1u);  // duplicated: one all-gather
  std::filesystem::remove_all(dir);
}

TEST(CliBench, BadArgumentsFail) {
  const auto dir = test::fresh_test_dir("distmuon_bench");
  for (const std::string args :
       {"--shape 33x16", "--shape 4096", "--modes fast", "--partition-dim 2"}) {
    const test::CliRun r = test::run_cli(2, "bench --reps 1 " + args, dir / "log.txt");
    EXPECT_NE(r.exit_code, 0) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("MPI_ABORT"), std::string::npos) << args << "\n" << r.output;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace distmuon
