// The character-level model with row-sharded Muon weights and replicated AdamW parameters.
#include "distmuon/sharded_charlm.h"

#include <fmt/format.h>

#include <cstring>

#include "distmuon/agreement.h"
#include "distmuon/error.h"
#include "train/counter_rng.h"

namespace distmuon {
namespace {

std::uint64_t fingerprint(const CharLmConfig& c, std::uint64_t seed) {
  std::uint32_t eps_bits = 0;
  static_assert(sizeof(eps_bits) == sizeof(c.norm_eps));
  std::memcpy(&eps_bits, &c.norm_eps, sizeof(eps_bits));
  return detail::hash_keys(
      {seed, static_cast<std::uint64_t>(c.vocab), static_cast<std::uint64_t>(c.context),
       static_cast<std::uint64_t>(c.embed), static_cast<std::uint64_t>(c.hidden),
       static_cast<std::uint64_t>(c.ffn), static_cast<std::uint64_t>(c.layers), eps_bits});
}

}  // namespace

ShardedCharLm::ShardedCharLm(const CharLmConfig& config, std::uint64_t seed, Communicator group,
                             bool replicated)
    : group_(std::move(group)), model_(config) {
  agree(group_, fingerprint(config, seed) ^ (replicated ? 1 : 0),
        fmt::format("sharded charlm: the ranks of the group (size {}) were given different model "
                    "configs or seeds",
                    group_.size()));
  full_ = CharLmWeights::zeros(config);
  grads_ = CharLmWeights::zeros(config);
  const auto infos = charlm_param_infos(config);
  for (std::size_t p = 0; p < infos.size(); ++p) {
    const CharLmParamInfo& info = infos[p];
    ShardedParam sp;
    sp.name = info.name;
    sp.kind = info.kind;
    sp.rows = info.rows;
    sp.cols = info.cols;
    sp.sharded = info.kind == ParamKind::kMuon && !replicated;
    if (sp.sharded) {
      sp.sharding = RowSharding::make(info.rows, info.cols, group_.size());
      sp.value = init_charlm_rows(config, seed, p, sp.sharding.first_row(group_.rank()),
                                  sp.sharding.shard_rows);
    } else {
      sp.value = init_charlm_rows(config, seed, p, 0, info.rows);
    }
    sp.grad = Matrix(sp.value.rows(), sp.value.cols());
    params_.push_back(std::move(sp));
  }
}

void ShardedCharLm::gather_into_full() {
  const std::vector<Matrix*> full = full_.list();
  for (std::size_t p = 0; p < params_.size(); ++p) {
    const ShardedParam& sp = params_[p];
    if (sp.sharded) {
      all_gather_rows(sp.value, sp.sharding, group_, *full[p], ws_, cpu_compute());
    } else {
      copy(sp.value, *full[p]);
    }
  }
}

double ShardedCharLm::forward_backward(const CharBatch& local_batch) {
  const std::vector<std::int64_t> sizes = group_.all_gather<std::int64_t>(local_batch.size());
  bool equal = true;
  for (std::int64_t s : sizes)
    equal = equal && s == sizes.front();
  if (!equal || sizes.front() == 0) {
    throw CollectiveError(
        fmt::format(
            "sharded charlm: forward_backward needs equal, non-empty batches on every rank; "
            "got sizes {}",
            fmt::join(sizes, ",")),
        group_.error_scope());
  }
  gather_into_full();

  // A rank-local failure (a bad token, a non-finite loss) is agreed on before the reductions.
  double loss = 0.0;
  std::string failure;
  try {
    loss = model_.forward_backward(full_, local_batch, &grads_, cpu_compute());
  } catch (const Error& e) {
    failure = e.what();
  }
  agree_or_throw(group_, failure.empty(), "sharded charlm forward_backward", failure);

  const std::vector<Matrix*> grads = grads_.list();
  for (std::size_t p = 0; p < params_.size(); ++p) {
    ShardedParam& sp = params_[p];
    if (sp.sharded) {
      reduce_scatter_rows_mean(*grads[p], sp.sharding, group_, sp.grad, ws_, cpu_compute());
    } else {
      copy(*grads[p], sp.grad);
      all_reduce_mean(sp.grad, group_, cpu_compute());
    }
  }
  const double mean_loss = group_.all_reduce(loss) / static_cast<double>(group_.size());
  return mean_loss;
}

double ShardedCharLm::evaluate(const CharBatch& local_batch) {
  gather_into_full();
  double sum = 0.0;
  std::string failure;
  try {
    if (local_batch.size() > 0)
      sum =
          model_.loss(full_, local_batch, cpu_compute()) * static_cast<double>(local_batch.size());
  } catch (const Error& e) {
    failure = e.what();
  }
  agree_or_throw(group_, failure.empty(), "sharded charlm evaluate", failure);
  double totals[2] = {sum, static_cast<double>(local_batch.size())};
  group_.all_reduce<double>(totals);
  if (totals[1] == 0.0)
    throw CollectiveError("sharded charlm evaluate: no window on any rank", group_.error_scope());
  return totals[0] / totals[1];
}

CharLmWeights ShardedCharLm::gather_weights() {
  gather_into_full();
  return full_;
}

}  // namespace distmuon
