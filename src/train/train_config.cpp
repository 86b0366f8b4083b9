// Training configuration: the embedded defaults, JSON overrides and field-level validation.
#include "distmuon/train_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <vector>

#include "distmuon/error.h"
#include "distmuon/json_file.h"

namespace distmuon {
namespace detail {
extern const char* const kTrainDefaultConfigJson;  // generated from configs/train-default.json
}  // namespace detail

namespace {

using nlohmann::json;

// Reads the fields of one JSON object, naming "section.field" in every error, and rejects
// fields it was not asked for.
class Section {
 public:
  Section(const json& root, std::string name) : name_(std::move(name)) {
    if (!root.contains(name_))
      throw Error(fmt::format("train config: missing section '{}'", name_));
    obj_ = &root.at(name_);
    if (!obj_->is_object()) throw Error(fmt::format("train config: '{}' must be an object", name_));
  }

  // Reads a number into out after checking its JSON type and that it lies in [min, max] (checked
  // in 64-bit or double precision before narrowing, so a huge value cannot wrap into range).
  template <typename T>
  void read(const char* field, T& out, T min, T max) {
    seen_.insert(field);
    const json& v = at(field);
    const auto check = [&](auto value) {
      if (!(value >= min && value <= max))
        throw bad(field, fmt::format("{} is outside [{}, {}]", v.dump(), min, max));
      out = static_cast<T>(value);
    };
    if constexpr (std::is_floating_point_v<T>) {
      if (!v.is_number()) throw bad(field, fmt::format("expected a number, got {}", v.dump()));
      check(v.get<double>());
    } else if constexpr (std::is_unsigned_v<T>) {
      if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<std::int64_t>() < 0))
        throw bad(field, fmt::format("expected a non-negative integer, got {}", v.dump()));
      check(v.get<std::uint64_t>());
    } else {
      if (!v.is_number_integer())
        throw bad(field, fmt::format("expected an integer, got {}", v.dump()));
      if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(max)) {
        throw bad(field, fmt::format("{} is outside [{}, {}]", v.dump(), min, max));
      }
      check(v.get<std::int64_t>());
    }
  }

  void read(const char* field, std::string& out) {
    seen_.insert(field);
    const json& v = at(field);
    if (!v.is_string() || v.get<std::string>().empty())
      throw bad(field, fmt::format("expected a non-empty string, got {}", v.dump()));
    out = v.get<std::string>();
  }

  // Throws on a field that no read() asked for.
  void no_unknown_fields() const {
    for (const auto& [key, value] : obj_->items()) {
      if (!seen_.contains(key)) {
        throw Error(fmt::format("train config: unknown field '{}.{}' (valid: {})", name_, key,
                                fmt::join(seen_, ", ")));
      }
    }
  }

 private:
  const json& at(const char* field) const {
    if (!obj_->contains(field)) throw bad(field, "missing");
    return obj_->at(field);
  }
  Error bad(const char* field, const std::string& why) const {
    return Error(fmt::format("train config: field '{}.{}': {}", name_, field, why));
  }
  std::string name_;
  const json* obj_ = nullptr;
  std::set<std::string> seen_;
};

TrainConfig from_json(const json& j) {
  if (!j.is_object()) throw Error("train config: the top level must be a JSON object");
  for (const auto& [key, value] : j.items()) {
    if (key != "model" && key != "data" && key != "train" && key != "optimizer") {
      throw Error(fmt::format(
          "train config: unknown section '{}' (valid: model, data, train, optimizer)", key));
    }
  }
  TrainConfig c;
  constexpr int kMaxInt = std::numeric_limits<int>::max();
  constexpr Index kMaxIndex = std::numeric_limits<std::int32_t>::max();
  Section model(j, "model");
  model.read("vocab", c.model.vocab, 2, 256);
  model.read("context", c.model.context, 1, 4096);
  model.read("embed", c.model.embed, 1, 1 << 16);
  model.read("hidden", c.model.hidden, 1, 1 << 16);
  model.read("ffn", c.model.ffn, 1, 1 << 18);
  model.read("layers", c.model.layers, 1, 1024);
  model.read("norm_eps", c.model.norm_eps, std::numeric_limits<float>::min(), 1.0f);
  model.no_unknown_fields();

  Section data(j, "data");
  data.read("path", c.data.path);
  data.read("val_fraction", c.data.val_fraction, 1e-6, 1.0 - 1e-6);
  data.read("split_block", c.data.split_block, Index{2}, kMaxIndex);
  data.no_unknown_fields();
  if (c.data.split_block <= c.model.context) {
    throw Error(
        fmt::format("train config: field 'data.split_block': {} must exceed model.context = {}",
                    c.data.split_block, c.model.context));
  }

  Section train(j, "train");
  train.read("seed", c.train.seed, std::uint64_t{0}, std::numeric_limits<std::uint64_t>::max());
  train.read("steps", c.train.steps, 1, kMaxInt);
  train.read("batch", c.train.batch, Index{1}, kMaxIndex);
  train.read("log_every", c.train.log_every, 1, kMaxInt);
  train.read("eval_every", c.train.eval_every, 1, kMaxInt);
  train.read("eval_windows", c.train.eval_windows, Index{1}, kMaxIndex);
  train.read("device", c.train.device);
  train.read("weights", c.train.weights);
  if (c.train.weights != "sharded" && c.train.weights != "replicated") {
    throw Error(fmt::format(
        "train config: field 'train.weights': '{}' (valid: sharded, replicated)", c.train.weights));
  }
  train.no_unknown_fields();

  if (j.contains("optimizer")) {
    if (!j.at("optimizer").is_object()) throw Error("train config: 'optimizer' must be an object");
    c.optimizer = j.at("optimizer");
  }
  c.model.validate();
  optimizer_options(c);  // errors name the optimizer's field now, not when training starts
  return c;
}

}  // namespace

TextDataOptions TrainConfig::data_options() const {
  TextDataOptions o;
  o.context = model.context;
  o.val_fraction = data.val_fraction;
  o.split_block = data.split_block;
  o.seed = train.seed;
  return o;
}

const std::string& default_train_config_text() {
  static const std::string text = detail::kTrainDefaultConfigJson;
  return text;
}

TrainConfig default_train_config() {
  return parse_train_config(json::object());
}

TrainConfig parse_train_config(const json& overrides) {
  if (!overrides.is_object()) throw Error("train config: overrides must be a JSON object");
  json merged = json::parse(default_train_config_text());
  merged.merge_patch(overrides);
  return from_json(merged);
}

TrainConfig load_train_config(const std::string& path) {
  const json overrides = read_json_file(path, "train config");
  try {
    return parse_train_config(overrides);
  } catch (const Error& e) {
    throw Error(fmt::format("{} (in '{}')", e.what(), path));
  }
}

double train_memory_bytes(const TrainConfig& config, int ranks) {
  const CharLmConfig& m = config.model;
  double params = 0;
  for (const CharLmParamInfo& p : charlm_param_infos(m))
    params += static_cast<double>(p.rows) * static_cast<double>(p.cols);
  // Weights, gradients, Muon's momentum or AdamW's two moments, and NS's copy and workspace.
  const double state = 6 * params;
  // What CharLm::resize allocates per window: the input and its gradient (C x E each), the
  // residual stream (L + 1 layers of H), per block an inverse RMS, the normed input and two
  // activations of F, the final normed row, the probabilities (V) and three H / F gradient rows.
  const double c = m.context, e = m.embed, h = m.hidden, f = m.ffn, l = m.layers, v = m.vocab;
  const double per_window = 2 * c * e + (l + 1) * h + l * (1 + h + 2 * f) + h + v + 2 * h + f;
  const double r = std::max(ranks, 1);
  const double windows = std::max(std::ceil(static_cast<double>(config.train.batch) / r),
                                  std::ceil(static_cast<double>(config.train.eval_windows) / r));
  // The batches' token ids and targets (int32), training and validation, held at once.
  const double ids = 4 * (c + 1) * windows * 2;
  return sizeof(float) * (state + per_window * windows) + ids;
}

MuonOptions optimizer_options(const TrainConfig& config) {
  const json defaults = MuonOptions{};
  const json& given = config.optimizer;
  if (!given.is_object()) throw Error("train config: 'optimizer' must be an object");
  // Unknown fields first: a typo would otherwise silently keep the default.
  const auto check_fields = [](const json& obj, const json& valid, const std::string& prefix) {
    for (const auto& [key, value] : obj.items()) {
      if (!valid.contains(key)) {
        std::vector<std::string> names;
        for (const auto& [k, v] : valid.items())
          names.push_back(k);
        throw Error(fmt::format("train config: unknown field '{}{}' (valid: {})", prefix, key,
                                fmt::join(names, ", ")));
      }
    }
  };
  check_fields(given, defaults, "optimizer.");
  if (given.contains("adamw")) {
    if (!given.at("adamw").is_object())
      throw Error("train config: field 'optimizer.adamw' must be an object");
    check_fields(given.at("adamw"), defaults.at("adamw"), "optimizer.adamw.");
  }
  json merged = defaults;
  merged.merge_patch(given);
  MuonOptions o;
  // Field by field, so that a type error names its field.
  for (const auto& [key, value] : merged.items()) {
    const json& def = defaults.at(key);
    const auto type_ok = [](const json& v, const json& d) {
      if (d.is_number_integer()) return v.is_number_integer();
      return d.is_number() ? v.is_number() : v.type() == d.type();
    };
    bool ok = type_ok(value, def);
    if (ok && key == "adamw") {
      for (const auto& [k, v] : value.items())
        if (!type_ok(v, def.at(k))) {
          throw Error(fmt::format("train config: field 'optimizer.adamw.{}': expected a {}, got {}",
                                  k, def.at(k).type_name(), v.dump()));
        }
    }
    if (!ok) {
      throw Error(fmt::format("train config: field 'optimizer.{}': expected a {}, got {}", key,
                              def.type_name(), value.dump()));
    }
  }
  try {
    from_json(merged, o);
    o.validate();
  } catch (const json::exception& e) {
    throw Error(fmt::format("train config: 'optimizer': {}", e.what()));
  } catch (const Error& e) {
    throw Error(fmt::format("train config: 'optimizer': {}", e.what()));
  }
  return o;
}

nlohmann::json to_json(const TrainConfig& c) {
  return {
      {"model",
       {{"vocab", c.model.vocab},
        {"context", c.model.context},
        {"embed", c.model.embed},
        {"hidden", c.model.hidden},
        {"ffn", c.model.ffn},
        {"layers", c.model.layers},
        {"norm_eps", c.model.norm_eps}}},
      {"data",
       {{"path", c.data.path},
        {"val_fraction", c.data.val_fraction},
        {"split_block", c.data.split_block}}},
      {"train",
       {{"seed", c.train.seed},
        {"steps", c.train.steps},
        {"batch", c.train.batch},
        {"log_every", c.train.log_every},
        {"eval_every", c.train.eval_every},
        {"eval_windows", c.train.eval_windows},
        {"device", c.train.device},
        {"weights", c.train.weights}}},
      {"optimizer", c.optimizer},
  };
}

}  // namespace distmuon
