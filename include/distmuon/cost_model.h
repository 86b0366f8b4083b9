#pragma once
// Cost model for choosing, per weight, between the duplicated and distributed TP modes, and
// the tp_mode=auto resolver built on it.
//
// CONTRACT (used by the optimizer; keep these declarations): AutoKey, AutoModeResolver.
//
// Two models, both pure functions of (key, profile) returning a breakdown per mode; choosing is
// a separate step (CostEstimate::choice). The equations, units and sources are in
// docs/cost-model.md.
//  - reference: the original model, kept exactly (rows split, Gram forced onto n, bandwidth only).
//  - refined (default): the op sequence newton_schulz_tp really runs (partition_dim 0 or 1, the
//    two-step TP x GTP case, the norm all-reduce), ring latencies, and the payload bytes the
//    counting communicator records.
// Without a profile both compare FLOPs (a group that crosses an NVLink domain gives duplicated).

#include <compare>
#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "distmuon/comm.h"
#include "distmuon/hardware_profile.h"
#include "distmuon/matrix.h"
#include "distmuon/tp.h"

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
  auto operator<=>(const AutoKey&) const = default;
};

enum class CostModel { kReference, kRefined };
CostModel parse_cost_model(std::string_view name);  // "reference", "refined"; throws listing them
const char* to_string(CostModel model);

// What one mode costs on one rank of the group for one weight. Times are zero without a profile.
struct ModeCost {
  double flops = 0;          // per rank, as counted by ns_flops (syrk = s^2 L, gemm = 2 m n k)
  double payload_bytes = 0;  // summed payload per collective, as CommStats counts it
  double wire_bytes = 0;     // bytes a rank sends in ring collectives (the bandwidth term)
  int all_gathers = 0;       // collective calls per NS run
  int all_reduces = 0;
  double compute_s = 0;    // flops / (peak 1e12)
  double bandwidth_s = 0;  // wire_bytes / (bandwidth 1e9)
  double latency_s = 0;    // ring steps x per-step latency (refined only)
  double comm_s() const { return bandwidth_s + latency_s; }
  double seconds() const { return compute_s + comm_s(); }
};

struct CostEstimate {
  ModeCost duplicated, distributed;
  bool has_profile = false;
  bool crosses_domain = false;
  TpMode choice = TpMode::kDuplicated;  // kDuplicated or kDistributed
  // Seconds with a profile, FLOPs without (what the choice compares).
  double cost(TpMode mode) const;
};

// The reference model exactly: s = min(m, n), L = max(m, n), k = m / G, gram = 1 with syrk else 2;
// FLOPs duplicated S (gram (s^2 L + s^3) + 2 s^2 L), distributed S (gram (n^2 k + n^3) + 2 n^2 k);
// bytes duplicated m n e r, distributed S 2 n^2 e r with r = (G - 1) / G. Reads m, n, group_size,
// steps, use_syrk, elem_size and crosses_domain of the key; ignores partition_dim and
// second_group_size. Ties go to duplicated.
CostEstimate estimate_reference(const AutoKey& key, const HardwareProfile* profile);
// The refined model (see the header comment and docs/cost-model.md).
CostEstimate estimate_refined(const AutoKey& key, const HardwareProfile* profile);
CostEstimate estimate(const AutoKey& key, const HardwareProfile* profile, CostModel model);
// Throws distmuon::Error when a key cannot be estimated (non-positive sizes, steps, elem_size).
void validate_key(const AutoKey& key);
// "4096x1024 G=8 intra-domain" (with " dim=1" and " G2=2" when they apply).
std::string describe(const AutoKey& key);
// A cost for people: "1.92 ms" (seconds) or "3.41 GFLOP" (FLOPs, when there is no profile).
std::string format_cost(double value, bool seconds);

// Resolves tp_mode=auto. Construct from a profile spec ("none", a built-in name, or a JSON file)
// and a cost model name ("refined" or "reference"); invalid values throw with the valid ones.
class AutoModeResolver {
 public:
  AutoModeResolver(const std::string& profile_spec = "none",
                   const std::string& cost_model = "refined");
  ~AutoModeResolver();
  AutoModeResolver(AutoModeResolver&&) noexcept;
  AutoModeResolver& operator=(AutoModeResolver&&) noexcept;

  // kDuplicated or kDistributed. Cached per key; the first time a key is seen the group's rank 0
  // evaluates the model and broadcasts the decision, so every rank agrees even when their local
  // profiles differ. Logs the decision with its estimates once, at info level, on rank 0.
  TpMode resolve(const AutoKey& key, const Communicator& group);

  // Number of cost-model evaluations made by this rank (tests check the cache).
  std::size_t model_evaluations() const;
  // Decisions made so far (saved in checkpoints) and restoring them (on load).
  const std::map<AutoKey, TpMode>& decisions() const;
  void restore(const AutoKey& key, TpMode mode);

  // The profile (empty for "none") and model this resolver estimates with.
  const std::optional<HardwareProfile>& profile() const;
  CostModel cost_model() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace distmuon
