#pragma once
// A model placed on a cluster, as Megatron places it: tensor (tp), context (cp), pipeline (pp,
// with vpp virtual stages per rank), data (dp) parallelism for the dense weights, and expert
// (ep), expert tensor (etp) and expert data parallelism for the experts; GTP (gtp, egtp) row
// sharding of the weights inside the data-parallel group. Pure functions of the model, the
// parallelism and the NVLink domain size: which weights (which shards, which experts) each rank
// holds, the groups that share them, and whether a group crosses an NVLink domain. The step
// simulation (step_simulation.h) prices the optimizer's work on it; docs/cost-model.md,
// "Placement and step simulation".
//
// Rank order (Megatron's default "tp-cp-ep-dp-pp"): dense weights
//   rank = tp_r + tp (cp_r + cp (dp_r + dp pp_r)),   dp_r = gtp_r + gtp replica_r
// experts
//   rank = etp_r + etp (ep_r + ep (edp_r + edp pp_r)),   edp_r = egtp_r + egtp replica_r
// with edp = world / (etp ep pp). NVLink domain of a rank: rank / domain_size.
//
// Tensor parallelism splits a weight as Megatron's layers do: column-parallel weights (QKV,
// MLA q_b and kv_b, fc1, an expert's fc1) along their rows (dim 0), row-parallel ones (the
// attention output, fc2) along their columns (dim 1); MLA's down projections (q_a, kv_a) and the
// router are replicated over TP. GTP splits rows over gtp ranks of the data-parallel group
// (distmuon's own sharding, docs/optimizer.md). Layers go to the pp x vpp virtual stages in
// order, as evenly as they divide (the first L mod (pp vpp) stages one layer more); virtual
// stage v runs on pipeline rank v mod pp.

#include <string>
#include <string_view>
#include <vector>

#include "distmuon/matrix.h"
#include "distmuon/model_preset.h"

namespace distmuon {

// How the optimizer state is sharded over the data-parallel replicas of a weight: not at all
// (every replica keeps the momentum of its shard), ZeRO-1 (Megatron's distributed optimizer:
// each replica keeps 1/R of every shard's elements) or layer-wise (each weight's momentum lives
// on one home replica, Megatron's layer-wise optimizer). FSDP is gtp = dp (the weights sharded).
enum class OptimizerSharding { kNone, kZero1, kLayerwise };
OptimizerSharding parse_optimizer_sharding(std::string_view name);  // "none", "zero1", "layerwise"
const char* to_string(OptimizerSharding s);

struct Parallelism {
  int tp = 1, cp = 1, pp = 1, vpp = 1, dp = 1;
  int ep = 1;
  int etp = 0;  // 0: the same as tp (Megatron's default)
  int gtp = 1, egtp = 1;
  OptimizerSharding sharding = OptimizerSharding::kLayerwise;

  int world() const { return tp * cp * pp * dp; }
  int expert_tp() const { return etp > 0 ? etp : tp; }
  int expert_dp() const { return world() / (expert_tp() * ep * pp); }
  // "tp=2 pp=4 vpp=4 ep=64 etp=1 dp=64" (factors at 1 left out; cp, gtp and egtp likewise).
  std::string describe() const;
  friend bool operator==(const Parallelism&, const Parallelism&) = default;
};

// "tp=2,pp=4,vpp=4,ep=64,etp=1,dp=64,cp=1" (any order, any subset; gtp= and egtp= too). Throws
// distmuon::Error naming the bad item. Checks only the spec itself; the model's fit is
// checked by Placement.
Parallelism parse_parallelism(std::string_view spec);

// How tensor parallelism splits a weight.
enum class TpSplit { kColumn, kRow, kReplicated };

// One Muon weight of a model with the layers it appears in: layers first_layer ..
// first_layer + layers - 1, experts_per_layer copies per layer (0: not an expert).
struct LayeredWeight {
  std::string name;
  Index m = 0, n = 0;
  Index first_layer = 0, layers = 1;
  Index experts_per_layer = 0;
  TpSplit split = TpSplit::kColumn;
  bool expert() const { return experts_per_layer > 0; }
};
// A preset's Muon weights with their layers (the dense MLP in the first moe.dense_layers
// layers, experts, shared experts and the router in the rest).
std::vector<LayeredWeight> layered_weights(const ModelPreset& model);
// Any list of shapes (train-default, --shape): the count copies of a shape in layers 0 ..
// count - 1 (an expert shape: its count experts in layer 0). Splits by name
// ("...o", "...fc2": row-parallel; "...q_a", "...kv_a", "router": replicated; else column).
std::vector<LayeredWeight> layered_weights(const std::vector<WeightShape>& weights);

// A rank's coordinates in both decompositions.
struct RankCoords {
  int tp = 0, cp = 0, dp = 0, pp = 0, gtp = 0;  // dense
  int etp = 0, ep = 0, edp = 0, egtp = 0;       // experts
};

// One weight of one layer as a rank holds it (experts: the rank's experts of that layer, all
// of one shape, first_expert .. first_expert + experts - 1).
struct HeldWeight {
  std::string name;
  Index layer = 0;
  Index first_expert = 0, experts = 0;  // experts == 0: not an expert
  Index m = 0, n = 0;                   // the full weight
  int tp = 1, tp_dim = 0;               // the tensor-parallel split (tp 1: not split)
  int gtp = 1;                          // rows split over gtp ranks
  Index shard_m = 0, shard_n = 0;       // what this rank holds of one weight (padded: ceil)
  int replicas = 1;                     // ranks that hold the same shard (data parallel)
  bool shard_crosses = false;           // the tp x gtp group spans NVLink domains
  bool replicas_cross = false;          // the replica group does
  bool expert() const { return experts > 0; }
  Index count() const { return experts > 0 ? experts : 1; }
  friend bool operator==(const HeldWeight&, const HeldWeight&) = default;
};

class Placement {
 public:
  // Throws distmuon::Error when the parallelism does not fit the model (ep not dividing the
  // experts, more pipeline stages than layers, edp not a whole number, gtp not dividing dp,
  // egtp not dividing edp) or domain_size < 1.
  Placement(std::vector<LayeredWeight> weights, Parallelism par, int domain_size);

  const Parallelism& parallelism() const { return par_; }
  const std::vector<LayeredWeight>& weights() const { return weights_; }
  int world() const { return par_.world(); }
  int domain_size() const { return domain_size_; }
  Index layers() const { return layers_; }

  RankCoords coords(int rank) const;
  // The pipeline rank that holds a layer, and the layers of a pipeline rank (ascending).
  int stage_of_layer(Index layer) const;
  std::vector<Index> stage_layers(int pp_rank) const;
  // The ranks of a rank's groups (ascending): the tp x gtp (etp x egtp) shard group and the
  // data-parallel replica group of its dense (expert) weights; for dense weights that TP does not
  // split the replicas include the TP group.
  // A dense weight TP does not split (tp_replicated) has the gtp ranks alone as its shard group.
  std::vector<int> shard_group(int rank, bool expert, bool tp_replicated = false) const;
  std::vector<int> replica_group(int rank, bool expert, bool tp_replicated = false) const;
  bool crosses_domain(const std::vector<int>& ranks) const;
  // What the rank holds, in layer order, the weights of a layer in the model's order.
  std::vector<HeldWeight> rank_weights(int rank) const;

 private:
  // The ranks that share every coordinate of rank but the ones named (dense: tp, gtp, and cp with
  // the replica index; experts: etp, egtp, the replica index), ascending.
  std::vector<int> dense_group(int rank, bool tp, bool gtp, bool replicas) const;
  std::vector<int> expert_group(int rank, bool tp, bool gtp, bool replicas) const;

  std::vector<LayeredWeight> weights_;
  Parallelism par_;
  int domain_size_;
  Index layers_ = 0;
  std::vector<int> layer_stage_;  // per layer
  Index experts_ = 0;             // experts per MoE layer (0: none)
};

}  // namespace distmuon
