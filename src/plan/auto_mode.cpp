// tp_mode=auto: decided once per key on the group's rank 0 and broadcast, so that every rank runs
// the same collectives whatever its local profile says.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "distmuon/agreement.h"
#include "distmuon/auto_mode.h"
#include "distmuon/error.h"
#include "distmuon/hash.h"

namespace distmuon {
namespace {

// The key's fields, as the ranks of a group compare them.
constexpr std::size_t kFields = 13;
using Packed = std::array<std::int64_t, kFields>;
Packed pack(const AutoKey& k) {
  return {k.m,
          k.n,
          k.group_size,
          k.partition_dim,
          k.second_group_size,
          k.crosses_domain ? 1 : 0,
          k.steps,
          k.use_syrk ? 1 : 0,
          k.elem_size,
          static_cast<std::int64_t>(k.algorithm),
          k.gram_formations,
          k.batch,
          k.batched_products ? 1 : 0};
}
AutoKey unpack(const Packed& f) {
  return {.m = f[0],
          .n = f[1],
          .group_size = static_cast<int>(f[2]),
          .partition_dim = static_cast<int>(f[3]),
          .second_group_size = static_cast<int>(f[4]),
          .crosses_domain = f[5] != 0,
          .steps = static_cast<int>(f[6]),
          .use_syrk = f[7] != 0,
          .elem_size = static_cast<int>(f[8]),
          .algorithm = static_cast<NsAlgorithm>(f[9]),
          .gram_formations = static_cast<int>(f[10]),
          .batch = f[11],
          .batched_products = f[12] != 0};
}

// "m x n over ... (steps 5, syrk true, elem 2, algorithm auto)": the key in an error message.
std::string describe_fully(const AutoKey& k) {
  return fmt::format("{} (steps {}, syrk {}, elem {}, algorithm {})", describe(k), k.steps,
                     k.use_syrk, k.elem_size, to_string(k.algorithm));
}

// "duplicated 1.20 ms, duplicated+gram 0.61 ms, ..." for the candidates an estimate priced.
std::string candidates(const AutoKey& key, const CostEstimate& e) {
  std::vector<std::string> parts;
  for (TpMode mode : {TpMode::kDuplicated, TpMode::kDistributed, TpMode::kOwner}) {
    if (mode == TpMode::kOwner && !e.prices_gram) continue;
    for (NsAlgorithm a : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
      if (a == NsAlgorithm::kGram && !e.prices_gram) continue;
      if (key.algorithm != NsAlgorithm::kAuto && key.algorithm != a && e.prices_gram) continue;
      parts.push_back(fmt::format("{} {}{}", to_string(AutoChoice{mode, a}),
                                  format_cost(e.cost(mode, a), e.has_profile),
                                  mode == TpMode::kOwner ? " (NS on the owner)" : ""));
    }
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

struct AutoModeResolver::Impl {
  std::optional<HardwareProfile> profile;
  CostModel model = CostModel::kRefined;
  std::map<AutoKey, AutoChoice> decisions;
  std::set<AutoKey> logged;
  std::size_t evaluations = 0;

  const HardwareProfile* profile_ptr() const { return profile ? &*profile : nullptr; }
  // Estimates a key, logging its candidates the first time.
  CostEstimate evaluate(const AutoKey& key) {
    CostEstimate est = estimate(key, profile_ptr(), model);
    ++evaluations;
    if (logged.insert(key).second) {
      spdlog::info("tp_mode=auto: {} -> {} ({})", describe(key), to_string(est.best()),
                   candidates(key, est));
    }
    return est;
  }
};

AutoModeResolver::AutoModeResolver(const std::string& profile_spec, const std::string& cost_model)
    : impl_(std::make_unique<Impl>()) {
  impl_->model = parse_cost_model(cost_model);
  impl_->profile = resolve_profile(profile_spec);
}

AutoModeResolver::~AutoModeResolver() = default;
AutoModeResolver::AutoModeResolver(AutoModeResolver&&) noexcept = default;
AutoModeResolver& AutoModeResolver::operator=(AutoModeResolver&&) noexcept = default;

AutoChoice AutoModeResolver::resolve(const AutoKey& key, const Communicator& group) {
  // The ranks resolve the same key, and the group's rank 0 decides for all of them. The cached
  // decision is used only when every rank has the key cached and the ranks' keys agree (one
  // all-reduce, always): a skip decided by one rank alone would leave another rank, resolving a
  // different key, waiting in the agreement.
  const Packed mine = pack(key);
  const auto cached = impl_->decisions.find(key);
  if (all_agree(group, fnv1a64(mine.data(), sizeof(Packed)), cached != impl_->decisions.end()))
    return cached->second;
  agree_on(group, {reinterpret_cast<const char*>(mine.data()), sizeof(Packed)}, "tp_mode=auto",
           [&](std::string_view root_bytes, std::string_view) {
             Packed root{};
             std::memcpy(root.data(), root_bytes.data(), sizeof(Packed));
             return fmt::format("rank {} resolves {} but rank 0 resolves {}", group.rank(),
                                describe_fully(key), describe_fully(unpack(root)));
           });
  const auto code = decide_on_root<std::int64_t>(
      group, 0, fmt::format("tp_mode=auto: resolving {}", describe(key)),
      [&] { return to_code(impl_->evaluate(key).best()); });
  const AutoChoice choice = choice_from_code(code);
  impl_->decisions.emplace(key, choice);
  return choice;
}

BucketPlan AutoModeResolver::plan(std::span<const AutoKey> keys) {
  for (const AutoKey& k : keys)
    impl_->evaluate(k);  // logs each new key's candidates
  BucketPlan plan = plan_bucket(keys, impl_->profile_ptr(), impl_->model);
  if (plan.owner) {
    const bool s = impl_->profile.has_value();
    spdlog::info(
        "tp_mode=auto: bucket of {} weight(s) over {} rank(s) -> {} (owner {}: busiest owner {} + "
        "all-to-alls {}; best per weight {})",
        keys.size(), keys.front().group_size * keys.front().second_group_size,
        plan.chose_owner() ? "owner" : "per-weight choices", format_cost(plan.owner->cost(), s),
        format_cost(plan.owner->compute, s), format_cost(plan.owner->comm_s, true),
        format_cost(plan.per_weight_cost, s));
  }
  for (std::size_t i = 0; i < keys.size(); ++i)
    impl_->decisions.insert_or_assign(keys[i], plan.choices[i]);
  return plan;
}

std::size_t AutoModeResolver::model_evaluations() const {
  return impl_->evaluations;
}

const std::map<AutoKey, AutoChoice>& AutoModeResolver::decisions() const {
  return impl_->decisions;
}

void AutoModeResolver::restore(const AutoKey& key, const AutoChoice& choice) {
  const bool mode_ok = choice.mode == TpMode::kDuplicated || choice.mode == TpMode::kDistributed ||
                       choice.mode == TpMode::kOwner;
  const bool algorithm_ok =
      choice.algorithm == NsAlgorithm::kStandard || choice.algorithm == NsAlgorithm::kGram;
  if (!mode_ok || !algorithm_ok) {
    throw Error(fmt::format(
        "tp_mode=auto: cannot restore {} as '{}' (valid: duplicated, distributed, owner, each "
        "with standard or gram)",
        describe(key), to_string(choice)));
  }
  impl_->decisions.insert_or_assign(key, choice);
}

const std::optional<HardwareProfile>& AutoModeResolver::profile() const {
  return impl_->profile;
}

CostModel AutoModeResolver::cost_model() const {
  return impl_->model;
}

}  // namespace distmuon
