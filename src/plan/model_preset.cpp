#include "distmuon/model_preset.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>

#include "distmuon/error.h"
#include "distmuon/json_file.h"
#include "plan/data_folder.h"
#include "plan/json_fields.h"

namespace distmuon {
namespace {

using nlohmann::json;
constexpr std::string_view kWhat = "model preset";

Index index_field(const json& j, const char* key) {
  return detail::json_field<Index>(j, key, kWhat);
}
Index index_field_or(const json& j, const char* key, Index fallback) {
  return detail::json_field_or<Index>(j, key, fallback, kWhat);
}

// A size above 2^24 (the largest published models stay below 2^20 in every dimension) is a
// corrupt or mistyped file: refused before any shape or cost is computed from it.
constexpr Index kMaxPresetSize = Index{1} << 24;

void require_positive(Index v, const char* key) {
  if (v < 1) throw Error(fmt::format("model preset: field '{}' must be >= 1, got {}", key, v));
  if (v > kMaxPresetSize) {
    throw Error(fmt::format("model preset: field '{}' is {}, above the plausible maximum {}", key,
                            v, kMaxPresetSize));
  }
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// The MLP of one layer (or expert) as Muon weights.
void add_mlp(std::vector<WeightShape>& out, const std::string& prefix, Index hidden, Index ffn,
             bool gated, Index count, bool expert, Index batch = 1) {
  if (count <= 0) return;
  out.push_back({prefix + ".fc1", gated ? 2 * ffn : ffn, hidden, count, expert, batch});
  out.push_back({prefix + ".fc2", hidden, ffn, count, expert, batch});
}

}  // namespace

void ModelPreset::validate() const {
  if (name.empty()) throw Error("model preset: field 'name' is empty");
  require_positive(hidden, "hidden");
  require_positive(ffn, "ffn");
  require_positive(heads, "heads");
  require_positive(kv_heads, "kv_heads");
  require_positive(layers, "layers");
  require_positive(vocab, "vocab");
  if (heads % kv_heads != 0) {
    throw Error(fmt::format("model preset: field 'kv_heads' ({}) must divide 'heads' ({})",
                            kv_heads, heads));
  }
  if (head_dim == 0 && hidden % heads != 0) {
    throw Error(fmt::format(
        "model preset: field 'head_dim' is needed: 'heads' ({}) does not divide 'hidden' ({})",
        heads, hidden));
  }
  if (head_dim < 0) throw Error("model preset: field 'head_dim' must be >= 0");
  if (moe) {
    require_positive(moe->experts, "moe.experts");
    require_positive(moe->expert_ffn, "moe.expert_ffn");
    if (moe->shared_experts < 0)
      throw Error("model preset: field 'moe.shared_experts' must be >= 0");
    if (moe->dense_layers < 0 || moe->dense_layers > layers) {
      throw Error(
          fmt::format("model preset: field 'moe.dense_layers' must be in [0, layers = {}], got {}",
                      layers, moe->dense_layers));
    }
  }
  if (mla) {
    require_positive(mla->q_lora_rank, "mla.q_lora_rank");
    require_positive(mla->kv_lora_rank, "mla.kv_lora_rank");
    require_positive(mla->qk_nope_head_dim, "mla.qk_nope_head_dim");
    require_positive(mla->qk_rope_head_dim, "mla.qk_rope_head_dim");
    require_positive(mla->v_head_dim, "mla.v_head_dim");
  }
}

void to_json(json& j, const ModelPreset& p) {
  j = json{{"name", p.name},
           {"hidden", p.hidden},
           {"ffn", p.ffn},
           {"heads", p.heads},
           {"kv_heads", p.kv_heads},
           {"layers", p.layers},
           {"vocab", p.vocab},
           {"head_dim", p.resolved_head_dim()},
           {"gated_ffn", p.gated_ffn},
           {"source", p.source}};
  if (p.moe) {
    j["moe"] = {{"experts", p.moe->experts},
                {"expert_ffn", p.moe->expert_ffn},
                {"shared_experts", p.moe->shared_experts},
                {"dense_layers", p.moe->dense_layers}};
  }
  if (p.mla) {
    j["mla"] = {{"q_lora_rank", p.mla->q_lora_rank},
                {"kv_lora_rank", p.mla->kv_lora_rank},
                {"qk_nope_head_dim", p.mla->qk_nope_head_dim},
                {"qk_rope_head_dim", p.mla->qk_rope_head_dim},
                {"v_head_dim", p.mla->v_head_dim}};
  }
}

void from_json(const json& j, ModelPreset& p) {
  if (!j.is_object())
    throw Error(fmt::format("model preset: expected a JSON object, got {}", j.type_name()));
  ModelPreset out;
  out.name = detail::json_field<std::string>(j, "name", kWhat);
  out.hidden = index_field(j, "hidden");
  out.ffn = index_field(j, "ffn");
  out.heads = index_field(j, "heads");
  out.kv_heads = index_field_or(j, "kv_heads", out.heads);
  out.layers = index_field(j, "layers");
  out.vocab = index_field(j, "vocab");
  out.head_dim = index_field_or(j, "head_dim", 0);
  out.gated_ffn = detail::json_field_or<bool>(j, "gated_ffn", true, kWhat);
  out.source = detail::json_field_or<std::string>(j, "source", "", kWhat);
  if (j.contains("moe")) {
    const json& m = j["moe"];
    if (!m.is_object()) throw Error("model preset: field 'moe' must be an object");
    const auto sub = [&](const char* key) {
      return detail::json_field<Index>(m, key, "model preset field 'moe'");
    };
    out.moe =
        MoeConfig{sub("experts"), sub("expert_ffn"),
                  detail::json_field_or<Index>(m, "shared_experts", 0, "model preset field 'moe'"),
                  detail::json_field_or<Index>(m, "dense_layers", 0, "model preset field 'moe'")};
  }
  if (j.contains("mla")) {
    const json& a = j["mla"];
    if (!a.is_object()) throw Error("model preset: field 'mla' must be an object");
    const auto sub = [&](const char* key) {
      return detail::json_field<Index>(a, key, "model preset field 'mla'");
    };
    out.mla = MlaConfig{sub("q_lora_rank"), sub("kv_lora_rank"), sub("qk_nope_head_dim"),
                        sub("qk_rope_head_dim"), sub("v_head_dim")};
  }
  out.validate();
  p = std::move(out);
}

ModelPreset load_model(const std::filesystem::path& file) {
  const json j = read_json_file(file, "model preset");
  try {
    return j.get<ModelPreset>();
  } catch (const json::exception& e) {
    throw Error(
        fmt::format("model preset '{}': invalid JSON: {}", file.string(), json_error_text(e)));
  } catch (const Error& e) {
    throw Error(fmt::format("{} in '{}'", e.what(), file.string()));
  }
}

std::filesystem::path models_dir() {
  return detail::find_data_folder("models", {DISTMUON_MODELS_DIR, DISTMUON_INSTALL_MODELS_DIR});
}

const std::vector<ModelPreset>& builtin_models() {
  static const std::vector<ModelPreset> models = [] {
    std::vector<ModelPreset> out;
    for (const auto& entry : std::filesystem::directory_iterator(models_dir())) {
      if (entry.path().extension() == ".json") out.push_back(load_model(entry.path()));
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    return out;
  }();
  return models;
}

ModelPreset resolve_model(std::string_view spec) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(std::filesystem::path(spec), ec))
    return load_model(std::filesystem::path(spec));
  std::string names;
  for (const auto& m : builtin_models()) {
    if (lower(m.name) == lower(spec)) return m;
    names += (names.empty() ? "" : ", ") + m.name;
  }
  throw Error(
      fmt::format("unknown model '{}': not a file and not a built-in preset ({})", spec, names));
}

std::vector<WeightShape> model_weights(std::string_view spec) {
  if (lower(spec) == kTrainDefaultModel) return train_default_weights();
  return muon_weights(resolve_model(spec));
}

std::vector<WeightShape> muon_weights(const ModelPreset& model) {
  model.validate();
  const Index h = model.hidden, d = model.resolved_head_dim(), layers = model.layers;
  std::vector<WeightShape> out;
  if (model.mla) {
    const MlaConfig& a = *model.mla;
    out.push_back({"attn.q_a", a.q_lora_rank, h, layers, false});
    out.push_back({"attn.q_b", model.heads * (a.qk_nope_head_dim + a.qk_rope_head_dim),
                   a.q_lora_rank, layers, false});
    out.push_back({"attn.kv_a", a.kv_lora_rank + a.qk_rope_head_dim, h, layers, false});
    out.push_back({"attn.kv_b", model.heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank,
                   layers, false});
    out.push_back({"attn.o", h, model.heads * a.v_head_dim, layers, false});
  } else {
    out.push_back({"attn.qkv", (model.heads + 2 * model.kv_heads) * d, h, layers, false});
    out.push_back({"attn.o", h, model.heads * d, layers, false});
  }
  const Index dense_layers = model.moe ? model.moe->dense_layers : layers;
  add_mlp(out, "mlp", h, model.ffn, model.gated_ffn, dense_layers, false);
  if (model.moe) {
    const MoeConfig& e = *model.moe;
    const Index moe_layers = layers - e.dense_layers;
    add_mlp(out, "expert", h, e.expert_ffn, model.gated_ffn, moe_layers * e.experts, true,
            e.experts);
    add_mlp(out, "shared_expert", h, e.shared_experts * e.expert_ffn, model.gated_ffn,
            e.shared_experts > 0 ? moe_layers : 0, false);
    if (moe_layers > 0) out.push_back({"router", e.experts, h, moe_layers, false});
  }
  return out;
}

}  // namespace distmuon
