#include "distmuon/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>
#include <utility>

#include "distmuon/error.h"
#include "distmuon/memory_check.h"
#include "distmuon/newton_schulz.h"

namespace distmuon {
namespace {

using nlohmann::json;

json mode_json(const ModeCost& c) {
  return {{"flops", c.flops},
          {"payload_bytes", c.payload_bytes},
          {"wire_bytes", c.wire_bytes},
          {"all_gathers", c.all_gathers},
          {"all_reduces", c.all_reduces},
          {"elementwise_elements", c.elementwise_elements},
          {"compute_s", c.compute_s},
          {"elementwise_s", c.elementwise_s},
          {"bandwidth_s", c.bandwidth_s},
          {"latency_s", c.latency_s}};
}

double ratio(double a, double b) {
  return b > 0 ? a / b : 0.0;
}

}  // namespace

AutoKey PlanOptions::key(Index m, Index n, Index batch) const {
  NsOptions ns;  // the default (quintic) coefficients
  ns.steps = steps;
  ns.use_syrk = use_syrk;
  const ShardLayout layout{
      .m = m, .n = n, .tp_dim = partition_dim, .tp_size = group_size, .batch = batch};
  return auto_key(layout, ns, algorithm, crosses_domain, elem_size);
}

std::string PlanOptions::describe() const {
  const std::string precision = elem_size == 2   ? "bf16"
                                : elem_size == 4 ? "fp32"
                                                 : fmt::format("{} B", elem_size);
  return fmt::format(
      "G={} (dim {}), profile {}, {} model, {} steps, {}, NS {}, {}, {}", group_size, partition_dim,
      profile ? fmt::format("{} ({})", profile->name, profile->device) : "none (FLOPs)",
      to_string(model), steps, use_syrk ? "syrk" : "gemm",
      model == CostModel::kReference ? "standard" : to_string(algorithm), precision,
      crosses_domain ? "cross-domain" : "intra-domain");
}

Plan make_plan(const std::vector<WeightShape>& weights, const PlanOptions& opts) {
  if (weights.empty()) throw Error("plan: no weights (give --shape or --model)");
  if (opts.steps < 1 || opts.steps > kMaxNsSteps) {
    throw Error(
        fmt::format("plan: Newton-Schulz steps {} are outside [1, {}]", opts.steps, kMaxNsSteps));
  }
  if (opts.group_size < 1 || opts.group_size > kMaxGroupSize) {
    throw Error(
        fmt::format("plan: group size {} is outside [1, {}]", opts.group_size, kMaxGroupSize));
  }
  // Auto's bucket holds a key and an estimate per weight (count copies per shape), and the owner
  // estimate a few numbers per weight and per rank: refuse a model that cannot fit.
  double instances = 0;
  for (const auto& w : weights)
    instances += static_cast<double>(std::max<Index>(w.count, 0));
  check_memory_fits(instances * (sizeof(AutoKey) + sizeof(CostEstimate) + sizeof(AutoChoice) +
                                 5 * sizeof(double)) +
                        4.0 * sizeof(double) * opts.group_size,
                    fmt::format("plan: {} Muon weights", instances));
  if (opts.model == CostModel::kReference && opts.algorithm == NsAlgorithm::kGram)
    throw Error(
        "plan: the reference model prices standard NS only; use --model-cost refined for "
        "--ns-algorithm gram");
  Plan plan;
  plan.options = opts;
  std::map<std::tuple<Index, Index, Index>, std::size_t> row_of;
  const HardwareProfile* profile = opts.profile ? &*opts.profile : nullptr;
  for (const auto& w : weights) {
    if (w.count < 1)
      throw Error(
          fmt::format("plan: weight '{}' {} has count {}", w.name, shape_str(w.m, w.n), w.count));
    if (w.batch < 1 || w.count % w.batch != 0)
      throw Error(fmt::format("plan: weight '{}' {} has count {}, not a multiple of its batch {}",
                              w.name, shape_str(w.m, w.n), w.count, w.batch));
    const auto [it, inserted] = row_of.try_emplace({w.m, w.n, w.batch}, plan.rows.size());
    if (inserted) {
      plan.rows.push_back(
          {w.m, w.n, 0, {}, estimate(opts.key(w.m, w.n, w.batch), profile, opts.model), w.batch});
    }
    PlanRow& row = plan.rows[it->second];
    row.count += w.count;
    if (std::find(row.names.begin(), row.names.end(), w.name) == row.names.end())
      row.names.push_back(w.name);
  }
  std::vector<AutoKey> keys;
  for (const auto& row : plan.rows) {
    const double c = row.weights();
    plan.total_duplicated += c * row.estimate.cost(TpMode::kDuplicated);
    plan.total_distributed += c * row.estimate.cost(TpMode::kDistributed);
    plan.total_per_weight += c * row.estimate.best_cost();
    keys.insert(keys.end(), static_cast<std::size_t>(row.count / row.batch),
                opts.key(row.m, row.n, row.batch));
  }
  plan.total_auto = plan.total_per_weight;
  const BucketPlan bucket = plan_bucket(keys, profile, opts.model);
  plan.owner = bucket.owner;
  plan.auto_owner = bucket.chose_owner();
  if (plan.auto_owner) plan.total_auto = bucket.owner->cost();
  if (opts.replicas > 1) {
    if (opts.replicas > kMaxGroupSize) {
      throw Error(
          fmt::format("plan: {} replicas is outside [1, {}]", opts.replicas, kMaxGroupSize));
    }
    std::vector<AutoKey> unsharded;
    for (const auto& row : plan.rows) {
      AutoKey k = opts.key(row.m, row.n, row.batch);
      k.group_size = 1;
      k.second_group_size = 1;
      k.partition_dim = 0;
      k.crosses_domain = false;
      if (k.algorithm == NsAlgorithm::kAuto && opts.model == CostModel::kReference)
        k.algorithm = NsAlgorithm::kStandard;
      unsharded.insert(unsharded.end(), static_cast<std::size_t>(row.count / row.batch), k);
    }
    // On the schedule the optimizer runs the homes on (pipelined, the cost model's chunks).
    plan.replicated = estimate_replica_bucket(unsharded, opts.replicas, opts.crosses_domain,
                                              profile, opts.model, 4.0, {kChosenChunks, {}});
  }
  return plan;
}

std::string format_plan(const Plan& plan) {
  const bool s = plan.in_seconds();
  const bool gram = !plan.rows.empty() && plan.rows.front().estimate.prices_gram;
  std::string out = fmt::format("plan: {}\n", plan.options.describe());
  out += fmt::format(
      "cost per weight ({}); +gram: Gram Newton-Schulz; owner NS: the weight's NS on its owner; "
      "a batched weight (xB: B matrices, a layer's experts) costs its B matrices together; "
      "total = count / B x the chosen candidate's cost\n\n",
      s ? "predicted NS time on one rank" : "FLOPs per rank");
  out += fmt::format("{:>7} {:>7} {:>7}  {:<24} {:>12} {:>12}", "count", "m", "n", "weights",
                     "duplicated", "distributed");
  if (gram) out += fmt::format(" {:>12} {:>12} {:>12}", "dup+gram", "dist+gram", "owner NS");
  out += fmt::format("  {:<17} {:>12}\n", "choice", "total");
  for (const auto& r : plan.rows) {
    std::string names = fmt::format("{}", fmt::join(r.names, ","));
    if (r.batch > 1) names = fmt::format("x{} {}", r.batch, names);
    if (names.size() > 24) names = names.substr(0, 21) + "...";
    const CostEstimate& e = r.estimate;
    out += fmt::format("{:>7} {:>7} {:>7}  {:<24} {:>12} {:>12}", r.count, r.m, r.n, names,
                       format_cost(e.cost(TpMode::kDuplicated), s),
                       format_cost(e.cost(TpMode::kDistributed), s));
    if (gram) {
      const double owner =
          std::min(e.cost(TpMode::kOwner), e.cost(TpMode::kOwner, NsAlgorithm::kGram));
      out += fmt::format(
          " {:>12} {:>12} {:>12}", format_cost(e.cost(TpMode::kDuplicated, NsAlgorithm::kGram), s),
          format_cost(e.cost(TpMode::kDistributed, NsAlgorithm::kGram), s), format_cost(owner, s));
    }
    out += fmt::format("  {:<17} {:>12}\n", to_string(e.best()),
                       format_cost(r.weights() * e.best_cost(), s));
  }
  Index matrices = 0, weights = 0;
  for (const auto& r : plan.rows) {
    matrices += r.count;
    weights += r.count / r.batch;
  }
  out += fmt::format("\ntotals per optimizer step ({} Muon weights{}):\n", weights,
                     matrices == weights ? std::string() : fmt::format(", {} matrices", matrices));
  const char* better = s ? "faster" : "fewer FLOPs";
  out += fmt::format("  always duplicated   {:>12}   auto: {:.2f}x {}\n",
                     format_cost(plan.total_duplicated, s),
                     ratio(plan.total_duplicated, plan.total_auto), better);
  out += fmt::format("  always distributed  {:>12}   auto: {:.2f}x {}\n",
                     format_cost(plan.total_distributed, s),
                     ratio(plan.total_distributed, plan.total_auto), better);
  out += fmt::format("  best per weight     {:>12}\n", format_cost(plan.total_per_weight, s));
  if (plan.owner) {
    out += fmt::format("  owner (LPT)         {:>12}   busiest owner {}, all-to-alls {}\n",
                       format_cost(plan.owner->cost(), s), format_cost(plan.owner->compute, s),
                       format_cost(plan.owner->comm_s, true));
  }
  out += fmt::format("  auto                {:>12}   {}\n", format_cost(plan.total_auto, s),
                     plan.auto_owner ? "owner mode" : "per-weight choices");
  if (const auto& r = plan.replicated) {
    out += fmt::format(
        "replicated over {} ranks instead (data parallel, unsharded; docs/data-parallel.md):\n",
        plan.options.replicas);
    out += fmt::format("  every rank's NS     {:>12}\n", format_cost(r->every_rank, s));
    out += fmt::format("  one home per weight {:>12}   busiest home {}, exchange {}\n",
                       format_cost(r->home_cost(), s), format_cost(r->compute, s),
                       format_cost(r->comm_s, true));
    out += fmt::format("  replica_mode auto   {:>12}   {}\n",
                       format_cost(r->chose_home() ? r->home_cost() : r->every_rank, s),
                       r->chose_home() ? "home" : "every rank");
  }
  return out;
}

void to_json(json& j, const Plan& plan) {
  const PlanOptions& o = plan.options;
  json weights = json::array();
  for (const auto& r : plan.rows) {
    json cost = json::object(), breakdown = json::object();
    for (TpMode mode : {TpMode::kDuplicated, TpMode::kDistributed, TpMode::kOwner}) {
      for (NsAlgorithm a : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
        const bool priced =
            r.estimate.prices_gram || (a == NsAlgorithm::kStandard && mode != TpMode::kOwner);
        if (!priced) continue;
        const std::string name = to_string(AutoChoice{mode, a});
        cost[name] = r.estimate.cost(mode, a);
        breakdown[name] = mode_json(r.estimate.of(mode, a));
      }
    }
    weights.push_back({{"m", r.m},
                       {"n", r.n},
                       {"count", r.count},
                       {"batch", r.batch},
                       {"group_size", o.group_size},
                       {"mode", to_string(r.estimate.choice)},
                       {"algorithm", to_string(r.estimate.algorithm)},
                       {"names", r.names},
                       {"cost", cost},
                       {"breakdown", breakdown}});
  }
  j = json{{"weights", weights},
           {"totals",
            {{"duplicated", plan.total_duplicated},
             {"distributed", plan.total_distributed},
             {"per_weight", plan.total_per_weight},
             {"owner", plan.owner ? json(plan.owner->cost()) : json(nullptr)},
             {"auto", plan.total_auto},
             {"auto_mode", plan.auto_owner ? "owner" : "per-weight"},
             {"speedup_vs_duplicated", ratio(plan.total_duplicated, plan.total_auto)},
             {"speedup_vs_distributed", ratio(plan.total_distributed, plan.total_auto)}}},
           {"replicated",
            plan.replicated ? json{{"replicas", o.replicas},
                                   {"every_rank", plan.replicated->every_rank},
                                   {"home", plan.replicated->home_cost()},
                                   {"home_compute", plan.replicated->compute},
                                   {"home_exchange_s", plan.replicated->comm_s},
                                   {"auto", plan.replicated->chose_home() ? "home" : "every_rank"}}
                            : json(nullptr)},
           {"units", plan.in_seconds() ? "seconds" : "flops"},
           {"options",
            {{"group_size", o.group_size},
             {"partition_dim", o.partition_dim},
             {"steps", o.steps},
             {"syrk", o.use_syrk},
             {"ns_algorithm", to_string(o.algorithm)},
             {"elem_size", o.elem_size},
             {"crosses_domain", o.crosses_domain},
             {"cost_model", to_string(o.model)},
             {"profile", o.profile ? json(*o.profile) : json(nullptr)}}}};
}

}  // namespace distmuon
