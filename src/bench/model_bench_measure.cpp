// `distmuon bench --model --plan measure`: the planner's candidates on the benchmark's sharding
// (rows over the whole group, as training shards them), through the optimizer's dispatcher.
#include "bench/model_bench_measure.h"

#include <algorithm>
#include <memory>
#include <random>

#include "distmuon/fsdp.h"
#include "distmuon/layout.h"
#include "plan/candidate_runner.h"
#include "tp/owner_ns.h"

namespace distmuon::detail {
namespace {

// One weight's shard (fixed random values), its copy NS runs on (both in the backend's memory),
// and its layout.
struct Weight {
  DeviceMatrix source, work;
  ShardLayout layout;
};

const ScaleFn kUnitScale = [](Index, Index) { return 1.0; };

class BenchTarget final : public MeasureTarget {
 public:
  BenchTarget(const Communicator& group, const Communicator& tp, const ModelBenchConfig& config,
              std::span<const ModelBenchShape> shapes, Compute& compute, NsWorkspaces& workspaces)
      : group_(group),
        tp_(tp),
        config_(config),
        shapes_(shapes),
        compute_(compute),
        workspaces_(workspaces) {}

  // Every weight's shard and work copy (built by the first task: the planner checks the memory
  // first), and the largest full matrix while they are drawn.
  std::string device() const override { return compute_.name(); }
  double scratch_bytes(std::span<const std::size_t>) const override {
    double bytes = 0, full = 0;
    for (const ModelBenchShape& s : shapes_) {
      const RowSharding sharding = RowSharding::make(s.m, s.n, group_.size());
      const double shard = static_cast<double>(sharding.shard_rows) * static_cast<double>(s.n);
      bytes += 2.0 * sizeof(float) * shard * static_cast<double>(s.count);
      full = std::max(full, sizeof(float) * static_cast<double>(s.m) * static_cast<double>(s.n));
    }
    return bytes + full;
  }

  MeasureTask weight_task(std::size_t weight, const AutoChoice& choice) override {
    std::shared_ptr<Weight> w = weights().at(weight);
    NsOptions ns = config_.ns;
    ns.algorithm = choice.algorithm;
    return {[this, w, ns, mode = choice.mode] {
              orthogonalize_shard(w->work.view(), w->layout, tp_, group_, mode, ns, kUnitScale,
                                  compute_, &workspaces_);
              compute_.synchronize();
            },
            copy_reset(compute_, {{w->source.view(), w->work.view()}}, w)};
  }

  MeasureTask owner_task(std::size_t, std::span<const NsAlgorithm> algorithms) override {
    struct Run {
      std::vector<OwnerOrthogonalizer::Weight> weights;
      std::unique_ptr<OwnerOrthogonalizer> orth;
    };
    auto r = std::make_shared<Run>();
    weights();
    ResetCopies copies;
    for (std::size_t i = 0; i < weights_.size(); ++i) {
      r->weights.push_back(
          {weights_[i]->work.view(), &weights_[i]->layout, &tp_, &group_, algorithms[i]});
      copies.emplace_back(weights_[i]->source.view(), weights_[i]->work.view());
    }
    r->orth = std::make_unique<OwnerOrthogonalizer>(ns_flops_cost(config_.ns));
    return {[this, r] {
              r->orth->run(r->weights, config_.ns, kUnitScale, compute_, &workspaces_);
              compute_.synchronize();
            },
            copy_reset(compute_, std::move(copies))};
  }

 private:
  const std::vector<std::shared_ptr<Weight>>& weights() {
    if (!weights_.empty()) return weights_;
    for (std::size_t i = 0; i < shapes_.size(); ++i) {
      const ModelBenchShape& s = shapes_[i];
      const RowSharding sharding = RowSharding::make(s.m, s.n, group_.size());
      Matrix full(s.m, s.n);
      std::mt19937_64 rng(config_.seed + 1000 + i);
      std::normal_distribution<float> dist;
      for (float& v : full.values())
        v = dist(rng);
      for (Index c = 0; c < s.count; ++c) {
        auto w = std::make_shared<Weight>();
        w->source = to_device(compute_, row_shard(full.view(), sharding, group_.rank()).view());
        w->work = DeviceMatrix(compute_, w->source.rows(), w->source.cols());
        w->layout.m = s.m;
        w->layout.n = s.n;
        w->layout.gtp_size = group_.size();
        w->layout.gtp_rank = group_.rank();
        w->layout.pad = sharding.pad_length;
        weights_.push_back(std::move(w));
      }
    }
    return weights_;
  }

  const Communicator& group_;
  const Communicator& tp_;
  const ModelBenchConfig& config_;
  std::span<const ModelBenchShape> shapes_;
  Compute& compute_;
  NsWorkspaces& workspaces_;
  std::vector<std::shared_ptr<Weight>> weights_;
};

}  // namespace

MeasuredPlan measure_model_plan(const Communicator& group, const Communicator& tp,
                                const ModelBenchConfig& config,
                                std::span<const ModelBenchShape> shapes,
                                std::span<const AutoKey> keys, const AutoModeResolver& resolver,
                                Compute& compute, NsWorkspaces& workspaces) {
  BenchTarget target(group, tp, config, shapes, compute, workspaces);
  std::vector<std::vector<std::size_t>> bucket(1);
  for (std::size_t w = 0; w < keys.size(); ++w)
    bucket[0].push_back(w);
  return plan_by_measuring(group, keys, bucket, target, resolver, config.measure);
}

void add_measured_plan(ModelBenchReport& report, std::span<ModelBenchShape> shapes,
                       const MeasuredPlan& plan) {
  report.plan = PlanMode::kMeasure;
  report.plan_timed_runs = plan.timed_runs;
  for (std::size_t i = 0, w = 0; i < shapes.size();
       w += static_cast<std::size_t>(shapes[i].count), ++i)
    shapes[i].planned = plan.candidates.at(w);
  for (ModelBenchOwner& o : report.owner) {
    for (const MeasuredOwner& m : plan.owner.at(0))
      if (m.algorithms == o.algorithms) o.planned_s = m.seconds;
  }
  report.totals.predicted_auto_s = plan.bucket_seconds.at(0);
}

}  // namespace distmuon::detail
