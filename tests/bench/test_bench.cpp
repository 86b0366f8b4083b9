// Benchmark building blocks: summaries, timing across a group (slowest rank), rate measurements
// and the TP benchmark's bookkeeping on tiny shapes (timings themselves are not asserted).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include <nlohmann/json.hpp>

#include "distmuon/bench.h"
#include "distmuon/error.h"
#include "test_util.h"

namespace distmuon {
namespace {

using test::world;

TEST(Bench, SummaryOfSamples) {
  const TimingSummary odd = summarize({3.0, 1.0, 2.0});
  EXPECT_EQ(odd.median_s, 2.0);
  EXPECT_EQ(odd.min_s, 1.0);
  EXPECT_EQ(odd.max_s, 3.0);
  EXPECT_EQ(odd.samples_s, (std::vector<double>{3.0, 1.0, 2.0}));  // in run order
  EXPECT_EQ(summarize({4.0, 1.0, 2.0, 3.0}).median_s, 2.5);
  EXPECT_EQ(summarize({}).median_s, 0.0);
}

TEST(Bench, RunTimeIsTheSlowestRanks) {
  // Only the last rank sleeps; every rank must report at least its 20 ms for every run.
  const Communicator& w = world();
  int runs = 0, prepared = 0;
  const TimingSummary t = time_on_group(
      w, {2, 3},
      [&] {
        ++runs;
        if (w.rank() == w.size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      },
      [&] { ++prepared; });
  EXPECT_EQ(runs, 5);
  EXPECT_EQ(prepared, 5);
  ASSERT_EQ(t.samples_s.size(), 3u);
  EXPECT_GE(t.min_s, 0.019);
  EXPECT_THROW(time_on_group(w, {0, 0}, [] {}), Error);
}

TEST(Bench, CollectiveRatesFollowNcclTestsConventions) {
  const Communicator& w = world();
  const double g = w.size();
  const auto bytes = static_cast<std::size_t>(4096 * w.size());
  const CollectiveRate ag =
      measure_collective(w, CollectiveKind::kAllGather, DType::kF32, bytes, {1, 3});
  EXPECT_EQ(ag.bytes, bytes);
  EXPECT_DOUBLE_EQ(ag.alg_bw, static_cast<double>(bytes) / ag.time.median_s);
  EXPECT_DOUBLE_EQ(ag.bus_bw, ag.alg_bw * (g - 1) / g);
  const CollectiveRate ar =
      measure_collective(w, CollectiveKind::kAllReduce, DType::kF64, 8, {1, 3});
  EXPECT_DOUBLE_EQ(ar.bus_bw, ar.alg_bw * 2 * (g - 1) / g);
  EXPECT_THROW(measure_collective(w, CollectiveKind::kAllReduce, DType::kF32, 6, {1, 1}), Error);
  if (w.size() > 1)
    EXPECT_THROW(measure_collective(w, CollectiveKind::kAllGather, DType::kF32, 4, {1, 1}), Error);
}

TEST(Bench, SgemmRateIsFlopsOverMedianTime) {
  const GemmRate r = measure_sgemm(world(), 64, 32, 48, {1, 3}, cpu_compute());
  EXPECT_DOUBLE_EQ(r.flops_per_s, 2.0 * 64 * 32 * 48 / r.time.median_s);
}

TEST(Bench, TpBenchReportsEveryShapeAndModeAgainstItsBound) {
  const Communicator& w = world();
  TpBenchConfig c;
  c.shapes = {{32, 16}, {16, 32}};
  c.partition_dim = 0;
  c.timing = {0, 2};
  c.rate_timing = {0, 1};
  const TpBenchReport rep = run_tp_bench(w, c, cpu_compute());
  const double c_steps = c.ns.steps;
  ASSERT_EQ(rep.results.size(), 6u);
  EXPECT_EQ(rep.group_size, w.size());
  for (const TpBenchResult& r : rep.results) {
    SCOPED_TRACE(fmt::format("{} {}", shape_str(r.m, r.n), to_string(r.mode)));
    EXPECT_EQ(r.flops_per_rank, tp_flops(r.m, r.n, w.size(), 0, r.mode, c.ns));
    EXPECT_EQ(r.traffic, tp_traffic(r.m, r.n, w.size(), 0, r.mode, c.ns.steps));
    EXPECT_DOUBLE_EQ(r.compute_bound_s, r.flops_per_rank / r.sgemm.flops_per_s);
    EXPECT_DOUBLE_EQ(r.bound_s, r.compute_bound_s + r.comm_bound_s);
    EXPECT_DOUBLE_EQ(r.ratio, r.time.median_s / r.bound_s);
    // The update product of the local problem: 2 s^2 l FLOPs.
    const double s = static_cast<double>(r.local.gram_dim()),
                 l = static_cast<double>(r.local.long_dim());
    EXPECT_EQ(2.0 * r.sgemm.m * r.sgemm.n * r.sgemm.k, 2.0 * s * s * l);
    // One measurement per distinct message: all-gather for duplicated; the Gram (fp32) and the
    // norm (one double) all-reduces for distributed; nothing at G = 1 or for blockwise.
    const bool sends = w.size() > 1 && r.mode != TpMode::kBlockwise;
    EXPECT_EQ(r.collectives.size(), !sends ? 0u : (r.mode == TpMode::kDuplicated ? 1u : 2u));
    double comm = 0;
    for (const CollectiveRate& c : r.collectives) {
      const double calls =
          c.kind == CollectiveKind::kAllGather ? 1.0 : (c.dtype == DType::kF64 ? 1.0 : c_steps);
      comm += calls * static_cast<double>(c.bytes) / c.alg_bw;
    }
    EXPECT_DOUBLE_EQ(r.comm_bound_s, comm);
    EXPECT_EQ(r.comm_bound_s > 0, sends);
  }
  const nlohmann::json j = to_json(rep);
  EXPECT_EQ(j.at("results").size(), 6u);
  for (const char* key :
       {"m", "n", "partition_dim", "mode", "median_ms", "min_ms", "max_ms", "bound_ms", "ratio"})
    EXPECT_TRUE(j["results"][0].contains(key)) << key;
  EXPECT_NE(format_report(rep).find("distributed"), std::string::npos);
}

TEST(Bench, InvalidConfigurationFailsOnEveryRank) {
  const Communicator& w = world();
  TpBenchConfig c;
  c.shapes = {{w.size() * 8 + 1, 8}};
  c.timing = {0, 1};
  if (w.size() > 1) EXPECT_THROW(run_tp_bench(w, c, cpu_compute()), CollectiveError);
  c.shapes = {{8, 8}};
  c.modes = {TpMode::kAuto};
  EXPECT_THROW(run_tp_bench(w, c, cpu_compute()), CollectiveError);
}

}  // namespace
}  // namespace distmuon
