#pragma once
// What tp_mode=auto decides on and what it decides: the key a weight is planned by and the
// chosen mode and algorithm (Muon::auto_decisions). The cost model that decides is cost_model.h.

#include <compare>
#include <cstdint>
#include <string>

#include "distmuon/matrix.h"
#include "distmuon/newton_schulz.h"
#include "distmuon/tp_mode.h"

namespace distmuon {

// What auto is resolved on: once per distinct key, identically on every rank of the group.
struct AutoKey {
  Index m = 0, n = 0;  // full, unpadded weight shape
  int group_size = 1;  // ranks the weight is sharded over (the larger group in the two-step case)
  int partition_dim = 0;  // 0: rows split over the group, 1: columns
  int second_group_size =
      1;  // two-step TP x GTP case: the smaller group, all-gathered first; else 1
  bool crosses_domain = false;
  int steps = 5;
  bool use_syrk = true;
  int elem_size = 4;  // bytes per element of the precision NS runs in (4 fp32, 2 bf16)
  // The algorithms auto may pick: kStandard or kGram (pinned), kAuto (either; refined model).
  NsAlgorithm algorithm = NsAlgorithm::kStandard;
  // Gram matrices of the iterate one Gram-algorithm run forms: 1 + restarts
  // (gram_ns_gram_count of the NS options; the model does not know the coefficients).
  int gram_formations = 1;
  // A batched parameter (ParamSpec::batch, ShardLayout::batch: a layer's experts [E, m, n]):
  // batch matrices of this shape and groups, priced together: batch x one matrix's FLOPs and
  // bytes, each matrix one unit for owner mode's and the homes' LPT. batched_products: the
  // backend runs one batched call per NS product for the batch (Compute::batches_newton_schulz:
  // a GPU's strided-batched GEMM); false (the CPU) runs each matrix's NS in turn.
  Index batch = 1;
  bool batched_products = false;
  auto operator<=>(const AutoKey&) const = default;
};
// Whether key lets auto pick algorithm a (its algorithm is a, or kAuto).
inline bool auto_key_allows(const AutoKey& key, NsAlgorithm a) {
  return key.algorithm == NsAlgorithm::kAuto || key.algorithm == a;
}

// One candidate: a mode and the algorithm NS runs with.
struct AutoChoice {
  TpMode mode = TpMode::kDuplicated;
  NsAlgorithm algorithm = NsAlgorithm::kStandard;
  auto operator<=>(const AutoChoice&) const = default;
};
std::string to_string(const AutoChoice& choice);  // "distributed", "owner+gram"
// A choice as one integer (mode * 4 + algorithm), for broadcasting plans; and back.
std::int64_t to_code(const AutoChoice& choice);
AutoChoice choice_from_code(std::int64_t code);

}  // namespace distmuon
