// tp_mode=auto: decided once per key on the group's rank 0 and broadcast, so that every rank runs
// the same collectives whatever its local profile says.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <array>
#include <cstdint>

#include "distmuon/cost_model.h"
#include "distmuon/error.h"

namespace distmuon {
namespace {

// The key as broadcast by rank 0, after the decision code.
constexpr std::size_t kFields = 10;
std::array<std::int64_t, kFields> pack(std::int64_t code, const AutoKey& k) {
  return {code,
          k.m,
          k.n,
          k.group_size,
          k.partition_dim,
          k.second_group_size,
          k.crosses_domain ? 1 : 0,
          k.steps,
          k.use_syrk ? 1 : 0,
          k.elem_size};
}

constexpr std::int64_t kFailed = -1;
constexpr std::int64_t kDuplicatedCode = 0;
constexpr std::int64_t kDistributedCode = 1;

}  // namespace

struct AutoModeResolver::Impl {
  std::optional<HardwareProfile> profile;
  CostModel model = CostModel::kRefined;
  std::map<AutoKey, TpMode> decisions;
  std::size_t evaluations = 0;
};

AutoModeResolver::AutoModeResolver(const std::string& profile_spec, const std::string& cost_model)
    : impl_(std::make_unique<Impl>()) {
  impl_->model = parse_cost_model(cost_model);
  impl_->profile = resolve_profile(profile_spec);
}

AutoModeResolver::~AutoModeResolver() = default;
AutoModeResolver::AutoModeResolver(AutoModeResolver&&) noexcept = default;
AutoModeResolver& AutoModeResolver::operator=(AutoModeResolver&&) noexcept = default;

TpMode AutoModeResolver::resolve(const AutoKey& key, const Communicator& group) {
  if (const auto it = impl_->decisions.find(key); it != impl_->decisions.end()) return it->second;

  std::int64_t code = kFailed;
  std::string failure;
  if (group.rank() == 0) {
    try {
      const HardwareProfile* p = impl_->profile ? &*impl_->profile : nullptr;
      const CostEstimate est = estimate(key, p, impl_->model);
      ++impl_->evaluations;
      code = est.choice == TpMode::kDistributed ? kDistributedCode : kDuplicatedCode;
      spdlog::info("tp_mode=auto: {} -> {} (duplicated {}, distributed {})", describe(key),
                   to_string(est.choice),
                   format_cost(est.cost(TpMode::kDuplicated), est.has_profile),
                   format_cost(est.cost(TpMode::kDistributed), est.has_profile));
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  auto msg = pack(code, key);
  group.broadcast<std::int64_t>(msg, 0);
  if (msg[0] == kFailed) {
    const std::string why = group.broadcast_string(failure, 0);
    throw CollectiveError(fmt::format("tp_mode=auto: rank 0 of the group could not resolve {}: {}",
                                      describe(key), why));
  }
  const bool same = msg == pack(msg[0], key);
  const AutoKey root{.m = msg[1],
                     .n = msg[2],
                     .group_size = static_cast<int>(msg[3]),
                     .partition_dim = static_cast<int>(msg[4]),
                     .second_group_size = static_cast<int>(msg[5]),
                     .crosses_domain = msg[6] != 0,
                     .steps = static_cast<int>(msg[7]),
                     .use_syrk = msg[8] != 0,
                     .elem_size = static_cast<int>(msg[9])};
  group.agree_or_throw(
      same, "tp_mode=auto",
      same ? std::string()
           : fmt::format("rank {} resolves {} (steps {}, syrk {}, elem {}) but rank 0 resolves {} "
                         "(steps {}, syrk {}, elem {})",
                         group.rank(), describe(key), key.steps, key.use_syrk, key.elem_size,
                         describe(root), root.steps, root.use_syrk, root.elem_size));
  const TpMode mode = msg[0] == kDistributedCode ? TpMode::kDistributed : TpMode::kDuplicated;
  impl_->decisions.emplace(key, mode);
  return mode;
}

std::size_t AutoModeResolver::model_evaluations() const {
  return impl_->evaluations;
}

const std::map<AutoKey, TpMode>& AutoModeResolver::decisions() const {
  return impl_->decisions;
}

void AutoModeResolver::restore(const AutoKey& key, TpMode mode) {
  if (mode != TpMode::kDuplicated && mode != TpMode::kDistributed) {
    throw Error(
        fmt::format("tp_mode=auto: cannot restore {} as '{}' (valid: duplicated, distributed)",
                    describe(key), to_string(mode)));
  }
  impl_->decisions.insert_or_assign(key, mode);
}

const std::optional<HardwareProfile>& AutoModeResolver::profile() const {
  return impl_->profile;
}

CostModel AutoModeResolver::cost_model() const {
  return impl_->model;
}

}  // namespace distmuon
