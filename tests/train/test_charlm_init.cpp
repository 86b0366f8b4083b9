// Parameter list, deterministic initialisation and FLOP counts of the character-level model.
#include <gtest/gtest.h>

#include <cmath>

#include "distmuon/charlm.h"
#include "distmuon/error.h"

namespace distmuon {
namespace {

CharLmConfig small_config() {
  CharLmConfig c;
  c.context = 4;
  c.embed = 8;
  c.hidden = 64;
  c.ffn = 256;
  c.layers = 2;
  return c;
}

TEST(CharLmInit, ParameterListOrderShapesAndKinds) {
  const CharLmConfig c = small_config();
  const auto infos = charlm_param_infos(c);
  ASSERT_EQ(infos.size(), 2u + 2u * 2u + 1u);
  EXPECT_EQ(infos[0].name, "embedding");
  EXPECT_EQ(infos[0].kind, ParamKind::kAdamW);
  EXPECT_EQ(infos[1].name, "input");
  EXPECT_EQ(infos[1].rows, 64);
  EXPECT_EQ(infos[1].cols, 32);
  EXPECT_EQ(infos[2].name, "blocks.0.fc1");
  EXPECT_EQ(infos[2].rows, 256);
  EXPECT_EQ(infos[2].cols, 64);
  EXPECT_EQ(infos[3].name, "blocks.0.fc2");
  EXPECT_EQ(infos[3].rows, 64);
  EXPECT_EQ(infos[3].cols, 256);
  EXPECT_EQ(infos[5].name, "blocks.1.fc2");
  EXPECT_EQ(infos.back().name, "head");
  EXPECT_EQ(infos.back().kind, ParamKind::kAdamW);
  for (std::size_t i = 1; i + 1 < infos.size(); ++i)
    EXPECT_EQ(infos[i].kind, ParamKind::kMuon) << infos[i].name;
  const CharLmWeights w = CharLmWeights::zeros(c);
  const auto list = w.list();
  for (std::size_t i = 0; i < infos.size(); ++i) {
    EXPECT_EQ(list[i]->rows(), infos[i].rows) << infos[i].name;
    EXPECT_EQ(list[i]->cols(), infos[i].cols) << infos[i].name;
  }
}

TEST(CharLmInit, DeterministicPerSeedAndRowBlocksMatchTheFullMatrix) {
  const CharLmConfig c = small_config();
  const CharLmWeights a = init_charlm_weights(c, 42), b = init_charlm_weights(c, 42),
                      d = init_charlm_weights(c, 43);
  for (std::size_t q = 0; q < a.list().size(); ++q) {
    EXPECT_EQ(relative_error(a.list()[q]->view(), b.list()[q]->view()), 0.0) << q;
    EXPECT_GT(relative_error(a.list()[q]->view(), d.list()[q]->view()), 0.5) << q;
  }
  // Rows [50, 70) of fc1 (256 rows) and rows past the end are zero padding.
  const Matrix rows = init_charlm_rows(c, 42, 2, 250, 10);
  for (Index i = 0; i < 10; ++i)
    for (Index j = 0; j < c.hidden; ++j)
      EXPECT_EQ(rows(i, j), i < 6 ? a.fc1[0](250 + i, j) : 0.0f);
  EXPECT_THROW(init_charlm_rows(c, 42, 99, 0, 1), Error);
}

TEST(CharLmInit, StandardDeviationsFollowFanIn) {
  const CharLmConfig c = small_config();
  const CharLmWeights w = init_charlm_weights(c, 7);
  const auto std_of = [](const Matrix& m) {
    double s = 0, ss = 0;
    for (float x : m.values()) {
      s += x;
      ss += static_cast<double>(x) * x;
    }
    const double n = static_cast<double>(m.size());
    return std::sqrt(ss / n - (s / n) * (s / n));
  };
  // 16k samples per matrix: the sample std is within ~1% of the true one; 5% is a safe bound.
  EXPECT_NEAR(std_of(w.fc1[0]), 1.0 / std::sqrt(64.0), 0.05 / std::sqrt(64.0));
  EXPECT_NEAR(std_of(w.fc2[1]), 1.0 / std::sqrt(256.0 * 4.0), 0.05 / std::sqrt(1024.0));
  EXPECT_NEAR(std_of(w.head), 1.0 / std::sqrt(64.0), 0.05 / std::sqrt(64.0));
  EXPECT_NEAR(std_of(w.embedding), 1.0, 0.05);
}

TEST(CharLmInit, FlopsCountEveryMatrixProduct) {
  const CharLmConfig c = small_config();
  // 2 * (C E H + L (H F + F H) + H V) per window forward, three times that for training.
  const double fwd = 2.0 * (4 * 8 * 64 + 2 * 2.0 * 64 * 256 + 64 * 256);
  EXPECT_DOUBLE_EQ(CharLm::forward_flops_per_window(c), fwd);
  EXPECT_DOUBLE_EQ(CharLm::train_flops_per_window(c), 3 * fwd);
}

TEST(CharLmInit, ConfigValidationNamesTheField) {
  CharLmConfig c = small_config();
  c.vocab = 300;
  try {
    c.validate();
    FAIL() << "vocab 300 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab"), std::string::npos) << e.what();
  }
  c = small_config();
  c.layers = 0;
  EXPECT_THROW(c.validate(), Error);
  c = small_config();
  c.norm_eps = 0.0f;
  EXPECT_THROW(CharLm{c}, Error);
}

}  // namespace
}  // namespace distmuon
