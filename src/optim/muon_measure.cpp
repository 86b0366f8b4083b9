// tp_mode=auto with plan=measure in the optimizer: the candidates of measure_plan.h run on the
// parameters' own layouts and groups, through the same dispatcher Muon::step calls, on scratch
// copies (the weights are not touched).
#include <algorithm>
#include <map>
#include <random>

#include "distmuon/auto_mode.h"
#include "distmuon/measure_plan.h"
#include "optim/muon_impl.h"
#include "plan/candidate_runner.h"

namespace distmuon {
namespace {

// A scratch shard of p's shape with fixed random values (NS time does not depend on them), and
// the copy NS runs on (reset from the source before every run: copy_reset, candidate_runner.h),
// both in compute's memory.
struct Scratch {
  DeviceMatrix source, work;
};

std::shared_ptr<Scratch> scratch_of(const ParamState& p, std::uint64_t seed, Compute& compute) {
  // A batched parameter is measured on one slice (each slice is planned as its own weight).
  const MatrixView w = p.spec.local.row_block(0, p.layout.shard_rows());
  Matrix host(w.rows, w.cols);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist;
  for (float& v : host.values())
    v = dist(rng);
  return std::make_shared<Scratch>(
      Scratch{to_device(compute, host.view()), DeviceMatrix(compute, w.rows, w.cols)});
}

const ScaleFn kUnitScale = [](Index, Index) { return 1.0; };

class MuonTarget final : public MeasureTarget {
 public:
  MuonTarget(Muon::Impl& s, std::span<const std::size_t> params,
             std::span<const std::vector<std::size_t>> buckets)
      : s_(s), params_(params), buckets_(buckets) {}

  MeasureTask weight_task(std::size_t weight, const AutoChoice& choice) override {
    ParamState& p = s_.params[params_[weight]];
    auto d = scratch(weight);
    const NsOptions& ns = choice.algorithm == NsAlgorithm::kGram ? s_.ns_gram : s_.ns;
    return {[this, d, &p, &ns, mode = choice.mode] {
              orthogonalize_shard(d->work.view(), p.layout, p.tp, p.gtp, mode, ns, kUnitScale,
                                  *s_.compute, &s_.workspaces);
              s_.compute->synchronize();
            },
            detail::copy_reset(*s_.compute, {{d->source.view(), d->work.view()}}, d)};
  }

  MeasureTask owner_task(std::size_t bucket, std::span<const NsAlgorithm> algorithms) override {
    struct Run {
      std::vector<std::shared_ptr<Scratch>> data;
      std::vector<detail::ShardedWeight> weights;
      detail::WeightOrthogonalizer orth;  // the step's entry point, its own owner assignments
    };
    auto r = std::make_shared<Run>();
    r->orth = detail::WeightOrthogonalizer({}, false, owner_chunks(s_));  // the step's chunks
    const std::vector<std::size_t>& b = buckets_[bucket];
    detail::ResetCopies copies;
    for (std::size_t i = 0; i < b.size(); ++i) {
      ParamState& p = s_.params[params_[b[i]]];
      r->data.push_back(scratch(b[i]));
      r->weights.push_back(
          {r->data.back()->work.view(), &p.layout, &p.tp, &p.gtp, TpMode::kOwner, algorithms[i]});
      copies.emplace_back(r->data.back()->source.view(), r->data.back()->work.view());
    }
    return {[this, r] {
              r->orth.run(r->weights, s_.ns, kUnitScale, *s_.compute, &s_.workspaces);
              s_.compute->synchronize();
            },
            detail::copy_reset(*s_.compute, std::move(copies), r)};
  }

  std::string device() const override { return s_.compute->name(); }

  double scratch_bytes(std::span<const std::size_t> weights) const override {
    double bytes = 0;
    for (const std::size_t w : weights) {
      const ParamState& p = s_.params[params_[w]];
      const MatrixView v = p.spec.local.row_block(0, p.layout.shard_rows());
      bytes += 2.0 * static_cast<double>(v.rows) * static_cast<double>(v.cols) * sizeof(float);
    }
    return bytes;
  }

 private:
  // One scratch per weight, shared by all its tasks (each run resets its copy from the source).
  std::shared_ptr<Scratch> scratch(std::size_t weight) {
    std::shared_ptr<Scratch>& d = scratch_[weight];
    if (!d) d = scratch_of(s_.params[params_[weight]], weight, *s_.compute);
    return d;
  }

  Muon::Impl& s_;
  std::span<const std::size_t> params_;
  std::span<const std::vector<std::size_t>> buckets_;
  std::map<std::size_t, std::shared_ptr<Scratch>> scratch_;
};

}  // namespace

void plan_auto_modes_by_measuring(Muon::Impl& s, std::span<const std::size_t> todo,
                                  std::span<const AutoKey> keys,
                                  std::span<const std::vector<std::size_t>> buckets) {
  // Buckets as positions in todo (the planner's weights).
  std::vector<std::vector<std::size_t>> at;
  for (const std::vector<std::size_t>& b : buckets) {
    at.emplace_back();
    for (const std::size_t i : b)
      at.back().push_back(
          static_cast<std::size_t>(std::find(todo.begin(), todo.end(), i) - todo.begin()));
  }
  MuonTarget target(s, todo, at);
  MeasurePlanOptions options;
  options.wisdom = s.options.wisdom;
  // The timed runs' collectives are not the step's: keep them out of its statistics (the
  // device intervals marked before them are read first, those of the runs dropped).
  if (s.comm_timer) *s.comm_seconds += s.comm_timer->seconds();
  const double comm = *s.comm_seconds;
  const MeasuredPlan plan =
      plan_by_measuring(s.world, keys, at, target,
                        AutoModeResolver(s.options.profile, s.options.cost_model), options);
  *s.comm_seconds = comm;
  if (s.comm_timer) s.comm_timer->clear();
  s.plan_timed_runs += plan.timed_runs;
  for (std::size_t j = 0; j < todo.size(); ++j) {
    ParamState& p = s.params[todo[j]];
    p.mode = plan.choices[j].mode;
    p.algorithm = plan.choices[j].algorithm;
    p.auto_key = keys[j];
    restore_auto_decision(s, keys[j], plan.choices[j]);
  }
}

std::size_t Muon::plan_timed_runs() const {
  return impl_->plan_timed_runs;
}

}  // namespace distmuon
