// MuonOptions: names, validation, JSON, and the scale factor.
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>
#include <utility>

#include "distmuon/agreement.h"
#include "distmuon/cost_model.h"
#include "distmuon/error.h"
#include "distmuon/muon.h"
#include "optim/muon_names.h"
#include "plan/plan_names.h"

namespace distmuon {

WeightDecayMethod parse_weight_decay_method(std::string_view name) {
  return detail::parse_enum<WeightDecayMethod>(name, "weight decay method");
}

ScaleMode parse_scale_mode(std::string_view name) {
  return detail::parse_enum<ScaleMode>(name, "scale mode");
}

ReplicaMode parse_replica_mode(std::string_view name) {
  return detail::parse_enum<ReplicaMode>(name, "replica mode");
}

const char* to_string(ReplicaMode mode) {
  return detail::name_of(mode);
}

ReplicaWire parse_replica_wire(std::string_view name) {
  return detail::parse_enum<ReplicaWire>(name, "replica wire");
}

const char* to_string(ReplicaWire wire) {
  return detail::name_of(wire);
}

MomentumDtype parse_momentum_dtype(std::string_view name) {
  return detail::parse_enum<MomentumDtype>(name, "momentum dtype");
}

const char* to_string(MomentumDtype dtype) {
  return detail::name_of(dtype);
}

ParamRole parse_param_role(std::string_view name) {
  return detail::parse_enum<ParamRole>(name, "parameter role");
}

const char* to_string(WeightDecayMethod method) {
  return detail::name_of(method);
}

const char* to_string(ScaleMode mode) {
  return detail::name_of(mode);
}

const char* to_string(ParamRole role) {
  return detail::name_of(role);
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
  // Every setting is used as a float32 factor: a finite double past float32's range (1e39) would
  // write infinities into the weights.
  const auto f32 = [](double v) { return std::isfinite(v) && std::abs(v) <= kMaxFloat32; };
  const std::string in_range =
      fmt::format("a number >= 0 and <= {:g} (float32's range)", kMaxFloat32);
  check(f32(lr) && lr >= 0, "lr", fmt::format("{}", lr), in_range);
  // momentum 1 keeps the buffer as it is (torch.optim.Muon's lerp with weight 0); above 1 the
  // buffer would grow geometrically with every step.
  check(momentum >= 0 && momentum <= 1, "momentum", fmt::format("{}", momentum),
        "0 <= momentum <= 1");
  check(f32(weight_decay) && weight_decay >= 0, "weight_decay", fmt::format("{}", weight_decay),
        in_range);
  check(f32(1.0 - lr * weight_decay) && f32(1.0 - weight_decay), "lr x weight_decay",
        fmt::format("{:g} x {:g}", lr, weight_decay),
        fmt::format("a decay factor 1 - lr x weight_decay within float32's range ({:g})",
                    kMaxFloat32));
  check(f32(eps) && eps > 0, "eps", fmt::format("{}", eps),
        fmt::format("a number > 0 and <= {:g} (float32's range)", kMaxFloat32));
  check(
      f32(extra_scale_factor) && extra_scale_factor > 0 && f32(lr * extra_scale_factor),
      "extra_scale_factor", fmt::format("{}", extra_scale_factor),
      fmt::format("a number > 0 whose product with lr is <= {:g} (float32's range)", kMaxFloat32));
  check(detail::find_enum<CostModel>(cost_model).has_value(), "cost_model", cost_model,
        detail::enum_name_list<CostModel>());
  // The reference model prices standard NS only: auto would run standard where gram was asked.
  check(!(any_auto() && cost_model == "reference" && ns_algorithm == NsAlgorithm::kGram),
        "ns_algorithm", "gram with tp_mode auto and cost_model reference",
        "standard or auto (the reference model prices standard NS only), or cost_model refined");
  check(!profile.empty(), "profile", "''", "none, a built-in profile name or a JSON file");
  check(wisdom.empty() || plan == PlanMode::kMeasure, "wisdom", wisdom,
        "empty unless plan = measure (the wisdom file holds measured times)");
  check(gram_restart >= 0, "gram_restart", fmt::format("{}", gram_restart),
        "an integer >= 0 (0 = automatic)");
  check(std::isfinite(step_timeout_s) && step_timeout_s >= 0 && step_timeout_s <= kMaxStepTimeout,
        "step_timeout_s", fmt::format("{}", step_timeout_s),
        fmt::format("a number of seconds from 0 (no step deadline) to {:g}", kMaxStepTimeout));
  ns_options().validate();  // coefficient set name, custom table, steps
  adamw.validate();
}

NsOptions MuonOptions::ns_options(Precision backend_default) const {
  NsOptions o;
  if (coefficients == "custom") {
    if (custom_coefficients.empty()) {
      throw Error("Muon option coefficients = custom needs custom_coefficients 'a,b,c;a,b,c;...'");
    }
    o.coefficients = parse_custom_coefficients(custom_coefficients);
  } else {
    o.coefficients = coefficient_set(coefficients);  // throws, listing the valid names
  }
  o.coefficients.warn_outside_band = schedule_warns;
  o.steps = steps;
  o.eps = eps;
  o.use_syrk = use_syrk;
  o.algorithm = ns_algorithm == NsAlgorithm::kAuto ? NsAlgorithm::kStandard : ns_algorithm;
  o.gram_restart = gram_restart;
  o.precision = precision.value_or(backend_default);
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
                     {"schedule_check", o.schedule_warns ? "warn" : "strict"},
                     {"eps", o.eps},
                     {"use_syrk", o.use_syrk},
                     {"ns_algorithm", to_string(o.ns_algorithm)},
                     {"gram_restart", o.gram_restart},
                     {"precision", o.precision ? to_string(*o.precision) : "auto"},
                     {"scale_mode", to_string(o.scale_mode)},
                     {"extra_scale_factor", o.extra_scale_factor},
                     {"tp_mode", to_string(o.tp_mode)},
                     {"expert_tp_mode", o.expert_tp_mode ? to_string(*o.expert_tp_mode) : "same"},
                     {"replica_mode", to_string(o.replica_mode)},
                     {"replica_wire", to_string(o.replica_wire)},
                     {"momentum_dtype", to_string(o.momentum_dtype)},
                     {"cost_model", o.cost_model},
                     {"profile", o.profile},
                     {"plan", to_string(o.plan)},
                     {"wisdom", o.wisdom},
                     {"step_timeout_s", o.step_timeout_s},
                     {"adamw",
                      {{"lr", o.adamw.lr},
                       {"beta1", o.adamw.beta1},
                       {"beta2", o.adamw.beta2},
                       {"eps", o.adamw.eps},
                       {"weight_decay", o.adamw.weight_decay}}}};
}

namespace {

// The option key of object j as T, with an error that names the option and the type it needs
// (nlohmann's own says "type must be number, but is string" and names nothing).
template <typename T>
T option(const nlohmann::json& j, const char* key, std::string_view prefix = "") {
  const auto it = j.find(key);
  if (it == j.end()) throw Error(fmt::format("Muon options: missing option '{}{}'", prefix, key));
  const nlohmann::json& v = *it;
  const auto wrong = [&](std::string_view expected) {
    return Error(fmt::format("Muon options: option '{}{}' must be {}, got {} {}", prefix, key,
                             expected, v.type_name(), v.dump()));
  };
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) throw wrong("true or false");
    return v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (v.is_number_unsigned() && std::in_range<T>(v.get<std::uint64_t>()))
      return static_cast<T>(v.get<std::uint64_t>());
    if (v.is_number_integer() && std::in_range<T>(v.get<std::int64_t>()))
      return static_cast<T>(v.get<std::int64_t>());
    throw wrong(fmt::format("an integer from {} to {}", std::numeric_limits<T>::min(),
                            std::numeric_limits<T>::max()));
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) throw wrong("a number");
    return v.get<T>();
  } else {
    static_assert(std::is_same_v<T, std::string>);
    if (!v.is_string()) throw wrong("a string");
    return v.get<std::string>();
  }
}

}  // namespace

void from_json(const nlohmann::json& j, MuonOptions& o) {
  if (!j.is_object())
    throw Error(fmt::format("Muon options: expected a JSON object, got {}", j.type_name()));
  o.lr = option<double>(j, "lr");
  o.momentum = option<double>(j, "momentum");
  o.nesterov = option<bool>(j, "nesterov");
  o.weight_decay = option<double>(j, "weight_decay");
  o.weight_decay_method = parse_weight_decay_method(option<std::string>(j, "weight_decay_method"));
  o.coefficients = option<std::string>(j, "coefficients");
  o.custom_coefficients = option<std::string>(j, "custom_coefficients");
  o.steps = option<int>(j, "steps");
  // Absent in options written before eps was an option: keep the default.
  if (j.contains("eps")) o.eps = option<double>(j, "eps");
  // Absent in options written before schedule_check was an option: strict.
  o.schedule_warns = false;
  if (j.contains("schedule_check")) {
    const std::string v = option<std::string>(j, "schedule_check");
    if (v != "strict" && v != "warn") {
      throw Error(fmt::format(
          "Muon options: option 'schedule_check' = '{}' is invalid; valid: strict, warn", v));
    }
    o.schedule_warns = v == "warn";
  }
  o.use_syrk = option<bool>(j, "use_syrk");
  // Absent in options written before the Gram algorithm existed: keep the defaults.
  if (j.contains("ns_algorithm"))
    o.ns_algorithm = parse_ns_algorithm(option<std::string>(j, "ns_algorithm"));
  if (j.contains("gram_restart")) o.gram_restart = option<int>(j, "gram_restart");
  // Absent in options written before precision was an option: the backend's default.
  o.precision.reset();
  if (j.contains("precision")) {
    const std::string p = option<std::string>(j, "precision");
    if (p != "auto") {
      try {
        o.precision = parse_precision(p);
      } catch (const Error& e) {
        throw Error(fmt::format("Muon options: option 'precision': {} (or auto)", e.what()));
      }
    }
  }
  o.scale_mode = parse_scale_mode(option<std::string>(j, "scale_mode"));
  o.extra_scale_factor = option<double>(j, "extra_scale_factor");
  o.tp_mode = parse_tp_mode(option<std::string>(j, "tp_mode"));
  // Absent in options written before the experts' own mode: the same as tp_mode.
  o.expert_tp_mode.reset();
  if (j.contains("expert_tp_mode")) {
    const std::string m = option<std::string>(j, "expert_tp_mode");
    if (m != "same") {
      try {
        o.expert_tp_mode = parse_tp_mode(m);
      } catch (const Error& e) {
        throw Error(fmt::format("Muon options: option 'expert_tp_mode': {} (or same)", e.what()));
      }
    }
  }
  // Absent in options written before replicated weights: auto.
  if (j.contains("replica_mode"))
    o.replica_mode = parse_replica_mode(option<std::string>(j, "replica_mode"));
  if (j.contains("replica_wire"))  // absent in options written before the bf16 wire: fp32
    o.replica_wire = parse_replica_wire(option<std::string>(j, "replica_wire"));
  if (j.contains("momentum_dtype"))  // absent in options written before it: fp32
    o.momentum_dtype = parse_momentum_dtype(option<std::string>(j, "momentum_dtype"));
  o.cost_model = option<std::string>(j, "cost_model");
  o.profile = option<std::string>(j, "profile");
  // Absent in options written before measure mode: plan by the estimate.
  if (j.contains("plan")) o.plan = parse_plan_mode(option<std::string>(j, "plan"));
  if (j.contains("wisdom")) o.wisdom = option<std::string>(j, "wisdom");
  // Absent in options written before the step deadline: none.
  o.step_timeout_s = j.contains("step_timeout_s") ? option<double>(j, "step_timeout_s") : 0.0;
  const auto it = j.find("adamw");
  if (it == j.end() || !it->is_object())
    throw Error(
        "Muon options: option 'adamw' must be an object {lr, beta1, beta2, eps, "
        "weight_decay}");
  const auto& a = *it;
  o.adamw.lr = option<double>(a, "lr", "adamw.");
  o.adamw.beta1 = option<double>(a, "beta1", "adamw.");
  o.adamw.beta2 = option<double>(a, "beta2", "adamw.");
  o.adamw.eps = option<double>(a, "eps", "adamw.");
  o.adamw.weight_decay = option<double>(a, "weight_decay", "adamw.");
}

}  // namespace distmuon
