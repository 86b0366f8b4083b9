// MuonOptions: names, validation, JSON, and the scale factor.
#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "distmuon/error.h"
#include "distmuon/muon.h"

namespace distmuon {

WeightDecayMethod parse_weight_decay_method(std::string_view name) {
  if (name == "decoupled") return WeightDecayMethod::kDecoupled;
  if (name == "independent") return WeightDecayMethod::kIndependent;
  if (name == "l2") return WeightDecayMethod::kL2;
  throw Error(
      fmt::format("unknown weight decay method '{}'; valid: decoupled, independent, l2", name));
}

ScaleMode parse_scale_mode(std::string_view name) {
  if (name == "spectral") return ScaleMode::kSpectral;
  if (name == "shape_scaling") return ScaleMode::kShapeScaling;
  if (name == "unit_rms_norm") return ScaleMode::kUnitRmsNorm;
  throw Error(
      fmt::format("unknown scale mode '{}'; valid: spectral, shape_scaling, unit_rms_norm", name));
}

const char* to_string(WeightDecayMethod method) {
  switch (method) {
    case WeightDecayMethod::kDecoupled:
      return "decoupled";
    case WeightDecayMethod::kIndependent:
      return "independent";
    case WeightDecayMethod::kL2:
      return "l2";
  }
  return "?";
}

const char* to_string(ScaleMode mode) {
  switch (mode) {
    case ScaleMode::kSpectral:
      return "spectral";
    case ScaleMode::kShapeScaling:
      return "shape_scaling";
    case ScaleMode::kUnitRmsNorm:
      return "unit_rms_norm";
  }
  return "?";
}

const char* to_string(ParamRole role) {
  switch (role) {
    case ParamRole::kHidden:
      return "hidden";
    case ParamRole::kEmbedding:
      return "embedding";
    case ParamRole::kOutputHead:
      return "output_head";
    case ParamRole::kOther:
      return "other";
  }
  return "?";
}

double muon_scale(ScaleMode mode, Index m, Index n) {
  const auto dm = static_cast<double>(m), dn = static_cast<double>(n);
  switch (mode) {
    case ScaleMode::kSpectral:
      return std::sqrt(std::max(dm, dn));
    case ScaleMode::kShapeScaling:
      return std::sqrt(std::max(1.0, dm / dn));
    case ScaleMode::kUnitRmsNorm:
      return std::sqrt(dm / dn);
  }
  DISTMUON_ASSERT(false, "unknown scale mode");
}

void MuonOptions::validate() const {
  auto check = [](bool ok, const char* field, const std::string& value, const std::string& valid) {
    if (!ok)
      throw Error(fmt::format("Muon option {} = {} is invalid; valid: {}", field, value, valid));
  };
  check(std::isfinite(lr) && lr >= 0, "lr", fmt::format("{}", lr), "a finite number >= 0");
  check(momentum >= 0 && momentum < 1, "momentum", fmt::format("{}", momentum),
        "0 <= momentum < 1");
  check(std::isfinite(weight_decay) && weight_decay >= 0, "weight_decay",
        fmt::format("{}", weight_decay), "a finite number >= 0");
  check(std::isfinite(eps) && eps > 0, "eps", fmt::format("{}", eps), "a finite number > 0");
  check(std::isfinite(extra_scale_factor) && extra_scale_factor > 0, "extra_scale_factor",
        fmt::format("{}", extra_scale_factor), "a finite number > 0");
  check(cost_model == "refined" || cost_model == "reference", "cost_model", cost_model,
        "refined, reference");
  // The reference model prices standard NS only: auto would run standard where gram was asked.
  check(!(tp_mode == TpMode::kAuto && cost_model == "reference" &&
          ns_algorithm == NsAlgorithm::kGram),
        "ns_algorithm", "gram with tp_mode auto and cost_model reference",
        "standard or auto (the reference model prices standard NS only), or cost_model refined");
  check(!profile.empty(), "profile", "''", "none, a built-in profile name or a JSON file");
  check(wisdom.empty() || plan == PlanMode::kMeasure, "wisdom", wisdom,
        "empty unless plan = measure (the wisdom file holds measured times)");
  check(gram_restart >= 0, "gram_restart", fmt::format("{}", gram_restart),
        "an integer >= 0 (0 = automatic)");
  ns_options().validate();  // coefficient set name, custom table, steps
  adamw.validate();
}

NsOptions MuonOptions::ns_options() const {
  NsOptions o;
  if (coefficients == "custom") {
    if (custom_coefficients.empty()) {
      throw Error("Muon option coefficients = custom needs custom_coefficients 'a,b,c;a,b,c;...'");
    }
    o.coefficients = parse_custom_coefficients(custom_coefficients);
  } else {
    o.coefficients = coefficient_set(coefficients);  // throws, listing the valid names
  }
  o.steps = steps;
  o.eps = eps;
  o.use_syrk = use_syrk;
  o.algorithm = ns_algorithm == NsAlgorithm::kAuto ? NsAlgorithm::kStandard : ns_algorithm;
  o.gram_restart = gram_restart;
  return o;
}

void to_json(nlohmann::json& j, const MuonOptions& o) {
  j = nlohmann::json{{"lr", o.lr},
                     {"momentum", o.momentum},
                     {"nesterov", o.nesterov},
                     {"weight_decay", o.weight_decay},
                     {"weight_decay_method", to_string(o.weight_decay_method)},
                     {"coefficients", o.coefficients},
                     {"custom_coefficients", o.custom_coefficients},
                     {"steps", o.steps},
                     {"eps", o.eps},
                     {"use_syrk", o.use_syrk},
                     {"ns_algorithm", to_string(o.ns_algorithm)},
                     {"gram_restart", o.gram_restart},
                     {"scale_mode", to_string(o.scale_mode)},
                     {"extra_scale_factor", o.extra_scale_factor},
                     {"tp_mode", to_string(o.tp_mode)},
                     {"cost_model", o.cost_model},
                     {"profile", o.profile},
                     {"plan", to_string(o.plan)},
                     {"wisdom", o.wisdom},
                     {"adamw",
                      {{"lr", o.adamw.lr},
                       {"beta1", o.adamw.beta1},
                       {"beta2", o.adamw.beta2},
                       {"eps", o.adamw.eps},
                       {"weight_decay", o.adamw.weight_decay}}}};
}

void from_json(const nlohmann::json& j, MuonOptions& o) {
  j.at("lr").get_to(o.lr);
  j.at("momentum").get_to(o.momentum);
  j.at("nesterov").get_to(o.nesterov);
  j.at("weight_decay").get_to(o.weight_decay);
  o.weight_decay_method = parse_weight_decay_method(j.at("weight_decay_method").get<std::string>());
  j.at("coefficients").get_to(o.coefficients);
  j.at("custom_coefficients").get_to(o.custom_coefficients);
  j.at("steps").get_to(o.steps);
  // Absent in options written before eps was an option: keep the default.
  if (j.contains("eps")) j.at("eps").get_to(o.eps);
  j.at("use_syrk").get_to(o.use_syrk);
  // Absent in options written before the Gram algorithm existed: keep the defaults.
  if (j.contains("ns_algorithm"))
    o.ns_algorithm = parse_ns_algorithm(j.at("ns_algorithm").get<std::string>());
  if (j.contains("gram_restart")) j.at("gram_restart").get_to(o.gram_restart);
  o.scale_mode = parse_scale_mode(j.at("scale_mode").get<std::string>());
  j.at("extra_scale_factor").get_to(o.extra_scale_factor);
  o.tp_mode = parse_tp_mode(j.at("tp_mode").get<std::string>());
  j.at("cost_model").get_to(o.cost_model);
  j.at("profile").get_to(o.profile);
  // Absent in options written before measure mode: plan by the estimate.
  if (j.contains("plan")) o.plan = parse_plan_mode(j.at("plan").get<std::string>());
  if (j.contains("wisdom")) j.at("wisdom").get_to(o.wisdom);
  const auto& a = j.at("adamw");
  a.at("lr").get_to(o.adamw.lr);
  a.at("beta1").get_to(o.adamw.beta1);
  a.at("beta2").get_to(o.adamw.beta2);
  a.at("eps").get_to(o.adamw.eps);
  a.at("weight_decay").get_to(o.adamw.weight_decay);
}

}  // namespace distmuon
