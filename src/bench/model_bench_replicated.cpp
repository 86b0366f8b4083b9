// bench --model --replicated (model_bench_replicated.h).
#include "bench/model_bench_replicated.h"

#include <algorithm>
#include <memory>
#include <random>

#include "bench/model_bench_prediction.h"
#include "distmuon/agreement.h"
#include "ns/ns_workspaces.h"
#include "plan/candidate_runner.h"
#include "tp/owner_ns.h"

namespace distmuon::detail {
namespace {

// Every weight of the model (count copies of each shape) whole on this rank, as its replicas
// hold it, and one orthogonalizer run over all of them: with dp null every rank runs every
// weight's NS, with dp the homes span the group.
struct ReplicatedRun {
  std::vector<ShardLayout> layouts;
  std::vector<DeviceMatrix> work;
  std::vector<OwnerOrthogonalizer::Weight> weights;
  std::unique_ptr<OwnerOrthogonalizer> orth;
  std::vector<double> samples;
};

// The runs, in the rounds' order.
enum Run { kEveryRank, kHome, kHomePipelined, kHomeBf16, kRuns };

}  // namespace

ModelBenchReplicated run_replicated_bench(const Communicator& group, const ModelBenchConfig& config,
                                          const HardwareProfile* profile, CostModel model,
                                          bool crosses, Compute& compute) {
  const Communicator planes = group.has_data_plane() ? group : compute.data_communicator(group);
  const bool emulated = config.link.latency_s > 0 || config.link.bytes_per_s > 0;
  const Communicator dp = emulated ? emulated_link_communicator(planes, config.link) : planes;
  const Communicator one = compute.data_communicator(local_communicator());
  // The inputs: each shape's full matrix drawn on the host (the same on every rank), uploaded once.
  std::vector<DeviceMatrix> inputs;
  std::vector<std::size_t> input_of;  // per weight
  for (std::size_t i = 0; i < config.weights.size(); ++i) {
    const WeightShape& w = config.weights[i];
    Matrix full(w.m, w.n);
    std::mt19937_64 rng(config.seed + 1000 + i);
    std::normal_distribution<float> dist;
    for (float& v : full.values())
      v = dist(rng);
    inputs.push_back(to_device(compute, full.view()));
    for (Index c = 0; c < w.count; ++c)
      input_of.push_back(i);
  }
  const std::size_t n = input_of.size();
  // The predictions, and the pipelined runs' chunks (--pipeline's, or the cost model's choice).
  const ReplicatedPrediction p =
      predict_replicated(config.weights, config.ns, group.size(), crosses, profile, model,
                         config.pipeline, config.link);
  ReplicatedRun runs[kRuns];
  NsWorkspaces workspaces;
  std::vector<MeasureTask> tasks;
  const ScaleFn unit = [](Index, Index) { return 1.0; };
  for (int r = 0; r < kRuns; ++r) {
    ReplicatedRun& run = runs[r];
    run.layouts.reserve(n);
    ResetCopies copies;
    for (std::size_t w = 0; w < n; ++w) {
      const WeightShape& s = config.weights[input_of[w]];
      ShardLayout l{.m = s.m, .n = s.n};
      if (r != kEveryRank) {
        l.dp_size = group.size();
        l.dp_rank = group.rank();
      }
      run.layouts.push_back(l);
      run.work.emplace_back(compute, s.m, s.n);
      copies.emplace_back(inputs[input_of[w]].view(), run.work.back().view());
    }
    for (std::size_t w = 0; w < n; ++w) {
      run.weights.push_back({run.work[w].view(), &run.layouts[w], &one, &one,
                             NsAlgorithm::kStandard, r != kEveryRank ? &dp : nullptr});
    }
    run.orth = std::make_unique<OwnerOrthogonalizer>(ns_flops_cost(config.ns),
                                                     r == kHomePipelined ? p.pipelined_chunks
                                                     : r == kHomeBf16    ? p.bf16_chunks
                                                                         : 1,
                                                     r == kHomeBf16);
    tasks.push_back({[&run, &config, &compute, &workspaces, unit] {
                       run.orth->run(run.weights, config.ns, unit, compute, &workspaces);
                       compute.synchronize();
                     },
                     copy_reset(compute, std::move(copies))});
  }
  CandidateRounds options{
      config.timing.warmup, config.timing.reps, "bench --model --replicated", {}};
  std::vector<std::vector<double>> timed = run_candidates(group, tasks, options);
  ModelBenchReplicated out;
  out.replicas = group.size();
  out.every_rank = summarize(std::move(timed[kEveryRank]));
  out.home = summarize(std::move(timed[kHome]));
  out.home_pipelined = summarize(std::move(timed[kHomePipelined]));
  out.home_bf16 = summarize(std::move(timed[kHomeBf16]));
  out.pipeline = p.pipelined_chunks;
  out.link = config.link;
  out.homes = runs[kHome].orth->last_owners();
  out.auto_home = p.auto_home;
  out.predicted_every_rank_s = p.every_rank_s;
  out.predicted_home_s = p.home_s;
  out.predicted_home_pipelined_s = p.home_pipelined_s;
  out.predicted_home_bf16_s = p.home_bf16_s;
  // The modes as the optimizer runs them: every rank, or the homes on the pipelined schedule.
  const double best = std::min(out.every_rank.median_s, out.home_pipelined.median_s);
  const double chosen = out.auto_home ? out.home_pipelined.median_s : out.every_rank.median_s;
  out.regret = best > 0 ? chosen / best - 1 : 0.0;
  return out;
}

}  // namespace distmuon::detail
