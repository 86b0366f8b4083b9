// `distmuon bench --model`: every distinct Muon shape of a model, each TP mode timed on the
// optimizer's code path, against tp_mode=auto's choice.
#include "distmuon/model_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "distmuon/error.h"
#include "distmuon/fsdp.h"
#include "distmuon/topology.h"
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
        "--max-elements if the machine has the memory and time, or pick a smaller model",
        c.model, c.max_elements, fmt::join(big, "; "));
  }
  return {};
}

// Times every mode of one shape: warm-up rounds, then timed rounds, each round running every mode
// once (the order rotating from round to round) on a fresh copy of the shard.
void measure_shape(const Communicator& group, const ModelBenchConfig& config, std::size_t index,
                   ModelBenchShape& shape, Compute& compute) {
  const int g = group.size(), r = group.rank();
  const RowSharding sharding = RowSharding::make(shape.m, shape.n, g);
  shape.shard_rows = sharding.shard_rows;
  shape.pad = sharding.pad_length;
  Matrix full(shape.m, shape.n);
  std::mt19937_64 rng(config.seed + index);
  std::normal_distribution<float> dist;
  for (float& v : full.values())
    v = dist(rng);
  const Matrix shard = row_shard(full.view(), sharding, r);
  Matrix work(shard.rows(), shard.cols());
  detail::ShardLayout layout;
  layout.m = shape.m;
  layout.n = shape.n;
  layout.gtp_size = g;
  layout.gtp_rank = r;
  layout.pad = sharding.pad_length;
  const Communicator tp = local_communicator();
  const detail::ScaleFn unit_scale = [](Index, Index) { return 1.0; };

  const std::size_t k = config.modes.size();
  std::vector<std::vector<double>> samples(k);
  const int rounds = config.timing.warmup + config.timing.reps;
  for (int round = 0; round < rounds; ++round) {
    for (std::size_t j = 0; j < k; ++j) {
      const std::size_t mi = (j + static_cast<std::size_t>(round)) % k;
      const TpMode mode = config.modes[mi];
      const TimingSummary t = time_on_group(
          group, {0, 1},
          [&] {
            detail::orthogonalize_shard(work.view(), layout, tp, group, mode, config.ns, unit_scale,
                                        compute);
          },
          [&] { copy(shard.view(), work.view()); });
      if (round >= config.timing.warmup) samples[mi].push_back(t.median_s);
    }
  }
  for (std::size_t mi = 0; mi < k; ++mi)
    shape.modes.push_back({config.modes[mi], summarize(std::move(samples[mi]))});
}

}  // namespace

double ModelBenchShape::median_s(TpMode mode) const {
  for (const ModelBenchMode& m : modes)
    if (m.mode == mode) return m.time.median_s;
  throw Error(fmt::format("model bench: mode {} was not measured for {}", to_string(mode),
                          shape_str(m, n)));
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
  const HardwareProfile* profile = rep.has_profile ? &*resolver->profile() : nullptr;

  for (std::size_t i = 0; i < shapes.size(); ++i) {
    ModelBenchShape& s = shapes[i];
    s.key = AutoKey{.m = s.m,
                    .n = s.n,
                    .group_size = group.size(),
                    .partition_dim = 0,
                    .crosses_domain = rep.crosses_domain,
                    .steps = config.ns.steps,
                    .use_syrk = config.ns.use_syrk,
                    .elem_size = 4};
    s.estimate = estimate(s.key, profile, resolver->cost_model());
    s.auto_mode = group.size() > 1 ? resolver->resolve(s.key, group) : s.estimate.choice;
    measure_shape(group, config, i, s, compute);
    const double dup = s.median_s(TpMode::kDuplicated), dist = s.median_s(TpMode::kDistributed);
    s.fastest = dist < dup ? TpMode::kDistributed : TpMode::kDuplicated;
    const double best = std::min(dup, dist);
    const double chosen = s.median_s(s.auto_mode);
    s.regret = chosen / best - 1;

    const auto c = static_cast<double>(s.count);
    ModelBenchTotals& t = rep.totals;
    t.duplicated_s += c * dup;
    t.distributed_s += c * dist;
    t.auto_s += c * chosen;
    t.oracle_s += c * best;
    if (rep.has_profile) {
      t.predicted_duplicated_s += c * s.estimate.duplicated.seconds();
      t.predicted_distributed_s += c * s.estimate.distributed.seconds();
      t.predicted_auto_s += c * s.estimate.cost(s.auto_mode);
    }
  }
  rep.shapes = std::move(shapes);
  return rep;
}

}  // namespace distmuon
