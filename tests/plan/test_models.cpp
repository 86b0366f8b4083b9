// Model presets: the derived Muon weight shapes and counts, checked shape by shape for two
// presets and against the published parameter counts for all; malformed preset files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "distmuon/error.h"
#include "distmuon/model_preset.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::map<std::string, WeightShape> by_name(const std::vector<WeightShape>& ws) {
  std::map<std::string, WeightShape> out;
  for (const auto& w : ws)
    out[w.name] = w;
  return out;
}

void expect_shape(const std::map<std::string, WeightShape>& ws, const std::string& name, Index m,
                  Index n, Index count) {
  ASSERT_TRUE(ws.contains(name)) << name;
  EXPECT_EQ(ws.at(name).m, m) << name;
  EXPECT_EQ(ws.at(name).n, n) << name;
  EXPECT_EQ(ws.at(name).count, count) << name;
}

TEST(ModelPresets, Llama3_8bShapes) {
  const auto ws = by_name(muon_weights(resolve_model("llama3-8b")));
  EXPECT_EQ(ws.size(), 4u);
  expect_shape(ws, "attn.qkv", (32 + 2 * 8) * 128, 4096, 32);  // fused [(heads + 2 kv) d, hidden]
  expect_shape(ws, "attn.o", 4096, 32 * 128, 32);
  expect_shape(ws, "mlp.fc1", 2 * 14336, 4096, 32);  // gate and up fused
  expect_shape(ws, "mlp.fc2", 4096, 14336, 32);
}

TEST(ModelPresets, KimiK2AndQwen3Shapes) {
  const auto k2 = by_name(muon_weights(resolve_model("kimi-k2")));
  expect_shape(k2, "attn.q_b", 64 * (128 + 64), 1536, 61);  // 64 heads (DeepSeek-V3: 128)
  expect_shape(k2, "attn.o", 7168, 64 * 128, 61);
  expect_shape(k2, "mlp.fc1", 2 * 18432, 7168, 1);  // one dense layer
  expect_shape(k2, "expert.fc1", 2 * 2048, 7168, 60 * 384);
  expect_shape(k2, "router", 384, 7168, 60);
  const auto q3 = by_name(muon_weights(resolve_model("qwen3-30b-a3b")));
  expect_shape(q3, "attn.qkv", (32 + 2 * 4) * 128, 2048, 48);  // head_dim 128 != 2048 / 32
  expect_shape(q3, "attn.o", 2048, 32 * 128, 48);
  expect_shape(q3, "expert.fc2", 2048, 768, 48 * 128);
  EXPECT_FALSE(q3.contains("mlp.fc1"));  // every layer is MoE
  EXPECT_FALSE(q3.contains("shared_expert.fc1"));
}

TEST(ModelPresets, DeepSeekV3DenseLayersExpertsAndMla) {
  const auto all = muon_weights(resolve_model("deepseek-v3"));
  const auto ws = by_name(all);
  expect_shape(ws, "attn.q_a", 1536, 7168, 61);
  expect_shape(ws, "attn.q_b", 128 * (128 + 64), 1536, 61);
  expect_shape(ws, "attn.kv_a", 512 + 64, 7168, 61);
  expect_shape(ws, "attn.kv_b", 128 * (128 + 128), 512, 61);
  expect_shape(ws, "attn.o", 7168, 128 * 128, 61);
  expect_shape(ws, "mlp.fc1", 2 * 18432, 7168, 3);  // the first three layers are dense
  expect_shape(ws, "mlp.fc2", 7168, 18432, 3);
  expect_shape(ws, "expert.fc1", 2 * 2048, 7168, 58 * 256);
  expect_shape(ws, "expert.fc2", 7168, 2048, 58 * 256);
  expect_shape(ws, "shared_expert.fc1", 2 * 2048, 7168, 58);
  expect_shape(ws, "router", 256, 7168, 58);
  EXPECT_TRUE(ws.at("expert.fc1").expert);
  EXPECT_FALSE(ws.at("shared_expert.fc1").expert);
}

// Muon weights plus embeddings (and an untied output head) add up to the published sizes within
// 1%: a check that no weight is missing or double counted.
TEST(ModelPresets, ParameterCountsMatchThePublishedSizes) {
  // Kimi K2: the published checkpoint (moonshotai/Kimi-K2-Instruct on Hugging Face) holds 1026.5B
  // parameters, its fp8 block scales (~0.06B) included; the model card rounds to 1T and the tech
  // report's table (arXiv 2507.20534) says 1.04T, 1.3% above the checkpoint.
  const struct {
    const char* name;
    double published;
    bool tied;
    double tolerance = 0.01;
  } cases[] = {{"llama3-8b", 8.03e9, false},    {"llama3-70b", 70.6e9, false},
               {"llama3-405b", 405.9e9, false}, {"gpt3-175b", 175.0e9, true},
               {"qwen2.5-72b", 72.7e9, false},  {"deepseek-v3", 671e9, false},
               {"kimi-k2", 1026.5e9, false},    {"qwen3-30b-a3b", 30.5e9, false},
               {"qwen3-32b", 32.8e9, false}};
  EXPECT_EQ(builtin_models().size(), std::size(cases));
  for (const auto& c : cases) {
    const ModelPreset m = resolve_model(c.name);
    double params = static_cast<double>(m.vocab) * static_cast<double>(m.hidden) * (c.tied ? 1 : 2);
    for (const auto& w : muon_weights(m))
      params += static_cast<double>(w.m) * w.n * w.count;
    EXPECT_NEAR(params / c.published, 1.0, c.tolerance) << c.name << ": " << params;
  }
}

// train-default names the training run's model: its shapes are read from the embedded training
// config (input [H, C*E], fc1 [F, H] and fc2 [H, F] once per block) when the library is built;
// test_charlm checks them against the trainer's own list.
TEST(ModelPresets, TrainDefaultIsTheTrainingModel) {
  const auto ws = by_name(model_weights("Train-Default"));
  ASSERT_EQ(ws.size(), 3u);
  EXPECT_EQ(model_weights(kTrainDefaultModel), train_default_weights());
  EXPECT_EQ(model_weights("llama3-8b").size(), muon_weights(resolve_model("llama3-8b")).size());
}

TEST(ModelPresets, JsonFilesDescribeOtherModels) {
  const fs::path file =
      fs::temp_directory_path() / ("distmuon-test-model-" + std::to_string(getpid()) + ".json");
  json j = {{"name", "tiny"}, {"hidden", 256}, {"ffn", 1024},   {"heads", 4},
            {"kv_heads", 2},  {"layers", 2},   {"vocab", 1000}, {"gated_ffn", false}};
  std::ofstream(file) << j.dump();
  const ModelPreset m = resolve_model(file.string());
  EXPECT_EQ(m.resolved_head_dim(), 64);
  const auto ws = by_name(muon_weights(m));
  expect_shape(ws, "attn.qkv", (4 + 4) * 64, 256, 2);
  expect_shape(ws, "mlp.fc1", 1024, 256, 2);  // not gated: fc1 [ffn, hidden]
  EXPECT_EQ(json(m).get<ModelPreset>(), [&] {
    ModelPreset r = m;
    r.head_dim = 64;  // to_json writes the resolved head_dim
    return r;
  }());

  const auto error_of = [&](json bad) {
    std::ofstream(file) << bad.dump();
    try {
      load_model(file);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  json bad = j;
  bad.erase("layers");
  EXPECT_NE(error_of(bad).find("'layers'"), std::string::npos);
  bad = j;
  bad["kv_heads"] = 3;
  EXPECT_NE(error_of(bad).find("'kv_heads'"), std::string::npos);
  bad = j;
  bad["moe"] = {{"experts", 8}};
  EXPECT_NE(error_of(bad).find("'expert_ffn'"), std::string::npos);
  fs::remove(file);
  try {
    resolve_model("llama9");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("llama3-70b"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace distmuon
