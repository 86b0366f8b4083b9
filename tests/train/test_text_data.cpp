// Byte-level text data: the split, windows, deterministic sampling and the unigram entropy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <string>

#include "distmuon/error.h"
#include "distmuon/text_data.h"

namespace distmuon {
namespace {

// 10,000 bytes of text-like content where every byte value used is known.
std::vector<std::uint8_t> sample_text() {
  std::vector<std::uint8_t> t;
  const std::string words[] = {"the ", "free ",   "software ", "licence ",
                               "of ",  "copies ", "and ",      "program\n"};
  for (std::size_t i = 0; t.size() < 10000; ++i) {
    const std::string& w = words[(i * 5 + i / 3) % 8];
    t.insert(t.end(), w.begin(), w.end());
  }
  t.resize(10000);
  return t;
}

TextDataOptions options(std::uint64_t seed) {
  TextDataOptions o;
  o.context = 8;
  o.val_fraction = 0.2;
  o.split_block = 256;
  o.seed = seed;
  return o;
}

TEST(TextData, SplitCoversTheTextAndIsDeterministicPerSeed) {
  const TextData a(sample_text(), options(1)), b(sample_text(), options(1)),
      c(sample_text(), options(2));
  EXPECT_EQ(a.split_bytes(Split::kTrain) + a.split_bytes(Split::kValidation), 10000);
  // 40 blocks (the last one 16 bytes), round(0.2 * 40) = 8 validation blocks.
  EXPECT_GE(a.split_bytes(Split::kValidation), 7 * 256 + 16);
  EXPECT_LE(a.split_bytes(Split::kValidation), 8 * 256);
  for (Split s : {Split::kTrain, Split::kValidation}) {
    ASSERT_EQ(a.windows(s), b.windows(s));
    for (Index i = 0; i < a.windows(s); ++i)
      ASSERT_EQ(a.target_position(s, i), b.target_position(s, i));
  }
  // Another seed holds out other blocks.
  std::set<Index> va, vc;
  for (Index i = 0; i < a.windows(Split::kValidation); ++i)
    va.insert(a.target_position(Split::kValidation, i) / 256);
  for (Index i = 0; i < c.windows(Split::kValidation); ++i)
    vc.insert(c.target_position(Split::kValidation, i) / 256);
  EXPECT_NE(va, vc);
}

TEST(TextData, WindowsStayInsideOneSplitAndAreDistinct) {
  const TextData d(sample_text(), options(3));
  std::set<Index> val_blocks;
  for (Index i = 0; i < d.windows(Split::kValidation); ++i)
    val_blocks.insert(d.target_position(Split::kValidation, i) / 256);
  Index total = 0;
  for (Split s : {Split::kTrain, Split::kValidation}) {
    std::set<Index> targets;
    for (Index i = 0; i < d.windows(s); ++i) {
      const Index p = d.target_position(s, i);
      targets.insert(p);
      // Every byte of the window (context and target) is in a block of this split.
      for (Index j = p - 8; j <= p; ++j)
        ASSERT_EQ(val_blocks.contains(j / 256), s == Split::kValidation) << p;
    }
    EXPECT_EQ(static_cast<Index>(targets.size()), d.windows(s));  // no window counted twice
    total += d.windows(s);
  }
  // Each segment loses its first C positions as targets; at most 2 * 8 + 1 segments exist.
  EXPECT_LE(total, 10000 - 2 * 8);
  EXPECT_GE(total, 10000 - 17 * 8);
  const CharBatch b = d.batch_of(Split::kTrain, std::vector<Index>{0, 5});
  const Index p = d.target_position(Split::kTrain, 5);
  ASSERT_EQ(b.size(), 2);
  for (int j = 0; j < 8; ++j)
    EXPECT_EQ(b.tokens[8 + static_cast<std::size_t>(j)],
              d.bytes()[static_cast<std::size_t>(p - 8 + j)]);
  EXPECT_EQ(b.targets[1], d.bytes()[static_cast<std::size_t>(p)]);
  EXPECT_THROW(d.target_position(Split::kTrain, d.windows(Split::kTrain)), Error);
}

TEST(TextData, TrainBatchesDependOnlyOnSeedStepAndGlobalIndex) {
  const TextData d(sample_text(), options(4));
  const CharBatch full = d.train_batch(17, 0, 1, 12);
  const CharBatch again = d.train_batch(17, 0, 1, 12);
  EXPECT_EQ(full.tokens, again.tokens);
  EXPECT_EQ(full.targets, again.targets);
  // Split over 2, 3 or 4 ranks, the ranks' parts concatenate to the single-rank batch.
  for (int ranks : {2, 3, 4}) {
    CharBatch joined;
    for (int r = 0; r < ranks; ++r) {
      const CharBatch part = d.train_batch(17, r, ranks, 12);
      EXPECT_EQ(part.size(), 12 / ranks);
      joined.tokens.insert(joined.tokens.end(), part.tokens.begin(), part.tokens.end());
      joined.targets.insert(joined.targets.end(), part.targets.begin(), part.targets.end());
    }
    EXPECT_EQ(joined.tokens, full.tokens) << ranks;
    EXPECT_EQ(joined.targets, full.targets) << ranks;
  }
  EXPECT_NE(d.train_batch(18, 0, 1, 12).tokens, full.tokens);
  const TextData other_seed(sample_text(), options(5));
  EXPECT_NE(other_seed.train_batch(17, 0, 1, 12).tokens, full.tokens);
  EXPECT_THROW(d.train_batch(0, 0, 5, 12), Error);  // 12 windows do not split over 5 ranks
}

TEST(TextData, TrainSamplingFollowsTheTrainingText) {
  const TextData d(sample_text(), options(6));
  const Index n = d.windows(Split::kTrain);
  const CharBatch b = d.train_batch(0, 0, 1, 20 * n);
  // Byte frequencies of the sampled targets against those of all training targets. With 20 n
  // (~150k) draws the standard error of a frequency is at most ~1.3e-3, so 5e-3 is ~4 sigma.
  std::vector<double> sampled(256, 0), text(256, 0);
  for (std::int32_t t : b.targets)
    sampled[static_cast<std::size_t>(t)] += 1.0 / static_cast<double>(b.size());
  for (Index i = 0; i < n; ++i)
    text[d.bytes()[static_cast<std::size_t>(d.target_position(Split::kTrain, i))]] +=
        1.0 / static_cast<double>(n);
  for (std::size_t v = 0; v < 256; ++v)
    EXPECT_NEAR(sampled[v], text[v], 5e-3) << v;
}

TEST(TextData, ValidationBatchIsFixedAndSharedOutOverRanks) {
  const TextData d(sample_text(), options(7));
  const Index w = d.windows(Split::kValidation);
  const CharBatch all =
      d.validation_batch(0, 1, w + 100);  // more than exist: all of them, in order
  ASSERT_EQ(all.size(), w);
  const CharBatch some = d.validation_batch(0, 1, 10);
  ASSERT_EQ(some.size(), 10);
  for (int ranks : {2, 3}) {
    CharBatch joined;
    for (int r = 0; r < ranks; ++r) {
      const CharBatch part = d.validation_batch(r, ranks, 10);
      joined.targets.insert(joined.targets.end(), part.targets.begin(), part.targets.end());
      joined.tokens.insert(joined.tokens.end(), part.tokens.begin(), part.tokens.end());
    }
    EXPECT_EQ(joined.targets, some.targets);
    EXPECT_EQ(joined.tokens, some.tokens);
  }
}

TEST(TextData, RejectsBadOptionsAndTexts) {
  TextDataOptions o = options(1);
  o.val_fraction = 1.0;
  EXPECT_THROW(TextData(sample_text(), o), Error);
  o = options(1);
  o.split_block = 8;  // not more than the context
  EXPECT_THROW(TextData(sample_text(), o), Error);
  EXPECT_THROW(TextData(std::vector<std::uint8_t>(200, 'a'), options(1)), Error);  // one block
  EXPECT_THROW(TextData::from_file("/nonexistent/distmuon/text", options(1)), Error);
}

TEST(TextData, UnigramEntropy) {
  EXPECT_DOUBLE_EQ(unigram_entropy({}), 0.0);
  const std::vector<std::uint8_t> one(100, 'x');
  EXPECT_DOUBLE_EQ(unigram_entropy(one), 0.0);
  std::vector<std::uint8_t> four;
  for (int i = 0; i < 400; ++i)
    four.push_back(static_cast<std::uint8_t>("abcd"[i % 4]));
  EXPECT_NEAR(unigram_entropy(four), std::log(4.0), 1e-12);
  const std::vector<std::uint8_t> skew = {'a', 'a', 'a', 'b'};  // -(3/4 ln 3/4 + 1/4 ln 1/4)
  EXPECT_NEAR(unigram_entropy(skew), -(0.75 * std::log(0.75) + 0.25 * std::log(0.25)), 1e-12);
}

TEST(TextData, DefaultTextLoads) {
  if (!std::filesystem::exists(kDefaultTextPath))
    GTEST_SKIP() << kDefaultTextPath << " is not on this system";
  TextDataOptions o;
  const TextData d = TextData::from_file(kDefaultTextPath, o);
  EXPECT_GT(d.windows(Split::kTrain), 8 * d.windows(Split::kValidation));
  const double h = unigram_entropy(d.bytes());
  EXPECT_GT(h, 2.0);  // English text: a little above 3 nats per byte
  EXPECT_LT(h, std::log(256.0));
}

}  // namespace
}  // namespace distmuon
