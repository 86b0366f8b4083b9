#pragma once
// Cost model for choosing, per weight, between the duplicated and distributed TP modes, and
// the tp_mode=auto resolver built on it.
//
// CONTRACT (used by the optimizer; keep these declarations): AutoKey, AutoModeResolver.
// The estimate functions and the breakdown types are added next to them.

#include <compare>
#include <cstddef>
#include <map>
#include <memory>
#include <string>

#include "distmuon/comm.h"
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

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace distmuon
