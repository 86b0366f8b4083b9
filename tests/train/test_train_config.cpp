// The embedded default training config, JSON overrides and errors that name the field.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "distmuon/cost_model.h"
#include "distmuon/error.h"
#include "distmuon/model_preset.h"
#include "distmuon/train_config.h"

namespace distmuon {
namespace {

using nlohmann::json;

std::string error_of(const json& overrides) {
  try {
    parse_train_config(overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TrainConfig, DefaultIsTheEmbeddedFileAndValid) {
  const TrainConfig c = default_train_config();
  EXPECT_FALSE(default_train_config_text().empty());
  const json file = json::parse(default_train_config_text());
  EXPECT_EQ(c.model.hidden, file["model"]["hidden"].get<int>());
  EXPECT_EQ(c.model.ffn, file["model"]["ffn"].get<int>());
  EXPECT_EQ(c.train.steps, file["train"]["steps"].get<int>());
  EXPECT_EQ(c.data.path, std::string(kDefaultTextPath));
  EXPECT_TRUE(c.optimizer.is_object());
  // The struct defaults describe the same run as the embedded file (apart from the optimizer's
  // options, which only the file holds).
  EXPECT_EQ(c.model, CharLmConfig{});
  const json plain = to_json(TrainConfig{});
  EXPECT_EQ(plain["data"], to_json(c)["data"]);
  EXPECT_EQ(plain["train"], to_json(c)["train"]);
  EXPECT_NO_THROW(c.model.validate());
  // A full round trip through to_json gives the same config.
  const TrainConfig again = parse_train_config(to_json(c));
  EXPECT_EQ(again.model, c.model);
  EXPECT_EQ(to_json(again), to_json(c));
}

// The plan spec "train-default" (its shapes read from configs/train-default.json when the core
// library is built) is the trainer's own model; another config gives other shapes.
TEST(TrainConfig, TheTrainDefaultPlanSpecIsTheTrainersModel) {
  EXPECT_EQ(train_default_weights(), charlm_muon_weights(default_train_config().model));
  const TrainConfig tiny =
      parse_train_config({{"model", {{"hidden", 32}, {"ffn", 64}, {"layers", 2}, {"context", 4}}}});
  const std::vector<WeightShape> small = charlm_muon_weights(tiny.model);
  ASSERT_EQ(small.size(), 3u);
  EXPECT_EQ(small[0], (WeightShape{"input", 32, 4 * tiny.model.embed, 1, false}));
  EXPECT_EQ(small[1], (WeightShape{"fc1", 64, 32, 2, false}));
  EXPECT_EQ(small[2], (WeightShape{"fc2", 32, 64, 2, false}));
}

TEST(TrainConfig, OverridesMergeIntoDefaults) {
  const TrainConfig c =
      parse_train_config(json{{"model", {{"layers", 2}}}, {"train", {{"seed", 7}, {"batch", 64}}}});
  const TrainConfig d = default_train_config();
  EXPECT_EQ(c.model.layers, 2);
  EXPECT_EQ(c.model.hidden, d.model.hidden);
  EXPECT_EQ(c.train.seed, 7u);
  EXPECT_EQ(c.train.batch, 64);
  EXPECT_EQ(c.data_options().seed, 7u);
  EXPECT_EQ(c.data_options().context, c.model.context);
}

TEST(TrainConfig, ErrorsNameTheBadField) {
  EXPECT_NE(error_of({{"model", {{"hidden", "wide"}}}}).find("model.hidden"), std::string::npos);
  EXPECT_NE(error_of({{"model", {{"hiden", 5}}}}).find("model.hiden"), std::string::npos);
  EXPECT_NE(error_of({{"train", {{"steps", 0}}}}).find("train.steps"), std::string::npos);
  EXPECT_NE(error_of({{"train", {{"seed", -1}}}}).find("train.seed"), std::string::npos);
  EXPECT_NE(error_of({{"model", {{"layers", 4294967302LL}}}}).find("model.layers"),
            std::string::npos);  // no wrap
  EXPECT_NE(error_of({{"model", {{"layers", 2.5}}}}).find("model.layers"), std::string::npos);
  EXPECT_NE(error_of({{"data", {{"val_fraction", 1.5}}}}).find("data.val_fraction"),
            std::string::npos);
  EXPECT_NE(error_of({{"data", {{"split_block", 8}}}}).find("data.split_block"), std::string::npos);
  EXPECT_NE(error_of({{"model", {{"vocab", 1000}}}}).find("model.vocab"), std::string::npos);
  EXPECT_NE(error_of({{"modle", json::object()}}).find("modle"), std::string::npos);
  EXPECT_NE(error_of({{"optimizer", 3}}).find("optimizer"), std::string::npos);
}

TEST(TrainConfig, LoadsAFileAndNamesItInErrors) {
  const std::string path = ::testing::TempDir() + "distmuon_train_config_test.json";
  {
    std::ofstream out(path);
    out << R"({"model": {"ffn": 512}})";
  }
  EXPECT_EQ(load_train_config(path).model.ffn, 512);
  {
    std::ofstream out(path);
    out << R"({"model": {"ffn": 512,}})";
  }
  try {
    load_train_config(path);
    FAIL() << "malformed JSON accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
  EXPECT_THROW(load_train_config(path), Error);
}

TEST(TrainConfig, OptimizerSectionUsesMuonOptionNames) {
  // The embedded default names real MuonOptions fields, and they reach the optimizer's options.
  const TrainConfig d = default_train_config();
  const MuonOptions o = optimizer_options(d);
  const json file = json::parse(default_train_config_text())["optimizer"];
  EXPECT_EQ(o.lr, file["lr"].get<double>());
  EXPECT_EQ(o.momentum, file["momentum"].get<double>());
  EXPECT_EQ(o.adamw.lr, file["adamw"]["lr"].get<double>());
  EXPECT_EQ(o.tp_mode, TpMode::kAuto);
  // Auto chooses how to parallelise, not the mathematics: standard NS unless asked otherwise.
  EXPECT_EQ(file["ns_algorithm"], "standard");
  EXPECT_EQ(o.ns_algorithm, NsAlgorithm::kStandard);
  EXPECT_EQ(o.profile, "none");
  // A partial section keeps MuonOptions' defaults for the rest.
  const MuonOptions p = optimizer_options(parse_train_config(
      json{{"optimizer", {{"lr", 0.05}, {"tp_mode", "distributed"}, {"adamw", {{"lr", 0.01}}}}}}));
  EXPECT_EQ(p.lr, 0.05);
  EXPECT_EQ(p.tp_mode, TpMode::kDistributed);
  EXPECT_EQ(p.adamw.lr, 0.01);
  EXPECT_EQ(p.adamw.beta2, d.optimizer["adamw"]["beta2"].get<double>());
  TrainConfig empty;
  EXPECT_EQ(json(optimizer_options(empty)), json(MuonOptions{}));

  // Errors name the field.
  EXPECT_NE(error_of({{"optimizer", {{"lrr", 0.1}}}}).find("optimizer.lrr"), std::string::npos);
  EXPECT_NE(error_of({{"optimizer", {{"adamw", {{"beta3", 0.1}}}}}}).find("optimizer.adamw.beta3"),
            std::string::npos);
  EXPECT_NE(error_of({{"optimizer", {{"lr", "big"}}}}).find("optimizer.lr"), std::string::npos);
  EXPECT_NE(error_of({{"optimizer", {{"steps", 2.5}}}}).find("optimizer.steps"), std::string::npos);
  EXPECT_NE(error_of({{"optimizer", {{"tp_mode", "sideways"}}}}).find("sideways"),
            std::string::npos);
  EXPECT_NE(error_of({{"optimizer", {{"momentum", 1.5}}}}).find("momentum"), std::string::npos);
  EXPECT_NE(error_of({{"optimizer", {{"adamw", {{"lr", -1}}}}}}).find("lr"), std::string::npos);
}

// The default model is meant to show both modes at 2 ranks: tall fc1 (distributed iterates on the
// 256 x 256 Gram of half the rows) and wide fc2 (distributed would need a 2048 x 2048 Gram). With
// no profile the cost model compares FLOPs, which decides these shapes by a factor of 2 and 24.
TEST(TrainConfig, DefaultModelHasShapesForEitherModeAtTwoRanks) {
  const TrainConfig d = default_train_config();
  bool duplicated = false, distributed = false;
  for (const CharLmParamInfo& p : charlm_param_infos(d.model)) {
    if (p.kind != ParamKind::kMuon) continue;
    const AutoKey key{.m = p.rows, .n = p.cols, .group_size = 2, .partition_dim = 0};
    const TpMode choice = estimate(key, nullptr, CostModel::kRefined).choice;
    (choice == TpMode::kDistributed ? distributed : duplicated) = true;
  }
  EXPECT_TRUE(duplicated);
  EXPECT_TRUE(distributed);
}

}  // namespace
}  // namespace distmuon
