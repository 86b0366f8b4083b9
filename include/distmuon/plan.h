#pragma once
// Planning: the cost model applied to every Muon weight of a model (or to given shapes), the
// choice per distinct shape (duplicated or distributed, standard or Gram NS), owner mode over
// every weight at once, and the totals per optimizer step for always-duplicated,
// always-distributed, the per-weight choices, owner and auto (the cheaper of the last two).
// What `distmuon plan` prints.

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "distmuon/cost_model.h"
#include "distmuon/hardware_profile.h"
#include "distmuon/model_preset.h"

namespace distmuon {

struct PlanOptions {
  int group_size = 8;
  int partition_dim = 0;  // every weight split along this dim over the group
  int steps = 5;
  bool use_syrk = true;
  int elem_size = 2;  // NS in bf16, as Muon runs it on GPUs
  bool crosses_domain = false;
  // The algorithms auto may pick: standard (the optimizer's default), gram, or auto (either;
  // refined model). The reference model prices standard only (gram is refused).
  NsAlgorithm algorithm = NsAlgorithm::kStandard;
  CostModel model = CostModel::kRefined;
  std::optional<HardwareProfile> profile;
  // Data parallelism: also price the weights unsharded and replicated over this many ranks,
  // one home per weight against every rank's NS (estimate_replica_bucket, on the optimizer's
  // pipelined schedule); 1: not priced. The
  // replicas cross a domain when crosses_domain says so.
  int replicas = 1;

  // batch > 1: a batched weight of batch matrices (a layer's experts), priced as the CPU runs it.
  AutoKey key(Index m, Index n, Index batch = 1) const;
  std::string describe() const;  // one line: G, profile, model, steps, precision, domain
};

// One distinct shape of the plan: all weights of that shape, with the estimate for one of them.
struct PlanRow {
  Index m = 0, n = 0;
  Index count = 0;                 // matrices of this shape in one optimizer step
  std::vector<std::string> names;  // which weights ("attn.qkv", ...)
  CostEstimate estimate;           // per weight (a batched weight: its batch matrices together)
  Index batch = 1;                 // matrices per weight (WeightShape::batch)
  double weights() const { return static_cast<double>(count) / static_cast<double>(batch); }
};

struct Plan {
  PlanOptions options;
  std::vector<PlanRow> rows;  // in order of first appearance
  // Sums over all weights (count x per-weight cost): seconds with a profile, FLOPs without.
  double total_duplicated = 0, total_distributed = 0, total_auto = 0;
  double total_per_weight = 0;  // every weight in its per-weight best choice
  // Owner mode over every weight (refined model, G > 1): LPT owners, busiest owner + all-to-alls.
  std::optional<OwnerBucketEstimate> owner;
  bool auto_owner = false;  // auto picks owner (its cost is below total_per_weight)
  // options.replicas > 1: the weights unsharded, replicated over the replicas.
  std::optional<ReplicaBucketEstimate> replicated;
  bool in_seconds() const { return options.profile.has_value(); }
};

// Groups the weights by shape and estimates each shape once.
Plan make_plan(const std::vector<WeightShape>& weights, const PlanOptions& opts);
// The table and totals as text.
std::string format_plan(const Plan& plan);
// {"weights": [{"m", "n", "count", "group_size", "mode", "names", "cost": {"duplicated",
// "distributed", ...+gram, "owner"...}, "breakdown": {...}}], "totals": {"duplicated",
// "distributed", "per_weight", "owner", "auto", "auto_mode", "speedup_vs_duplicated",
// "speedup_vs_distributed"}, "units": "seconds" | "flops", "options"}.
void to_json(nlohmann::json& j, const Plan& plan);

}  // namespace distmuon
