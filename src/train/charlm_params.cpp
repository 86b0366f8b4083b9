// The character-level model's configuration, parameter list and deterministic initialisation.
#include <fmt/format.h>

#include <cmath>

#include "distmuon/charlm.h"
#include "distmuon/error.h"
#include "train/counter_rng.h"
#include "train/train_names.h"

namespace distmuon {
namespace {

void require_positive(const char* field, long long value, long long max) {
  if (value < 1 || value > max) {
    throw Error(fmt::format("charlm config: {} = {} must be in [1, {}]", field, value, max));
  }
}

// Standard deviation of parameter `index` (charlm_param_infos order) at initialisation.
double init_std(const CharLmConfig& c, const CharLmParamInfo& info) {
  if (info.name == "embedding") return 1.0;
  if (info.name.ends_with(".fc2"))
    return 1.0 / std::sqrt(static_cast<double>(c.ffn) * 2.0 * c.layers);
  return 1.0 / std::sqrt(static_cast<double>(info.cols));
}

}  // namespace

void CharLmConfig::validate() const {
  if (vocab < 2 || vocab > 256) {
    throw Error(
        fmt::format("charlm config: vocab = {} must be in [2, 256] (byte-level tokens)", vocab));
  }
  require_positive("context", context, 4096);
  require_positive("embed", embed, 1 << 16);
  require_positive("hidden", hidden, 1 << 16);
  require_positive("ffn", ffn, 1 << 18);
  require_positive("layers", layers, 1024);
  if (!(norm_eps > 0.0f) || !std::isfinite(norm_eps)) {
    throw Error(
        fmt::format("charlm config: norm_eps = {} must be a positive finite number", norm_eps));
  }
}

const char* to_string(ParamKind kind) {
  return detail::name_of(kind);
}

std::vector<CharLmParamInfo> charlm_param_infos(const CharLmConfig& c) {
  std::vector<CharLmParamInfo> out;
  out.push_back({"embedding", ParamKind::kAdamW, c.vocab, c.embed});
  out.push_back({"input", ParamKind::kMuon, c.hidden, static_cast<Index>(c.context) * c.embed});
  for (int l = 0; l < c.layers; ++l) {
    out.push_back({fmt::format("blocks.{}.fc1", l), ParamKind::kMuon, c.ffn, c.hidden});
    out.push_back({fmt::format("blocks.{}.fc2", l), ParamKind::kMuon, c.hidden, c.ffn});
  }
  out.push_back({"head", ParamKind::kAdamW, c.vocab, c.hidden});
  return out;
}

CharLmWeights CharLmWeights::zeros(const CharLmConfig& c) {
  c.validate();
  CharLmWeights w;
  for (const auto& info : charlm_param_infos(c)) {
    Matrix m(info.rows, info.cols);
    if (info.name == "embedding")
      w.embedding = std::move(m);
    else if (info.name == "input")
      w.input = std::move(m);
    else if (info.name == "head")
      w.head = std::move(m);
    else if (info.name.ends_with(".fc1"))
      w.fc1.push_back(std::move(m));
    else
      w.fc2.push_back(std::move(m));
  }
  return w;
}

std::vector<Matrix*> CharLmWeights::list() {
  std::vector<Matrix*> out{&embedding, &input};
  DISTMUON_ASSERT(fc1.size() == fc2.size(), "fc1 and fc2 counts differ");
  for (std::size_t l = 0; l < fc1.size(); ++l) {
    out.push_back(&fc1[l]);
    out.push_back(&fc2[l]);
  }
  out.push_back(&head);
  return out;
}

std::vector<const Matrix*> CharLmWeights::list() const {
  std::vector<const Matrix*> out;
  for (Matrix* m : const_cast<CharLmWeights*>(this)->list())
    out.push_back(m);
  return out;
}

Matrix init_charlm_rows(const CharLmConfig& c, std::uint64_t seed, std::size_t index, Index row0,
                        Index rows) {
  const auto infos = charlm_param_infos(c);
  if (index >= infos.size()) {
    throw Error(
        fmt::format("init_charlm_rows: parameter index {} outside the model's {} parameters", index,
                    infos.size()));
  }
  if (row0 < 0 || rows < 0)
    throw Error(fmt::format("init_charlm_rows: negative rows [{}, +{})", row0, rows));
  const CharLmParamInfo& info = infos[index];
  const double std_dev = init_std(c, info);
  const std::uint64_t stream = detail::hash_keys({seed, 0x636861726c6dULL /* "charlm" */, index});
  Matrix out(rows, info.cols);
  for (Index i = 0; i < rows && row0 + i < info.rows; ++i) {
    const auto row = static_cast<std::uint64_t>(row0 + i);
    for (Index j = 0; j < info.cols; ++j) {
      const std::uint64_t key = detail::hash_keys({stream, row, static_cast<std::uint64_t>(j)});
      out(i, j) = static_cast<float>(std_dev * detail::normal_from(key));
    }
  }
  return out;
}

CharLmWeights init_charlm_weights(const CharLmConfig& c, std::uint64_t seed) {
  CharLmWeights w = CharLmWeights::zeros(c);
  const std::vector<Matrix*> list = w.list();
  for (std::size_t p = 0; p < list.size(); ++p)
    *list[p] = init_charlm_rows(c, seed, p, 0, list[p]->rows());
  return w;
}

}  // namespace distmuon
