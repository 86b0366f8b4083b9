// The training model's Muon weight shapes as a model spec (train_config.h).
#include <algorithm>
#include <cctype>
#include <string>

#include "distmuon/train_config.h"

namespace distmuon {

std::vector<WeightShape> charlm_muon_weights(const CharLmConfig& config) {
  std::vector<WeightShape> out;
  for (const CharLmParamInfo& p : charlm_param_infos(config)) {
    if (p.kind != ParamKind::kMuon) continue;
    // "blocks.<l>.fc1" -> "fc1": one entry per weight kind, counted over the blocks.
    const auto dot = p.name.rfind('.');
    const std::string name = dot == std::string::npos ? p.name : p.name.substr(dot + 1);
    const auto same = std::find_if(out.begin(), out.end(), [&](const WeightShape& w) {
      return w.name == name && w.m == p.rows && w.n == p.cols;
    });
    if (same != out.end()) {
      ++same->count;
    } else {
      out.push_back({name, p.rows, p.cols, 1, false});
    }
  }
  return out;
}

}  // namespace distmuon
