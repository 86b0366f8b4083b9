#pragma once
// tp_mode=auto: the cost model (cost_model.h) applied once per distinct key, identically on every
// rank, with the decisions cached, logged and saved in checkpoints.

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "distmuon/comm.h"
#include "distmuon/cost_model.h"
#include "distmuon/hardware_profile.h"

namespace distmuon {

// Resolves tp_mode=auto. Construct from a profile spec ("none", a built-in name, or a JSON file)
// and a cost model name ("refined" or "reference"); invalid values throw with the valid ones.
class AutoModeResolver {
 public:
  AutoModeResolver(const std::string& profile_spec = "none",
                   const std::string& cost_model = "refined");
  ~AutoModeResolver();
  AutoModeResolver(AutoModeResolver&&) noexcept;
  AutoModeResolver& operator=(AutoModeResolver&&) noexcept;

  // The per-weight best (duplicated or distributed, standard or Gram NS as the key allows).
  // Cached per key; the first time a key is seen the group's rank 0 evaluates the model and
  // broadcasts the decision, so every rank agrees even when their local profiles differ. Logs the
  // decision with every candidate's estimate once, at info level, on rank 0.
  AutoChoice resolve(const AutoKey& key, const Communicator& group);
  // plan_bucket on this rank alone (no collective: the caller shares the result). Logs each new
  // key's candidates and the bucket's decision; records the choices as decisions.
  BucketPlan plan(std::span<const AutoKey> keys);

  // Number of cost-model evaluations made by this rank (tests check the cache).
  std::size_t model_evaluations() const;
  // Decisions made so far (saved in checkpoints) and restoring them (on load).
  const std::map<AutoKey, AutoChoice>& decisions() const;
  void restore(const AutoKey& key, const AutoChoice& choice);

  // The profile (empty for "none") and model this resolver estimates with.
  const std::optional<HardwareProfile>& profile() const;
  CostModel cost_model() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace distmuon
