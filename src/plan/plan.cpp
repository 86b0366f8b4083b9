#include "distmuon/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "distmuon/error.h"

namespace distmuon {
namespace {

using nlohmann::json;

json mode_json(const ModeCost& c) {
  return {{"flops", c.flops},
          {"payload_bytes", c.payload_bytes},
          {"wire_bytes", c.wire_bytes},
          {"all_gathers", c.all_gathers},
          {"all_reduces", c.all_reduces},
          {"compute_s", c.compute_s},
          {"bandwidth_s", c.bandwidth_s},
          {"latency_s", c.latency_s}};
}

double ratio(double a, double b) {
  return b > 0 ? a / b : 0.0;
}

}  // namespace

AutoKey PlanOptions::key(Index m, Index n) const {
  return AutoKey{.m = m,
                 .n = n,
                 .group_size = group_size,
                 .partition_dim = partition_dim,
                 .second_group_size = 1,
                 .crosses_domain = crosses_domain,
                 .steps = steps,
                 .use_syrk = use_syrk,
                 .elem_size = elem_size};
}

std::string PlanOptions::describe() const {
  const std::string precision = elem_size == 2   ? "bf16"
                                : elem_size == 4 ? "fp32"
                                                 : fmt::format("{} B", elem_size);
  return fmt::format(
      "G={} (dim {}), profile {}, {} model, {} steps, {}, {}, {}", group_size, partition_dim,
      profile ? fmt::format("{} ({})", profile->name, profile->device) : "none (FLOPs)",
      to_string(model), steps, use_syrk ? "syrk" : "gemm", precision,
      crosses_domain ? "cross-domain" : "intra-domain");
}

Plan make_plan(const std::vector<WeightShape>& weights, const PlanOptions& opts) {
  if (weights.empty()) throw Error("plan: no weights (give --shape or --model)");
  Plan plan;
  plan.options = opts;
  std::map<std::pair<Index, Index>, std::size_t> row_of;
  const HardwareProfile* profile = opts.profile ? &*opts.profile : nullptr;
  for (const auto& w : weights) {
    if (w.count < 1)
      throw Error(
          fmt::format("plan: weight '{}' {} has count {}", w.name, shape_str(w.m, w.n), w.count));
    const auto [it, inserted] = row_of.try_emplace({w.m, w.n}, plan.rows.size());
    if (inserted)
      plan.rows.push_back({w.m, w.n, 0, {}, estimate(opts.key(w.m, w.n), profile, opts.model)});
    PlanRow& row = plan.rows[it->second];
    row.count += w.count;
    if (std::find(row.names.begin(), row.names.end(), w.name) == row.names.end())
      row.names.push_back(w.name);
  }
  for (const auto& row : plan.rows) {
    const double c = static_cast<double>(row.count);
    plan.total_duplicated += c * row.estimate.cost(TpMode::kDuplicated);
    plan.total_distributed += c * row.estimate.cost(TpMode::kDistributed);
    plan.total_auto += c * row.estimate.cost(row.estimate.choice);
  }
  return plan;
}

std::string format_plan(const Plan& plan) {
  const bool s = plan.in_seconds();
  std::string out = fmt::format("plan: {}\n", plan.options.describe());
  out += fmt::format("cost per weight ({}); total = count x the chosen mode's cost\n\n",
                     s ? "predicted NS time on one rank" : "FLOPs per rank");
  out += fmt::format("{:>7} {:>7} {:>7}  {:<24} {:>12} {:>12}  {:<11} {:>12}\n", "count", "m", "n",
                     "weights", "duplicated", "distributed", "choice", "total");
  for (const auto& r : plan.rows) {
    std::string names = fmt::format("{}", fmt::join(r.names, ","));
    if (names.size() > 24) names = names.substr(0, 21) + "...";
    out += fmt::format(
        "{:>7} {:>7} {:>7}  {:<24} {:>12} {:>12}  {:<11} {:>12}\n", r.count, r.m, r.n, names,
        format_cost(r.estimate.cost(TpMode::kDuplicated), s),
        format_cost(r.estimate.cost(TpMode::kDistributed), s), to_string(r.estimate.choice),
        format_cost(static_cast<double>(r.count) * r.estimate.cost(r.estimate.choice), s));
  }
  out += fmt::format("\ntotals per optimizer step ({} Muon weights):\n", [&] {
    Index n = 0;
    for (const auto& r : plan.rows)
      n += r.count;
    return n;
  }());
  const char* better = s ? "faster" : "fewer FLOPs";
  out += fmt::format("  always duplicated   {:>12}   auto: {:.2f}x {}\n",
                     format_cost(plan.total_duplicated, s),
                     ratio(plan.total_duplicated, plan.total_auto), better);
  out += fmt::format("  always distributed  {:>12}   auto: {:.2f}x {}\n",
                     format_cost(plan.total_distributed, s),
                     ratio(plan.total_distributed, plan.total_auto), better);
  out += fmt::format("  auto                {:>12}\n", format_cost(plan.total_auto, s));
  return out;
}

void to_json(json& j, const Plan& plan) {
  const PlanOptions& o = plan.options;
  json weights = json::array();
  for (const auto& r : plan.rows) {
    weights.push_back({{"m", r.m},
                       {"n", r.n},
                       {"count", r.count},
                       {"group_size", o.group_size},
                       {"mode", to_string(r.estimate.choice)},
                       {"names", r.names},
                       {"cost",
                        {{"duplicated", r.estimate.cost(TpMode::kDuplicated)},
                         {"distributed", r.estimate.cost(TpMode::kDistributed)}}},
                       {"breakdown",
                        {{"duplicated", mode_json(r.estimate.duplicated)},
                         {"distributed", mode_json(r.estimate.distributed)}}}});
  }
  j = json{{"weights", weights},
           {"totals",
            {{"duplicated", plan.total_duplicated},
             {"distributed", plan.total_distributed},
             {"auto", plan.total_auto},
             {"speedup_vs_duplicated", ratio(plan.total_duplicated, plan.total_auto)},
             {"speedup_vs_distributed", ratio(plan.total_distributed, plan.total_auto)}}},
           {"units", plan.in_seconds() ? "seconds" : "flops"},
           {"options",
            {{"group_size", o.group_size},
             {"partition_dim", o.partition_dim},
             {"steps", o.steps},
             {"syrk", o.use_syrk},
             {"elem_size", o.elem_size},
             {"crosses_domain", o.crosses_domain},
             {"cost_model", to_string(o.model)},
             {"profile", o.profile ? json(*o.profile) : json(nullptr)}}}};
}

}  // namespace distmuon
