// What `bench --model` predicts for owner mode on its schedules and for the model's weights
// replicated over the ranks (src/bench/model_bench_prediction.h) is what the simulation of the
// same one-machine placement prices (`plan --parallel`), for the serial and the pipelined
// schedule, the fp32 and the bf16 wire, with and without an emulated link; and the schedule's
// timeline on a case worked out by hand. Pure functions: no timing. Tolerance: relative 1e-9 (the
// same terms summed in another order).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "bench/model_bench_prediction.h"
#include "distmuon/cost_model.h"
#include "distmuon/error.h"
#include "distmuon/layout.h"
#include "distmuon/model_preset.h"
#include "distmuon/placement.h"
#include "distmuon/step_simulation.h"

namespace distmuon {
namespace {

void expect_close(double got, double want, const std::string& what) {
  EXPECT_NEAR(got, want, 1e-9 * std::abs(want)) << what;
}

// A calibrated 2-rank profile (a CPU's figures): the products, the copies and the exchanges at
// measured rates, so that every term of the schedule counts.
// A profile of one 2-rank domain at these rates.
HardwareProfile profile(const char* name, double tflops, double gbps, double latency_us) {
  HardwareProfile p;
  p.name = name;
  p.peak_tflops_bf16 = p.peak_tflops_fp32 = tflops;
  p.intra_domain_gbps = p.inter_domain_gbps = gbps;
  p.intra_domain_latency_us = p.inter_domain_latency_us = latency_us;
  p.domain_size = 2;
  p.source = "test";
  return p;
}

HardwareProfile calibrated() {
  HardwareProfile p = profile("calibrated", 0.2, 10, 1);
  Calibration c;
  c.elem_size = 4;
  c.group_size = 2;
  c.gram_syrk = {{128, 2048}, {128, 2048}, {{40, 60}, {50, 70}}};
  c.update_gemm = {{128, 2048}, {128, 2048}, {{60, 80}, {70, 90}}};
  c.elementwise = {1.5, 1, 2, 0.5};  // G elements/s: sum_squares, scale (copies), axpby, fill
  c.all_gather = CollectiveFit{0.6, 12};
  c.all_reduce = CollectiveFit{0.4, 6};
  c.host = "host";
  c.date = "2026-01-01T00:00:00Z";
  p.calibration = c;
  return p;
}

SimulationOptions sim_options(const HardwareProfile& p, int buckets, int wire, LinkModel link) {
  SimulationOptions o;
  o.profile = p;
  o.elem_size = 4;  // the CPU's fp32 NS, as bench runs it
  o.buckets = buckets;
  o.wire_elem_size = wire;
  o.link = link;
  return o;
}

const LinkModel kLinks[] = {{}, {50e-6, 0.128e9}};

// bench --model --replicated against `plan --parallel dp=2 --optimizer-sharding none`: every
// rank's NS is duplicated mode's step (nothing sharded, nothing sent), the homes replicated-home's.
TEST(BenchPrediction, ReplicatedRunsAreTheSimulation) {
  const HardwareProfile p = calibrated();
  Parallelism par = parse_parallelism("dp=2");
  par.sharding = OptimizerSharding::kNone;
  const Placement pl(layered_weights(train_default_weights()), par, 2);
  for (const LinkModel& link : kLinks) {
    for (const int pipeline : {1, 4, 8}) {
      const detail::ReplicatedPrediction b = detail::predict_replicated(
          train_default_weights(), NsOptions{}, 2, false, &p, CostModel::kRefined, pipeline, link);
      const std::string what =
          fmt::format("pipeline {}, link {} us", pipeline, link.latency_s * 1e6);
      const StepSimulation serial = simulate_step(pl, sim_options(p, 1, 4, link));
      const StepSimulation fp32 = simulate_step(pl, sim_options(p, pipeline, 4, link));
      const StepSimulation bf16 = simulate_step(pl, sim_options(p, pipeline, 2, link));
      expect_close(b.every_rank_s, fp32.of(StepMode::kDuplicated).seconds(), what + " every rank");
      expect_close(b.home_s, serial.of(StepMode::kReplicatedHome).seconds(), what + " serial");
      expect_close(b.home_pipelined_s, fp32.of(StepMode::kReplicatedHome).seconds(),
                   what + " pipelined");
      expect_close(b.home_bf16_s, bf16.of(StepMode::kReplicatedHome).seconds(), what + " bf16");
      EXPECT_EQ(b.auto_home, fp32.of(StepMode::kAuto).dense_choice == StepMode::kReplicatedHome)
          << what;
      // Over the slow link, the serial schedule's exchange is exposed and pipelining hides part
      // of it.
      if (link.bytes_per_s > 0 && pipeline > 1) EXPECT_LT(b.home_pipelined_s, b.home_s) << what;
    }
  }
}

// bench --model's owner runs against `plan --parallel gtp=2,dp=2`: every weight split by rows
// over both ranks, one bucket, on the run's chunks and link.
TEST(BenchPrediction, OwnerRunsAreTheSimulation) {
  const HardwareProfile p = calibrated();
  const Placement pl(layered_weights(train_default_weights()), parse_parallelism("gtp=2,dp=2"), 2);
  std::vector<AutoKey> keys;  // the bench's: one per weight, count copies per shape
  for (const WeightShape& w : train_default_weights()) {
    keys.insert(keys.end(), static_cast<std::size_t>(w.count),
                auto_key(ShardLayout{.m = w.m, .n = w.n, .gtp_size = 2}, NsOptions{},
                         NsAlgorithm::kStandard, false));
  }
  for (const LinkModel& link : kLinks) {
    double serial = 0;
    for (const int pipeline : {1, 4}) {
      const double b = detail::predict_owner(keys, &p, {pipeline, link});
      const StepSimulation sim = simulate_step(pl, sim_options(p, pipeline, 4, link));
      expect_close(b, sim.of(StepMode::kOwner).seconds(),
                   fmt::format("owner, pipeline {}, link {} us", pipeline, link.latency_s * 1e6));
      if (pipeline == 1) serial = b;
    }
    // Over the slow link the pipelined schedule hides part of the exchanges.
    if (link.bytes_per_s > 0) EXPECT_LT(detail::predict_owner(keys, &p, {4, link}), serial);
  }
  EXPECT_EQ(detail::predict_owner(keys, nullptr, {4, {}}), 0.0);
  EXPECT_THROW(simulate_step(pl, sim_options(p, 1, 4, {-1e-6, 0})), Error);
}

// Owner mode, 2 ranks, 4 equal weights (LPT: 0 and 2 on rank 0, 1 and 3 on rank 1), a datasheet
// profile (no copies) with an exchange that costs next to nothing, and an emulated link of
// latency L and bandwidth B: every gather and scatter of a 2-weight chunk sends one weight's bytes
// W per rank, x = L + W / B. Serial: 2 L + 4 W / B + 2 c (c: one weight's NS). Two chunks: gather
// 0 (x), then chunk 0's NS while gather 1 is in flight, chunk 1's NS once it is in, then its
// scatter: max(x + c, 2 x) + c + x.
TEST(BenchPrediction, TheScheduleByHand) {
  const HardwareProfile p = profile("fast", 0.1, 1e5, 0);
  const AutoKey k = auto_key(ShardLayout{.m = 512, .n = 512, .gtp_size = 2}, NsOptions{},
                             NsAlgorithm::kStandard, false);
  const std::vector<AutoKey> keys(4, k);
  const CostEstimate e = estimate_refined(k, &p);
  const double c = e.cost(TpMode::kOwner), w = 512.0 * 512 * 4;
  for (const LinkModel link : {LinkModel{0.5 * c, w / (0.25 * c)}, LinkModel{2 * c, w / c}}) {
    const double x = link.latency_s + w / link.bytes_per_s;
    const double serial = detail::predict_owner(keys, &p, {1, link});
    const double two = detail::predict_owner(keys, &p, {2, link});
    // The exchange itself: 4 weights' bytes over 1e5 GB/s, negligible against the link.
    EXPECT_NEAR(serial, 2 * link.latency_s + 4 * w / link.bytes_per_s + 2 * c, 1e-6 * serial);
    EXPECT_NEAR(two, std::max(x + c, 2 * x) + c + x, 1e-6 * two);
  }
}

}  // namespace
}  // namespace distmuon
