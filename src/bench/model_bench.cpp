// `distmuon bench --model`: every distinct Muon shape of a model, each TP mode and NS algorithm
// timed on the optimizer's code path, owner mode over the whole model, against tp_mode=auto's
// plan.
#include "distmuon/model_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "bench/model_bench_measure.h"
#include "bench/model_bench_prediction.h"
#include "bench/model_bench_replicated.h"
#include "distmuon/agreement.h"
#include "distmuon/auto_mode.h"
#include "distmuon/error.h"
#include "distmuon/fsdp.h"
#include "distmuon/hardware_profile.h"
#include "distmuon/memory_check.h"
#include "distmuon/topology.h"
#include "ns/ns_workspaces.h"
#include "plan/candidate_runner.h"
#include "tp/owner_ns.h"
#include "tp/sharded_ns.h"

namespace distmuon {
namespace {

// What run_model_bench read from files, one line per distinct shape and the profile: the text
// the ranks agree on.
std::string model_bench_inputs_text(const std::vector<ModelBenchShape>& shapes,
                                    const std::optional<HardwareProfile>& profile) {
  std::string text;
  for (const ModelBenchShape& s : shapes)
    text += fmt::format("shape {} x{} batch {} ({})\n", shape_str(s.m, s.n), s.count, s.batch,
                        fmt::join(s.names, ","));
  text += "profile " + (profile ? nlohmann::json(*profile).dump() : std::string("none"));
  return text;
}

// The first line of mine that differs from root's, for the agreement's message.
std::string first_differing_line(std::string_view root, std::string_view mine) {
  std::size_t a = 0, b = 0;
  while (a < root.size() || b < mine.size()) {
    const std::size_t ea = std::min(root.find('\n', a), root.size());
    const std::size_t eb = std::min(mine.find('\n', b), mine.size());
    const std::string_view la = root.substr(a, ea - a), lb = mine.substr(b, eb - b);
    if (la != lb) {
      const auto cut = [](std::string_view l) {
        return l.empty() ? std::string("nothing") : std::string(l.substr(0, 160));
      };
      return fmt::format("this rank has {} where rank 0 has {}", cut(lb), cut(la));
    }
    a = ea + 1;
    b = eb + 1;
  }
  return "the same lines";
}

bool has_mode(const std::vector<TpMode>& modes, TpMode m) {
  return std::find(modes.begin(), modes.end(), m) != modes.end();
}

// The weights grouped by shape and batch (counts summed, names collected), in order of first
// appearance.
std::vector<ModelBenchShape> distinct_shapes(const std::vector<WeightShape>& weights) {
  std::vector<ModelBenchShape> out;
  for (const WeightShape& w : weights) {
    auto it = std::find_if(out.begin(), out.end(), [&](const ModelBenchShape& s) {
      return s.m == w.m && s.n == w.n && s.batch == w.batch;
    });
    if (it == out.end()) {
      out.push_back({});
      it = out.end() - 1;
      it->m = w.m;
      it->n = w.n;
      it->batch = w.batch;
    }
    it->count += w.count;
    it->names.push_back(w.name);
  }
  return out;
}

// Bytes one rank of a group of g allocates (host and backend memory together): per shape the full
// random matrix, its shard, a work copy, NS's workspace and the gathered full matrix; per weight
// (count copies per shape) auto's key and estimate, the owner's buffers (its share of the full
// matrix and the all-to-all staging) and, for each of up to three owner runs (on more than one
// rank), a shard-sized work matrix. With plan measure, the planner's copies too
// (model_bench_measure.cpp): per weight a shard and a work copy of it, and the largest full
// matrix while they are drawn.
double bench_memory_bytes(const std::vector<ModelBenchShape>& shapes, int g, bool measure) {
  double bytes = 0, largest = 0;
  for (const ModelBenchShape& s : shapes) {
    const double b = static_cast<double>(s.batch);  // a parameter's matrices, all drawn at once
    const double full = b * static_cast<double>(s.m) * static_cast<double>(s.n);
    const double shard = full / g + b * static_cast<double>(s.n);  // rows rounded up
    const double count = static_cast<double>(s.count);
    bytes += sizeof(float) * (2 * full + 2 * shard) + ns_workspace_bytes(s.m, s.n);
    const double owner_runs = g > 1 ? 4 : 0;  // owner is measured on more than one rank only
    bytes += count * (sizeof(AutoKey) + sizeof(CostEstimate) + sizeof(AutoChoice) +
                      (g > 1 ? sizeof(float) * (full / g + 2 * shard) : 0) +
                      owner_runs * (sizeof(DeviceMatrix) + sizeof(float) * shard + 64));
    if (measure) bytes += count * (2 * sizeof(float) * shard + 2 * sizeof(DeviceMatrix) + 128);
    largest = std::max(largest, sizeof(float) * full);
  }
  return bytes + (measure ? largest : 0);
}

std::string check_config(const ModelBenchConfig& c, const std::vector<ModelBenchShape>& shapes,
                         int group_size) {
  if (shapes.empty()) return "the model has no Muon weights";
  if (!has_mode(c.modes, TpMode::kDuplicated) || !has_mode(c.modes, TpMode::kDistributed))
    return "the modes must include duplicated and distributed (auto is chosen between them)";
  if (has_mode(c.modes, TpMode::kAuto))
    return "mode auto cannot be benchmarked (it resolves to another mode)";
  if (has_mode(c.modes, TpMode::kOwner))
    return "mode owner is measured over the whole model on its own: leave it out of the modes";
  if (c.max_elements < 1) return fmt::format("max elements {} must be >= 1", c.max_elements);
  if (c.timing.warmup < 0 || c.timing.reps < 1) {
    return fmt::format("warm-up {} must be >= 0 and reps {} >= 1", c.timing.warmup, c.timing.reps);
  }
  if (c.cost_model == "reference" && c.algorithm == NsAlgorithm::kGram)
    return "the reference model prices standard NS only: gram needs the refined model";
  try {
    c.ns.validate();
  } catch (const Error& e) {
    return e.what();
  }
  std::vector<std::string> big;
  for (const ModelBenchShape& s : shapes) {
    if (s.m < 1 || s.n < 1 || s.count < 1)
      return fmt::format("invalid weight {} x {}", shape_str(s.m, s.n), s.count);
    if (s.batch < 1 || s.count % s.batch != 0) {
      return fmt::format("weight {}: {} matrices are not a multiple of its batch {}",
                         shape_str(s.m, s.n), s.count, s.batch);
    }
    if (s.batch > 1 && c.plan == PlanMode::kMeasure) {
      return fmt::format(
          "plan measure does not time batched weights yet (weight {} of batch {}): use the "
          "estimate",
          shape_str(s.m, s.n), s.batch);
    }
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
  try {
    check_memory_fits(bench_memory_bytes(shapes, group_size, c.plan == PlanMode::kMeasure),
                      fmt::format("bench --model {} (per rank)", c.model));
  } catch (const Error& e) {
    return e.what();
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

// One shape's parameter on this rank (in compute's memory: its batch matrices' shards stacked by
// rows) and its layout, rows sharded over the group as training does.
struct ShapeData {
  DeviceMatrix shard;
  detail::ShardLayout layout;
  // The shard of matrix b of the parameter.
  MatrixView matrix(Index b) {
    return shard.view().block(b * layout.shard_rows(), 0, layout.shard_rows(), layout.n);
  }
};

// The full matrices are drawn on the host (the same values on every backend) and this rank's
// shards of them uploaded once.
ShapeData make_shape(const Communicator& group, const ModelBenchConfig& config, std::size_t index,
                     ModelBenchShape& shape, Compute& compute) {
  const int g = group.size(), r = group.rank();
  const RowSharding sharding = RowSharding::make(shape.m, shape.n, g);
  shape.shard_rows = sharding.shard_rows;
  shape.pad = sharding.pad_length;
  Matrix stacked(shape.batch * sharding.shard_rows, shape.n);
  std::mt19937_64 rng(config.seed + index);
  std::normal_distribution<float> dist;
  for (Index b = 0; b < shape.batch; ++b) {
    Matrix full(shape.m, shape.n);
    for (float& v : full.values())
      v = dist(rng);
    const Matrix mine = row_shard(full.view(), sharding, r);
    for (Index i = 0; i < sharding.shard_rows; ++i)
      for (Index j = 0; j < shape.n; ++j)
        stacked(b * sharding.shard_rows + i, j) = mine(i, j);
  }
  ShapeData d{to_device(compute, stacked.view()), {}};
  d.layout.m = shape.m;
  d.layout.n = shape.n;
  d.layout.gtp_size = g;
  d.layout.gtp_rank = r;
  d.layout.pad = sharding.pad_length;
  d.layout.batch = shape.batch;
  return d;
}

const detail::ScaleFn kUnitScale = [](Index, Index) { return 1.0; };

// Owner over every weight of the model (count copies of each shape) with per-weight algorithms,
// as Muon::step runs it: one OwnerOrthogonalizer over the bucket.
struct OwnerRun {
  std::vector<DeviceMatrix> work;
  std::vector<const DeviceMatrix*> source;
  std::vector<detail::OwnerOrthogonalizer::Weight> weights;
  std::unique_ptr<detail::OwnerOrthogonalizer> orth;
  std::vector<double> samples;
};

// Auto's plan for every weight (count copies per shape), made on rank 0 and shared.
std::vector<AutoChoice> plan_on_rank0(const Communicator& group, AutoModeResolver& resolver,
                                      const std::vector<AutoKey>& keys) {
  const auto codes = decide_on_root<std::vector<std::int64_t>>(
      group, 0, "bench --model: planning tp_mode=auto", [&] {
        const BucketPlan plan = resolver.plan(keys);
        std::vector<std::int64_t> out;
        for (const AutoChoice& c : plan.choices)
          out.push_back(to_code(c));
        return out;
      });
  DISTMUON_ASSERT(codes.size() == keys.size(), "one code per weight");
  std::vector<AutoChoice> out;
  for (std::size_t i = 0; i < keys.size(); ++i)
    out.push_back(choice_from_code(codes[i]));
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
  std::string why = check_config(config, shapes, group.size());
  std::optional<AutoModeResolver> resolver;
  if (why.empty()) {
    try {
      resolver.emplace(config.profile, config.cost_model);
    } catch (const Error& e) {
      why = e.what();
    }
  }
  agree_or_throw(group, why.empty(), fmt::format("bench --model {}", config.model), why);
  // Each rank looked the model and the profile up itself (a preset name resolves in the rank's
  // own data folders; another DISTMUON_DATA_DIR or node-local file gives other shapes): what they
  // read must be one content before the first collective that the shapes size.
  agree_on(group, model_bench_inputs_text(shapes, resolver->profile()),
           fmt::format("bench --model {}: the ranks read different models or profiles (the preset "
                       "or profile file differs between their nodes)",
                       config.model),
           first_differing_line);

  ModelBenchReport rep;
  rep.model = config.model;
  rep.group_size = group.size();
  rep.blas_threads = blas_threads();
  rep.crosses_domain = Topology::gather(group).crosses_world();
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

  // Keys and auto's plan: one bucket of every weight (a key per parameter: count / batch per
  // shape), batched keys priced as this backend runs them.
  std::vector<AutoKey> keys;
  for (ModelBenchShape& s : shapes) {
    s.key = auto_key(ShardLayout{.m = s.m, .n = s.n, .gtp_size = group.size(), .batch = s.batch},
                     config.ns, config.algorithm, rep.crosses_domain, 4,
                     compute.batches_newton_schulz());
    s.estimate = estimate(s.key, profile, resolver->cost_model());
    keys.insert(keys.end(), static_cast<std::size_t>(s.parameters()), s.key);
  }
  // The backend's data plane, attached once (as Muon::add_parameter does): the shards and Gram
  // matrices move over it; the group's control plane times and agrees.
  const Communicator gtp = group.has_data_plane() ? group : compute.data_communicator(group);
  const Communicator tp = compute.data_communicator(local_communicator());
  // NS scratch and the gathered buffers, kept across runs as the optimizer keeps them.
  detail::NsWorkspaces workspaces;
  std::optional<MeasuredPlan> measured;
  if (config.plan == PlanMode::kMeasure) {
    measured =
        detail::measure_model_plan(gtp, tp, config, shapes, keys, *resolver, compute, workspaces);
  }
  const std::vector<AutoChoice> plan =
      measured ? measured->choices : plan_on_rank0(group, *resolver, keys);
  rep.auto_owner = !plan.empty() && plan.front().mode == TpMode::kOwner;
  std::vector<NsAlgorithm> auto_algorithms;
  for (const AutoChoice& c : plan)
    auto_algorithms.push_back(c.algorithm);

  // Every candidate of every shape, and owner over the whole model (all standard, all Gram,
  // and auto's mix when it planned another), timed in the same interleaved rounds.
  std::vector<ShapeData> data;
  std::vector<std::vector<ModelBenchMode>> candidates(shapes.size());
  std::vector<std::vector<std::vector<double>>> samples(shapes.size());
  std::vector<DeviceMatrix> work;
  // Every timed thing (a candidate of one shape, or owner over the model) and where its samples
  // go; each run and reset ends with the backend synchronised (the clock is read after its work).
  std::vector<MeasureTask> tasks;
  std::vector<std::vector<double>*> task_samples;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    data.push_back(make_shape(group, config, i, shapes[i], compute));
    work.emplace_back(compute, data[i].shard.rows(), data[i].shard.cols());
    for (TpMode mode : config.modes) {
      for (NsAlgorithm a : rep.algorithms)
        candidates[i].push_back({mode, a, {}});
    }
    samples[i].resize(candidates[i].size());
  }
  // Per shape, its parameter's matrices as the optimizer passes them (one view each).
  std::vector<std::vector<MatrixView>> slices(shapes.size());
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    for (Index b = 0; b < shapes[i].batch; ++b)
      slices[i].push_back(work[i].view().block(b * data[i].layout.shard_rows(), 0,
                                               data[i].layout.shard_rows(), data[i].layout.n));
  }
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    for (std::size_t c = 0; c < candidates[i].size(); ++c) {
      const ModelBenchMode m = candidates[i][c];
      tasks.push_back({[&, i, m, ns = with_algorithm(config.ns, m.algorithm)] {
                         detail::orthogonalize_shards(slices[i], data[i].layout, tp, gtp, m.mode,
                                                      ns, kUnitScale, compute, workspaces);
                         compute.synchronize();
                       },
                       detail::copy_reset(compute, {{data[i].shard.view(), work[i].view()}})});
      task_samples.push_back(&samples[i][c]);
    }
  }
  // Owner runs: every one pipelined (config.pipeline chunks, or with 0 the cost model's choice
  // for the run's keys over the link, as the optimizer chooses: a chunk's gather and the previous
  // one's scatter in flight while its NS runs), and the first also on the serial schedule (one
  // exchange per stage) when it runs in more than one chunk, both over the emulated link when
  // one is set.
  struct OwnerConfig {
    std::string label;
    std::vector<NsAlgorithm> algorithms;
    int pipeline;
    bool serial = false;
  };
  const auto pinned_keys = [&](const std::vector<NsAlgorithm>& algorithms) {
    std::vector<AutoKey> pinned = keys;  // (algorithms: per key, i.e. per parameter)
    for (std::size_t w = 0; w < pinned.size(); ++w)
      pinned[w].algorithm = algorithms[w];
    return pinned;
  };
  const auto owner_run = [&](std::string label, std::vector<NsAlgorithm> algorithms) {
    const int chunks = config.pipeline > 0 ? config.pipeline
                                           : detail::chosen_owner_chunks(pinned_keys(algorithms),
                                                                         profile, config.link);
    return OwnerConfig{std::move(label), std::move(algorithms), chunks};
  };
  std::vector<OwnerConfig> owner_runs;
  if (group.size() > 1) {
    for (NsAlgorithm a : rep.algorithms)
      owner_runs.push_back(owner_run(to_string(AutoChoice{TpMode::kOwner, a}),
                                     std::vector<NsAlgorithm>(keys.size(), a)));
    if (rep.auto_owner && std::none_of(owner_runs.begin(), owner_runs.end(), [&](const auto& r) {
          return r.algorithms == auto_algorithms;
        }))
      owner_runs.push_back(owner_run("owner (auto's algorithms)", auto_algorithms));
    if (owner_runs.front().pipeline > 1) {
      OwnerConfig serial = owner_runs.front();
      serial.label += " (serial schedule)";
      serial.pipeline = 1;
      serial.serial = true;
      owner_runs.push_back(std::move(serial));
    }
  }
  const bool emulated = config.link.latency_s > 0 || config.link.bytes_per_s > 0;
  const Communicator owner_gtp = emulated ? emulated_link_communicator(gtp, config.link) : gtp;
  std::vector<OwnerRun> owners(owner_runs.size());
  for (std::size_t r = 0; r < owner_runs.size(); ++r) {
    OwnerRun& o = owners[r];
    // One work copy per parameter; one owner weight per matrix of it (the optimizer's units).
    std::vector<std::size_t> shape_of;  // per parameter
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      for (Index c = 0; c < shapes[i].parameters(); ++c) {
        o.work.emplace_back(compute, data[i].shard.rows(), data[i].shard.cols());
        o.source.push_back(&data[i].shard);
        shape_of.push_back(i);
      }
    }
    for (std::size_t p = 0; p < o.work.size(); ++p) {
      const ShapeData& d = data[shape_of[p]];
      for (Index b = 0; b < d.layout.batch; ++b) {
        o.weights.push_back({o.work[p].view().block(b * d.layout.shard_rows(), 0,
                                                    d.layout.shard_rows(), d.layout.n),
                             &d.layout, &tp, &owner_gtp, owner_runs[r].algorithms.at(p)});
      }
    }
    o.orth = std::make_unique<detail::OwnerOrthogonalizer>(detail::ns_flops_cost(config.ns),
                                                           owner_runs[r].pipeline);
    detail::ResetCopies copies;
    for (std::size_t w = 0; w < o.work.size(); ++w)
      copies.emplace_back(o.source[w]->view(), o.work[w].view());
    tasks.push_back({[&o, &config, &compute, &workspaces] {
                       o.orth->run(o.weights, config.ns, kUnitScale, compute, &workspaces);
                       compute.synchronize();
                     },
                     detail::copy_reset(compute, std::move(copies))});
    task_samples.push_back(&o.samples);
  }
  // Warm-up rounds, then timed rounds, interleaved (candidate_runner.h); a reset or run failing
  // on some ranks ends every rank with its message.
  const int rounds = config.timing.warmup + config.timing.reps;
  detail::CandidateRounds options{config.timing.warmup, config.timing.reps, "bench --model", {}};
  if (config.progress) {
    options.before_run = [&](int round, std::size_t run) {
      config.progress(fmt::format("bench --model: round {}/{} ({}), run {}/{}", round + 1, rounds,
                                  round < config.timing.warmup ? "warm-up" : "timed", run + 1,
                                  tasks.size()));
    };
  }
  std::vector<std::vector<double>> timed = detail::run_candidates(group, tasks, options);
  for (std::size_t k = 0; k < tasks.size(); ++k)
    *task_samples[k] = std::move(timed[k]);

  ModelBenchTotals& t = rep.totals;
  for (std::size_t i = 0, w = 0; i < shapes.size();
       w += static_cast<std::size_t>(shapes[i].parameters()), ++i) {
    ModelBenchShape& s = shapes[i];
    s.auto_choice = plan[w];
    for (std::size_t c = 0; c < candidates[i].size(); ++c) {
      candidates[i][c].time = summarize(std::move(samples[i][c]));
      s.modes.push_back(candidates[i][c]);
    }
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

    const auto c = static_cast<double>(s.parameters());  // each median is one parameter's
    const NsAlgorithm base = rep.algorithms.front();
    t.duplicated_s += c * s.median_s(TpMode::kDuplicated, base);
    t.distributed_s += c * s.median_s(TpMode::kDistributed, base);
    t.auto_s += c * chosen;
    t.per_weight_oracle_s += c * best;
    if (rep.has_profile) {
      t.predicted_duplicated_s += c * s.estimate.of(TpMode::kDuplicated, base).seconds();
      t.predicted_distributed_s += c * s.estimate.of(TpMode::kDistributed, base).seconds();
      if (!rep.auto_owner) t.predicted_auto_s += c * s.estimate.cost(s.auto_choice);
    }
  }
  t.oracle_s = t.per_weight_oracle_s;
  for (std::size_t r = 0; r < owner_runs.size(); ++r) {
    const auto& [label, algorithms, pipeline, serial] = owner_runs[r];
    ModelBenchOwner o{label, algorithms, summarize(std::move(owners[r].samples)), 0};
    o.serial = serial;
    o.chunks = pipeline;
    if (rep.has_profile) {
      // The run's schedule (its chunks) and the emulated link under its exchanges.
      o.predicted_s =
          detail::predict_owner(pinned_keys(algorithms), profile, {pipeline, config.link});
    }
    t.oracle_s = std::min(t.oracle_s, o.time.median_s);
    if (rep.auto_owner && algorithms == auto_algorithms && !o.serial) {
      t.auto_s = o.time.median_s;
      t.predicted_auto_s = o.predicted_s;
    }
    rep.owner.push_back(std::move(o));
  }
  if (measured) detail::add_measured_plan(rep, shapes, *measured);
  if (config.replicated) {
    rep.replicated = detail::run_replicated_bench(group, config, profile, resolver->cost_model(),
                                                  rep.crosses_domain, compute);
  }
  rep.shapes = std::move(shapes);
  return rep;
}

}  // namespace distmuon
