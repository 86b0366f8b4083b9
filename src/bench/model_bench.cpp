// `distmuon bench --model`: every distinct Muon shape of a model, each TP mode and NS algorithm
// timed on the optimizer's code path, owner mode over the whole model, against tp_mode=auto's
// plan.
#include "distmuon/model_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "distmuon/error.h"
#include "distmuon/fsdp.h"
#include "distmuon/topology.h"
#include "optim/owner_ns.h"
#include "optim/sharded_ns.h"

namespace distmuon {
namespace {

bool has_mode(const std::vector<TpMode>& modes, TpMode m) {
  return std::find(modes.begin(), modes.end(), m) != modes.end();
}

// The weights grouped by shape (counts summed, names collected), in order of first appearance.
std::vector<ModelBenchShape> distinct_shapes(const std::vector<WeightShape>& weights) {
  std::vector<ModelBenchShape> out;
  for (const WeightShape& w : weights) {
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const ModelBenchShape& s) { return s.m == w.m && s.n == w.n; });
    if (it == out.end()) {
      out.push_back({});
      it = out.end() - 1;
      it->m = w.m;
      it->n = w.n;
    }
    it->count += w.count;
    it->names.push_back(w.name);
  }
  return out;
}

std::string check_config(const ModelBenchConfig& c, const std::vector<ModelBenchShape>& shapes) {
  if (shapes.empty()) return "the model has no Muon weights";
  if (!has_mode(c.modes, TpMode::kDuplicated) || !has_mode(c.modes, TpMode::kDistributed))
    return "the modes must include duplicated and distributed (auto is chosen between them)";
  if (has_mode(c.modes, TpMode::kAuto))
    return "mode auto cannot be benchmarked (it resolves to another mode)";
  if (has_mode(c.modes, TpMode::kOwner))
    return "mode owner is measured over the whole model on its own: leave it out of the modes";
  if (c.max_elements < 1) return fmt::format("max elements {} must be >= 1", c.max_elements);
  try {
    c.ns.validate();
  } catch (const Error& e) {
    return e.what();
  }
  std::vector<std::string> big;
  for (const ModelBenchShape& s : shapes) {
    if (s.m < 1 || s.n < 1 || s.count < 1)
      return fmt::format("invalid weight {} x {}", shape_str(s.m, s.n), s.count);
    if (s.m * s.n > c.max_elements || s.n * s.n > c.max_elements) {
      big.push_back(fmt::format("{} (matrix {}, distributed Gram {} elements)", shape_str(s.m, s.n),
                                s.m * s.n, s.n * s.n));
    }
  }
  if (!big.empty()) {
    return fmt::format(
        "model {} has shapes too large for this benchmark (limit {} elements): {}; raise "
        "--max-elements if the machine has the memory and time, or pick a smaller model (the "
        "default is {})",
        c.model, c.max_elements, fmt::join(big, "; "), kTrainDefaultModel);
  }
  return {};
}

std::vector<NsAlgorithm> algorithms_of(NsAlgorithm a) {
  if (a == NsAlgorithm::kAuto) return {NsAlgorithm::kStandard, NsAlgorithm::kGram};
  return {a};
}

NsOptions with_algorithm(NsOptions ns, NsAlgorithm a) {
  ns.algorithm = a;
  return ns;
}

// One shape's shard on this rank and its layout, rows sharded over the group as training does.
struct ShapeData {
  Matrix shard;
  detail::ShardLayout layout;
};

ShapeData make_shape(const Communicator& group, const ModelBenchConfig& config, std::size_t index,
                     ModelBenchShape& shape) {
  const int g = group.size(), r = group.rank();
  const RowSharding sharding = RowSharding::make(shape.m, shape.n, g);
  shape.shard_rows = sharding.shard_rows;
  shape.pad = sharding.pad_length;
  Matrix full(shape.m, shape.n);
  std::mt19937_64 rng(config.seed + index);
  std::normal_distribution<float> dist;
  for (float& v : full.values())
    v = dist(rng);
  ShapeData d{row_shard(full.view(), sharding, r), {}};
  d.layout.m = shape.m;
  d.layout.n = shape.n;
  d.layout.gtp_size = g;
  d.layout.gtp_rank = r;
  d.layout.pad = sharding.pad_length;
  return d;
}

const detail::ScaleFn kUnitScale = [](Index, Index) { return 1.0; };

// Times every candidate (mode x algorithm) of one shape: warm-up rounds, then timed rounds, each
// round running every candidate once (the order rotating from round to round) on a fresh copy of
// the shard.
void measure_shape(const Communicator& group, const ModelBenchConfig& config, const ShapeData& data,
                   ModelBenchShape& shape, Compute& compute) {
  Matrix work(data.shard.rows(), data.shard.cols());
  const Communicator tp = local_communicator();
  std::vector<ModelBenchMode> candidates;
  for (TpMode mode : config.modes) {
    for (NsAlgorithm a : algorithms_of(config.algorithm))
      candidates.push_back({mode, a, {}});
  }
  const std::size_t k = candidates.size();
  std::vector<std::vector<double>> samples(k);
  const int rounds = config.timing.warmup + config.timing.reps;
  for (int round = 0; round < rounds; ++round) {
    for (std::size_t j = 0; j < k; ++j) {
      const std::size_t ci = (j + static_cast<std::size_t>(round)) % k;
      const NsOptions ns = with_algorithm(config.ns, candidates[ci].algorithm);
      const TimingSummary t = time_on_group(
          group, {0, 1},
          [&] {
            detail::orthogonalize_shard(work.view(), data.layout, tp, group, candidates[ci].mode,
                                        ns, kUnitScale, compute);
          },
          [&] { copy(data.shard.view(), work.view()); });
      if (round >= config.timing.warmup) samples[ci].push_back(t.median_s);
    }
  }
  for (std::size_t ci = 0; ci < k; ++ci) {
    candidates[ci].time = summarize(std::move(samples[ci]));
    shape.modes.push_back(std::move(candidates[ci]));
  }
}

// Times owner mode over every weight of the model (count copies of each shape) with the given
// per-weight algorithms, as Muon::step runs it: one OwnerOrthogonalizer over the bucket.
TimingSummary measure_owner(const Communicator& group, const ModelBenchConfig& config,
                            const std::vector<ModelBenchShape>& shapes,
                            const std::vector<ShapeData>& data,
                            const std::vector<NsAlgorithm>& algorithms, Compute& compute) {
  const Communicator tp = local_communicator();
  std::vector<Matrix> work;
  std::vector<const Matrix*> source;
  std::vector<detail::OwnerOrthogonalizer::Weight> weights;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    for (Index c = 0; c < shapes[i].count; ++c) {
      work.emplace_back(data[i].shard.rows(), data[i].shard.cols());
      source.push_back(&data[i].shard);
    }
  }
  for (std::size_t w = 0, i = 0; i < shapes.size(); ++i) {
    for (Index c = 0; c < shapes[i].count; ++c, ++w)
      weights.push_back({work[w].view(), &data[i].layout, &tp, &group, algorithms.at(w)});
  }
  detail::OwnerOrthogonalizer orth(detail::ns_flops_cost(config.ns));
  std::vector<double> samples;
  const int rounds = config.timing.warmup + config.timing.reps;
  for (int round = 0; round < rounds; ++round) {
    const TimingSummary t = time_on_group(
        group, {0, 1}, [&] { orth.run(weights, config.ns, kUnitScale, compute); },
        [&] {
          for (std::size_t w = 0; w < work.size(); ++w)
            copy(source[w]->view(), work[w].view());
        });
    if (round >= config.timing.warmup) samples.push_back(t.median_s);
  }
  return summarize(std::move(samples));
}

// Auto's plan for every weight (count copies per shape), made on rank 0 and shared.
std::vector<AutoChoice> plan_on_rank0(const Communicator& group, AutoModeResolver& resolver,
                                      const std::vector<AutoKey>& keys) {
  std::vector<std::int64_t> codes(keys.size() + 1, 0);
  std::string failure;
  if (group.rank() == 0) {
    try {
      const BucketPlan plan = resolver.plan(keys);
      for (std::size_t i = 0; i < keys.size(); ++i) {
        codes[i + 1] = static_cast<std::int64_t>(plan.choices[i].mode) * 4 +
                       static_cast<std::int64_t>(plan.choices[i].algorithm);
      }
    } catch (const std::exception& e) {
      codes[0] = -1;
      failure = e.what();
    }
  }
  group.broadcast(std::span<std::int64_t>(codes), 0);
  if (codes[0] != 0) {
    throw CollectiveError(fmt::format("bench --model: rank 0 could not plan tp_mode=auto: {}",
                                      group.broadcast_string(failure, 0)));
  }
  std::vector<AutoChoice> out;
  for (std::size_t i = 0; i < keys.size(); ++i)
    out.push_back(
        {static_cast<TpMode>(codes[i + 1] / 4), static_cast<NsAlgorithm>(codes[i + 1] % 4)});
  return out;
}

}  // namespace

double ModelBenchShape::median_s(TpMode mode, NsAlgorithm algorithm) const {
  for (const ModelBenchMode& c : modes)
    if (c.mode == mode && c.algorithm == algorithm) return c.time.median_s;
  throw Error(fmt::format("model bench: {} was not measured for {}",
                          to_string(AutoChoice{mode, algorithm}), shape_str(m, n)));
}

ModelBenchReport run_model_bench(const Communicator& group, const ModelBenchConfig& config,
                                 Compute& compute) {
  std::vector<ModelBenchShape> shapes = distinct_shapes(config.weights);
  std::string why = check_config(config, shapes);
  std::optional<AutoModeResolver> resolver;
  if (why.empty()) {
    try {
      resolver.emplace(config.profile, config.cost_model);
    } catch (const Error& e) {
      why = e.what();
    }
  }
  group.agree_or_throw(why.empty(), fmt::format("bench --model {}", config.model), why);

  ModelBenchReport rep;
  rep.model = config.model;
  rep.group_size = group.size();
  rep.blas_threads = blas_threads();
  rep.crosses_domain = crosses_domain(group);
  rep.has_profile = resolver->profile().has_value();
  rep.profile = rep.has_profile ? resolver->profile()->name : "none";
  rep.cost_model = to_string(resolver->cost_model());
  rep.coefficients = config.ns.coefficients.name;
  rep.steps = config.ns.steps;
  rep.use_syrk = config.ns.use_syrk;
  rep.timing = config.timing;
  rep.modes = config.modes;
  rep.algorithms = algorithms_of(config.algorithm);
  const HardwareProfile* profile = rep.has_profile ? &*resolver->profile() : nullptr;

  // Keys and auto's plan: one bucket of every weight (count copies per shape).
  std::vector<AutoKey> keys;
  for (ModelBenchShape& s : shapes) {
    s.key = AutoKey{.m = s.m,
                    .n = s.n,
                    .group_size = group.size(),
                    .partition_dim = 0,
                    .crosses_domain = rep.crosses_domain,
                    .steps = config.ns.steps,
                    .use_syrk = config.ns.use_syrk,
                    .elem_size = 4,
                    .algorithm = config.algorithm,
                    .gram_restart = config.ns.gram_restart};
    s.estimate = estimate(s.key, profile, resolver->cost_model());
    keys.insert(keys.end(), static_cast<std::size_t>(s.count), s.key);
  }
  const std::vector<AutoChoice> plan = plan_on_rank0(group, *resolver, keys);
  rep.auto_owner = !plan.empty() && plan.front().mode == TpMode::kOwner;
  std::vector<NsAlgorithm> auto_algorithms;
  for (const AutoChoice& c : plan)
    auto_algorithms.push_back(c.algorithm);

  std::vector<ShapeData> data;
  ModelBenchTotals& t = rep.totals;
  for (std::size_t i = 0, w = 0; i < shapes.size();
       w += static_cast<std::size_t>(shapes[i].count), ++i) {
    ModelBenchShape& s = shapes[i];
    s.auto_choice = plan[w];
    data.push_back(make_shape(group, config, i, s));
    measure_shape(group, config, data.back(), s, compute);
    bool first = true;
    for (const ModelBenchMode& c : s.modes) {
      if (c.mode == TpMode::kBlockwise) continue;  // not exact: never the oracle
      if (first || c.time.median_s < s.median_s(s.fastest.mode, s.fastest.algorithm))
        s.fastest = {c.mode, c.algorithm};
      first = false;
    }
    const double best = s.median_s(s.fastest.mode, s.fastest.algorithm);
    const double chosen =
        rep.auto_owner ? 0 : s.median_s(s.auto_choice.mode, s.auto_choice.algorithm);
    s.regret = rep.auto_owner ? 0 : chosen / best - 1;

    const auto c = static_cast<double>(s.count);
    t.duplicated_s += c * s.median_s(TpMode::kDuplicated, rep.algorithms.front());
    t.distributed_s += c * s.median_s(TpMode::kDistributed, rep.algorithms.front());
    t.auto_s += c * chosen;
    t.per_weight_oracle_s += c * best;
    if (rep.has_profile) {
      t.predicted_duplicated_s +=
          c * s.estimate.of(TpMode::kDuplicated, rep.algorithms.front()).seconds();
      t.predicted_distributed_s +=
          c * s.estimate.of(TpMode::kDistributed, rep.algorithms.front()).seconds();
      if (!rep.auto_owner) t.predicted_auto_s += c * s.estimate.cost(s.auto_choice);
    }
  }
  t.oracle_s = t.per_weight_oracle_s;

  // Owner over the whole model: all standard, all Gram, and auto's mix when it planned another.
  if (group.size() > 1) {
    std::vector<std::pair<std::string, std::vector<NsAlgorithm>>> runs;
    for (NsAlgorithm a : rep.algorithms)
      runs.emplace_back(to_string(AutoChoice{TpMode::kOwner, a}),
                        std::vector<NsAlgorithm>(keys.size(), a));
    if (rep.auto_owner && std::none_of(runs.begin(), runs.end(),
                                       [&](const auto& r) { return r.second == auto_algorithms; }))
      runs.emplace_back("owner (auto's algorithms)", auto_algorithms);
    std::vector<CostEstimate> estimates;
    for (const AutoKey& k : keys)
      estimates.push_back(estimate(k, profile, CostModel::kRefined));
    for (auto& [label, algorithms] : runs) {
      ModelBenchOwner o{label, algorithms, {}, 0};
      o.time = measure_owner(group, config, shapes, data, algorithms, compute);
      if (rep.has_profile) {
        std::vector<AutoKey> pinned = keys;
        for (std::size_t w = 0; w < pinned.size(); ++w)
          pinned[w].algorithm = algorithms[w];
        o.predicted_s = estimate_owner_bucket(pinned, estimates, profile).cost();
      }
      t.oracle_s = std::min(t.oracle_s, o.time.median_s);
      if (rep.auto_owner && algorithms == auto_algorithms) {
        t.auto_s = o.time.median_s;
        t.predicted_auto_s = o.predicted_s;
      }
      rep.owner.push_back(std::move(o));
    }
  }
  rep.shapes = std::move(shapes);
  return rep;
}

}  // namespace distmuon
