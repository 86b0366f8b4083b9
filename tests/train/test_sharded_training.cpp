// Data-parallel training with row-sharded Muon weights, driven by plain SGD: the loss falls, and
// the sharded run over the test world's ranks follows a single-process run on the same global
// batch (gradient averaging, all-gather and reduce-scatter all correct).
//
// Tolerance: the sharded run sums each gradient over ranks in another order than the
// single-process run sums it over the batch, a ~1e-7 relative difference per step that SGD
// carries along; over 40 steps the losses differ by at most ~5e-7 relative (measured at 2 and 4
// ranks), so 1e-5 is the bound for losses and weights. A wrong average (a sum over the ranks, a
// gradient left unreduced) changes the step by a factor and is off by far more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "distmuon/charlm.h"
#include "distmuon/error.h"
#include "distmuon/sharded_charlm.h"
#include "distmuon/text_data.h"
#include "test_util.h"

namespace distmuon {
namespace {

using test::world;

// Odd widths so that at 2 ranks the input projection, fc1 and fc2 all carry a padding row.
CharLmConfig config() {
  CharLmConfig c;
  c.context = 8;
  c.embed = 8;
  c.hidden = 31;
  c.ffn = 127;
  c.layers = 2;
  return c;
}

// Words in a pseudo-random order: spelling is learnable, the next word is not (3 bits a word).
TextData text() {
  std::vector<std::uint8_t> t;
  const std::string words[] = {"the ", "free ",   "software ", "licence ",
                               "of ",  "copies ", "and ",      "program\n"};
  for (std::uint32_t i = 0; t.size() < 20000; ++i) {
    const std::string& w = words[(i * 2654435761u >> 13) % 8];
    t.insert(t.end(), w.begin(), w.end());
  }
  TextDataOptions o;
  o.context = 8;
  o.seed = 5;
  return TextData(std::move(t), o);
}

constexpr int kSteps = 40;
constexpr Index kGlobalBatch = 32;
constexpr float kLr = 0.5f;
constexpr std::uint64_t kSeed = 17;

double rel(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1e-30);
}

TEST(ShardedTraining, SgdOnShardsMatchesSingleProcessAndLearns) {
  const Communicator& comm = world();
  const TextData data = text();
  const CharLmConfig c = config();

  // Reference: the full model in this process on the whole global batch.
  CharLm ref_model(c);
  CharLmWeights ref = init_charlm_weights(c, kSeed);
  CharLmWeights ref_grads = CharLmWeights::zeros(c);
  // Sharded: this rank's part of the same global batch.
  ShardedCharLm model(c, kSeed, comm);

  std::vector<double> losses;
  double worst = 0;
  for (int step = 0; step < kSteps; ++step) {
    const double ref_loss = ref_model.forward_backward(
        ref, data.train_batch(step, 0, 1, kGlobalBatch), &ref_grads, cpu_compute());
    const auto rw = ref.list();
    const auto rg = ref_grads.list();
    for (std::size_t p = 0; p < rw.size(); ++p)
      cpu_compute().axpby(-kLr, *rg[p], 1.0f, *rw[p]);

    const double loss =
        model.forward_backward(data.train_batch(step, comm.rank(), comm.size(), kGlobalBatch));
    for (ShardedParam& sp : model.params())
      cpu_compute().axpby(-kLr, sp.grad, 1.0f, sp.value);
    ASSERT_LE(rel(loss, ref_loss), 1e-5) << "step " << step;
    worst = std::max(worst, rel(loss, ref_loss));
    losses.push_back(loss);
  }

  // The weights after training agree too, and the padding rows of every shard stayed zero.
  const CharLmWeights full = model.gather_weights();
  for (std::size_t p = 0; p < full.list().size(); ++p) {
    EXPECT_LE(relative_error(full.list()[p]->view(), ref.list()[p]->view()), 1e-5)
        << charlm_param_infos(c)[p].name;
  }
  for (const ShardedParam& sp : model.params()) {
    if (!sp.sharded) continue;
    for (Index i = sp.sharding.real_rows(comm.rank()); i < sp.sharding.shard_rows; ++i)
      for (Index j = 0; j < sp.cols; ++j)
        ASSERT_EQ(sp.value(i, j), 0.0f) << sp.name << " padding row " << i;
  }

  // Learning: from ~ln 256 = 5.5 nats, the last 5 steps average well below the first loss and
  // below the unigram entropy of the text; the validation loss (all ranks' windows) follows.
  double tail = 0;
  for (int i = kSteps - 5; i < kSteps; ++i)
    tail += losses[static_cast<std::size_t>(i)] / 5.0;
  const double entropy = unigram_entropy(data.bytes());
  EXPECT_LT(tail, losses.front() - 2.0);
  EXPECT_LT(tail, entropy);
  const double val = model.evaluate(data.validation_batch(comm.rank(), comm.size(), 301));
  const double ref_val = ref_model.loss(ref, data.validation_batch(0, 1, 301), cpu_compute());
  EXPECT_LE(rel(val, ref_val), 1e-5);
  EXPECT_LT(val, entropy);
  if (comm.rank() == 0) {
    std::printf(
        "ranks %d: loss %.4f -> %.4f (last 5), validation %.4f, unigram entropy %.4f; largest "
        "relative "
        "loss difference from the single-process run %.2g\n",
        comm.size(), losses.front(), tail, val, entropy, worst);
  }
}

TEST(ShardedTraining, ParamsCarryTheShardingTheOptimizerNeeds) {
  const Communicator& comm = world();
  const CharLmConfig c = config();
  ShardedCharLm model(c, kSeed, comm);
  const auto infos = charlm_param_infos(c);
  ASSERT_EQ(model.params().size(), infos.size());
  const CharLmWeights full = init_charlm_weights(c, kSeed);
  for (std::size_t p = 0; p < infos.size(); ++p) {
    const ShardedParam& sp = model.params()[p];
    EXPECT_EQ(sp.name, infos[p].name);
    EXPECT_EQ(sp.rows, infos[p].rows);
    EXPECT_EQ(sp.cols, infos[p].cols);
    EXPECT_EQ(sp.sharded, infos[p].kind == ParamKind::kMuon);
    const Matrix want =
        sp.sharded ? row_shard(*full.list()[p], sp.sharding, comm.rank()) : *full.list()[p];
    EXPECT_EQ(relative_error(sp.value.view(), want.view()), 0.0) << sp.name;
    if (sp.sharded) {
      EXPECT_EQ(sp.sharding, RowSharding::make(sp.rows, sp.cols, comm.size()));
      EXPECT_EQ(sp.value.rows(), sp.sharding.shard_rows);
    }
  }
}

TEST(ShardedTraining, RankMismatchesThrowOnEveryRank) {
  const Communicator& comm = world();
  const CharLmConfig c = config();
  // A different seed on the last rank (at one rank there is no other rank to disagree with).
  if (comm.size() > 1) {
    EXPECT_THROW(ShardedCharLm(c, comm.rank() == comm.size() - 1 ? kSeed + 1 : kSeed, comm),
                 CollectiveError);
  }
  ShardedCharLm model(c, kSeed, comm);
  const TextData data = text();
  // Unequal batches: the last rank takes one window fewer (empty at one rank).
  CharBatch b = data.train_batch(0, comm.rank(), comm.size(), 4 * comm.size());
  if (comm.rank() == comm.size() - 1) {
    b.targets.resize(comm.size() > 1 ? 3 : 0);
    b.tokens.resize(b.targets.size() * 8);
  }
  EXPECT_THROW(model.forward_backward(b), CollectiveError);
  // A bad token on one rank is reported on all of them.
  CharBatch bad = data.train_batch(0, comm.rank(), comm.size(), 4 * comm.size());
  if (comm.rank() == 0) bad.tokens[0] = 999;
  EXPECT_THROW(model.forward_backward(bad), CollectiveError);
  EXPECT_THROW(model.evaluate(bad), CollectiveError);
}

}  // namespace
}  // namespace distmuon
