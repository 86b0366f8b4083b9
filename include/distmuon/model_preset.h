#pragma once
// Model presets: the architecture numbers that fix a transformer's Muon weight shapes, and the
// list of those shapes with their counts (what `distmuon plan --model` plans).
//
// A preset is a JSON object (models/*.json):
//   {"name": "llama3-8b", "hidden": 4096, "ffn": 14336, "heads": 32, "kv_heads": 8,
//    "layers": 32, "vocab": 128256, "head_dim": 128, "gated_ffn": true,
//    "moe": {"experts": 256, "expert_ffn": 2048, "shared_experts": 1, "dense_layers": 3},
//    "mla": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
//            "qk_rope_head_dim": 64, "v_head_dim": 128},
//    "source": "..."}
// head_dim defaults to hidden / heads; moe and mla are optional.
//
// Shapes are [out, in] (rows = outputs), as the weights are stored and sharded:
//  - attention: QKV fused [(heads + 2 kv_heads) head_dim, hidden], O [hidden, heads head_dim];
//    with MLA (DeepSeek): q_a [q_lora, hidden], q_b [heads (nope + rope), q_lora],
//    kv_a [kv_lora + rope, hidden], kv_b [heads (nope + v), kv_lora], O [hidden, heads v].
//  - MLP: gated (SwiGLU) gate and up fused [2 ffn, hidden] (Megatron's linear_fc1), down
//    [hidden, ffn]; not gated: fc1 [ffn, hidden], fc2 [hidden, ffn].
//  - MoE layers: per expert the same MLP with expert_ffn, a layer's experts one batched parameter
//    (batch = experts); shared experts likewise (not batched); the router [experts, hidden].
// Embeddings and the output head go to AdamW (Muon is for hidden matrices) and are not listed.
//
// Planning knows models only through these shapes. The demo trainer's default model is one more
// spec, "train-default": its shapes are read from configs/train-default.json when the library is
// built (train_default_weights; the trainer's charlm_muon_weights gives them for any config).

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "distmuon/matrix.h"

namespace distmuon {

struct MoeConfig {
  Index experts = 0;         // routed experts per MoE layer
  Index expert_ffn = 0;      // FFN size of one expert
  Index shared_experts = 0;  // always-active experts, same FFN size
  Index dense_layers =
      0;  // leading layers that keep a dense MLP (DeepSeek's first_k_dense_replace)
  friend bool operator==(const MoeConfig&, const MoeConfig&) = default;
};

struct MlaConfig {  // DeepSeek multi-head latent attention
  Index q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0,
        v_head_dim = 0;
  friend bool operator==(const MlaConfig&, const MlaConfig&) = default;
};

struct ModelPreset {
  std::string name;
  Index hidden = 0, ffn = 0, heads = 0, kv_heads = 0, layers = 0, vocab = 0;
  Index head_dim = 0;  // 0: hidden / heads
  bool gated_ffn = true;
  std::optional<MoeConfig> moe;
  std::optional<MlaConfig> mla;
  std::string source;

  Index resolved_head_dim() const { return head_dim > 0 ? head_dim : hidden / heads; }
  void validate() const;  // throws distmuon::Error naming the field
  friend bool operator==(const ModelPreset&, const ModelPreset&) = default;
};

void to_json(nlohmann::json& j, const ModelPreset& p);
void from_json(const nlohmann::json& j, ModelPreset& p);  // throws distmuon::Error naming the field

ModelPreset load_model(const std::filesystem::path& file);

// Folder of the built-in presets (source tree's models/, else the installed one).
std::filesystem::path models_dir();
const std::vector<ModelPreset>& builtin_models();  // sorted by name
// "none" is not a model: a name of the registry (exact, case-insensitive) or a JSON file. Throws
// listing the built-in names.
ModelPreset resolve_model(std::string_view spec);

// One Muon weight shape of a model and how many of it there are.
struct WeightShape {
  std::string name;  // "attn.qkv", "mlp.fc1", "expert.fc1", ...
  Index m = 0, n = 0;
  Index count = 0;
  bool expert = false;  // lives in the expert (MoE) groups
  // Matrices stacked in one parameter (a layer's experts: one [E, m, n] parameter of batch E, as
  // ParamSpec::batch); count / batch parameters. count is a multiple of batch.
  Index batch = 1;
  friend bool operator==(const WeightShape&, const WeightShape&) = default;
};
std::vector<WeightShape> muon_weights(const ModelPreset& model);

// The demo trainer's default model (configs/train-default.json) as a model spec.
inline constexpr std::string_view kTrainDefaultModel = "train-default";
// Its Muon weights: input [H, C*E] once, fc1 [F, H] and fc2 [H, F] once per block.
const std::vector<WeightShape>& train_default_weights();
// The Muon weights of a model spec: "train-default" (any case), else a built-in preset name or a
// preset JSON file (muon_weights(resolve_model(spec))).
std::vector<WeightShape> model_weights(std::string_view spec);

}  // namespace distmuon
