#include "distmuon/hardware_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string_view>

#include "distmuon/error.h"
#include "plan/json_fields.h"

namespace distmuon {
namespace {

using nlohmann::json;

constexpr std::string_view kWhat = "hardware profile";

template <typename T>
T field(const json& j, const char* key) {
  return detail::json_field<T>(j, key, kWhat);
}

template <typename T>
T optional_field(const json& j, const char* key, T fallback) {
  return detail::json_field_or<T>(j, key, fallback, kWhat);
}

void require_positive(double v, const char* key) {
  if (!(v > 0))
    throw Error(fmt::format("hardware profile: field '{}' must be > 0, got {}", key, v));
}

// Lower case letters and digits only: "NVIDIA GB200-NVL72" -> "nvidiagb200nvl72".
std::string normalise(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::isalnum(static_cast<unsigned char>(c)) != 0) {
      out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    }
  }
  return out;
}

std::string builtin_names() {
  std::string names;
  for (const auto& p : builtin_profiles())
    names += (names.empty() ? "" : ", ") + p.name;
  return names;
}

// Log-log interpolation of a rate curve (ascending sizes), clamped to the end points.
double interpolate(const std::vector<RatePoint>& curve, double size) {
  DISTMUON_ASSERT(!curve.empty(), "empty calibrated rate curve");
  if (size <= curve.front().size) return curve.front().gflops * 1e9;
  if (size >= curve.back().size) return curve.back().gflops * 1e9;
  const auto hi = std::upper_bound(curve.begin(), curve.end(), size,
                                   [](double s, const RatePoint& p) { return s < p.size; });
  const auto lo = hi - 1;
  const double t = std::log(size / lo->size) / std::log(hi->size / lo->size);
  return std::exp(std::log(lo->gflops) + t * (std::log(hi->gflops) - std::log(lo->gflops))) * 1e9;
}

void validate_curve(const std::vector<RatePoint>& curve, const char* key) {
  if (curve.empty())
    throw Error(fmt::format("hardware profile: field 'calibration.{}' has no points", key));
  for (std::size_t i = 0; i < curve.size(); ++i) {
    if (!(curve[i].size > 0) || !(curve[i].gflops > 0) ||
        (i > 0 && !(curve[i].size > curve[i - 1].size))) {
      throw Error(fmt::format(
          "hardware profile: field 'calibration.{}' point {} (size {}, gflops {}) must have a "
          "positive rate and a positive size above the previous point's",
          key, i, curve[i].size, curve[i].gflops));
    }
  }
}

json curve_json(const std::vector<RatePoint>& curve) {
  json out = json::array();
  for (const RatePoint& p : curve)
    out.push_back({{"size", p.size}, {"gflops", p.gflops}});
  return out;
}

std::vector<RatePoint> curve_from_json(const json& j, const char* key) {
  const json arr = field<json>(j, key);
  if (!arr.is_array())
    throw Error(fmt::format("hardware profile: field 'calibration.{}' must be an array", key));
  std::vector<RatePoint> out;
  for (const json& p : arr) {
    if (!p.is_object()) {
      throw Error(fmt::format(
          "hardware profile: field 'calibration.{}' must hold {{\"size\", \"gflops\"}} objects",
          key));
    }
    out.push_back({field<double>(p, "size"), field<double>(p, "gflops")});
  }
  return out;
}

std::optional<CollectiveFit> fit_from_json(const json& j, const char* key) {
  if (!j.contains(key) || j.at(key).is_null()) return std::nullopt;
  const json& f = j.at(key);
  if (!f.is_object()) {
    throw Error(fmt::format(
        "hardware profile: field 'calibration.{}' must be an object {{\"latency_us\", \"gbps\"}}",
        key));
  }
  return CollectiveFit{field<double>(f, "latency_us"), field<double>(f, "gbps")};
}

Calibration calibration_from_json(const json& j) {
  if (!j.is_object()) throw Error("hardware profile: field 'calibration' must be an object");
  Calibration c;
  c.elem_size = field<int>(j, "elem_size");
  c.group_size = field<int>(j, "group_size");
  c.blas_threads = optional_field<int>(j, "blas_threads", 1);
  c.crosses_domain = optional_field<bool>(j, "crosses_domain", false);
  c.sgemm = curve_from_json(j, "sgemm_gflops");
  c.ssyrk = curve_from_json(j, "ssyrk_gflops");
  c.elementwise_gbps = field<double>(j, "elementwise_gbps");
  c.all_gather = fit_from_json(j, "all_gather");
  c.all_reduce = fit_from_json(j, "all_reduce");
  c.host = optional_field<std::string>(j, "host", "");
  c.date = optional_field<std::string>(j, "date", "");
  return c;
}

}  // namespace

double Calibration::sgemm_flops_per_s(double size) const {
  return interpolate(sgemm, size);
}

double Calibration::ssyrk_flops_per_s(double size) const {
  return interpolate(ssyrk, size);
}

void Calibration::validate() const {
  if (elem_size != 2 && elem_size != 4) {
    throw Error(fmt::format(
        "hardware profile: field 'calibration.elem_size' must be 2 or 4, got {}", elem_size));
  }
  if (group_size < 1) {
    throw Error(fmt::format(
        "hardware profile: field 'calibration.group_size' must be >= 1, got {}", group_size));
  }
  if (blas_threads < 1) {
    throw Error(fmt::format(
        "hardware profile: field 'calibration.blas_threads' must be >= 1, got {}", blas_threads));
  }
  validate_curve(sgemm, "sgemm_gflops");
  validate_curve(ssyrk, "ssyrk_gflops");
  require_positive(elementwise_gbps, "calibration.elementwise_gbps");
  for (const auto& [fit, key] : {std::pair{&all_gather, "calibration.all_gather"},
                                 std::pair{&all_reduce, "calibration.all_reduce"}}) {
    if (!fit->has_value()) continue;
    if (!((*fit)->latency_us >= 0)) {
      throw Error(fmt::format("hardware profile: field '{}.latency_us' must be >= 0, got {}", key,
                              (*fit)->latency_us));
    }
    require_positive((*fit)->gbps, fmt::format("{}.gbps", key).c_str());
  }
}

double HardwareProfile::peak_tflops(int elem_size) const {
  if (elem_size == 2) return peak_tflops_bf16;
  if (elem_size == 4) return peak_tflops_fp32;
  throw Error(
      fmt::format("hardware profile '{}': no peak for element size {} (valid: 2 bf16, 4 fp32)",
                  name, elem_size));
}

double HardwareProfile::bandwidth_gbps(int group_size, bool crosses_domain) const {
  if (crosses_domain) return inter_domain_gbps;
  if (intra_domain_peer_gbps > 0) {
    return std::min(intra_domain_gbps, std::max(1, group_size - 1) * intra_domain_peer_gbps);
  }
  return intra_domain_gbps;
}

double HardwareProfile::latency_us(bool crosses_domain) const {
  return crosses_domain ? inter_domain_latency_us : intra_domain_latency_us;
}

void HardwareProfile::validate() const {
  if (name.empty()) throw Error("hardware profile: field 'name' is empty");
  require_positive(peak_tflops_bf16, "peak_tflops.bf16");
  require_positive(peak_tflops_fp32, "peak_tflops.fp32");
  require_positive(intra_domain_gbps, "intra_domain_gbps");
  require_positive(inter_domain_gbps, "inter_domain_gbps");
  if (intra_domain_latency_us < 0)
    throw Error("hardware profile: field 'intra_domain_latency_us' must be >= 0");
  if (inter_domain_latency_us < 0)
    throw Error("hardware profile: field 'inter_domain_latency_us' must be >= 0");
  if (domain_size < 1) {
    throw Error(
        fmt::format("hardware profile: field 'domain_size' must be >= 1, got {}", domain_size));
  }
  if (intra_domain_peer_gbps < 0)
    throw Error("hardware profile: field 'intra_domain_peer_gbps' must be >= 0");
  if (calibration) calibration->validate();
}

void to_json(json& j, const HardwareProfile& p) {
  j = json{{"name", p.name},
           {"device", p.device},
           {"peak_tflops", {{"bf16", p.peak_tflops_bf16}, {"fp32", p.peak_tflops_fp32}}},
           {"intra_domain_gbps", p.intra_domain_gbps},
           {"inter_domain_gbps", p.inter_domain_gbps},
           {"intra_domain_latency_us", p.intra_domain_latency_us},
           {"inter_domain_latency_us", p.inter_domain_latency_us},
           {"domain_size", p.domain_size},
           {"intra_domain_peer_gbps", p.intra_domain_peer_gbps},
           {"source", p.source}};
  if (!p.calibration) return;
  const Calibration& c = *p.calibration;
  json cal = {{"elem_size", c.elem_size},
              {"group_size", c.group_size},
              {"blas_threads", c.blas_threads},
              {"crosses_domain", c.crosses_domain},
              {"sgemm_gflops", curve_json(c.sgemm)},
              {"ssyrk_gflops", curve_json(c.ssyrk)},
              {"elementwise_gbps", c.elementwise_gbps},
              {"host", c.host},
              {"date", c.date}};
  for (const auto& [fit, key] :
       {std::pair{&c.all_gather, "all_gather"}, std::pair{&c.all_reduce, "all_reduce"}}) {
    if (fit->has_value())
      cal[key] = {{"latency_us", (*fit)->latency_us}, {"gbps", (*fit)->gbps}};
  }
  j["calibration"] = std::move(cal);
}

void from_json(const json& j, HardwareProfile& p) {
  if (!j.is_object())
    throw Error(fmt::format("hardware profile: expected a JSON object, got {}", j.type_name()));
  HardwareProfile out;
  out.name = field<std::string>(j, "name");
  out.device = optional_field<std::string>(j, "device", out.name);
  const json peak = field<json>(j, "peak_tflops");
  if (!peak.is_object())
    throw Error("hardware profile: field 'peak_tflops' must be an object {\"bf16\", \"fp32\"}");
  try {
    out.peak_tflops_bf16 = field<double>(peak, "bf16");
    out.peak_tflops_fp32 = field<double>(peak, "fp32");
  } catch (const Error& e) {
    throw Error(fmt::format("{} (in 'peak_tflops')", e.what()));
  }
  out.intra_domain_gbps = field<double>(j, "intra_domain_gbps");
  out.inter_domain_gbps = field<double>(j, "inter_domain_gbps");
  out.intra_domain_latency_us = field<double>(j, "intra_domain_latency_us");
  out.inter_domain_latency_us = field<double>(j, "inter_domain_latency_us");
  out.domain_size = field<int>(j, "domain_size");
  out.intra_domain_peer_gbps = optional_field<double>(j, "intra_domain_peer_gbps", 0.0);
  out.source = field<std::string>(j, "source");
  if (j.contains("calibration") && !j.at("calibration").is_null()) {
    try {
      out.calibration = calibration_from_json(j.at("calibration"));
    } catch (const Error& e) {
      throw Error(fmt::format("{} (in 'calibration')", e.what()));
    }
  }
  out.validate();
  p = std::move(out);
}

HardwareProfile load_profile(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw Error(fmt::format("cannot open hardware profile '{}'", file.string()));
  try {
    return json::parse(in).get<HardwareProfile>();
  } catch (const json::exception& e) {
    throw Error(fmt::format("hardware profile '{}': invalid JSON: {}", file.string(), e.what()));
  } catch (const Error& e) {
    throw Error(fmt::format("{} in '{}'", e.what(), file.string()));
  }
}

void save_profile(const HardwareProfile& p, const std::filesystem::path& file) {
  p.validate();
  std::ofstream out(file);
  out << json(p).dump(2) << '\n';
  out.close();
  if (!out) throw Error(fmt::format("cannot write hardware profile '{}'", file.string()));
}

std::filesystem::path profiles_dir() {
  for (const char* dir : {DISTMUON_PROFILES_DIR, DISTMUON_INSTALL_PROFILES_DIR}) {
    std::error_code ec;
    if (std::filesystem::is_directory(dir, ec)) return dir;
  }
  throw Error(fmt::format("no hardware profile folder: neither {} nor {} exists",
                          DISTMUON_PROFILES_DIR, DISTMUON_INSTALL_PROFILES_DIR));
}

const std::vector<HardwareProfile>& builtin_profiles() {
  static const std::vector<HardwareProfile> profiles = [] {
    std::vector<HardwareProfile> out;
    for (const auto& entry : std::filesystem::directory_iterator(profiles_dir())) {
      if (entry.path().extension() == ".json") out.push_back(load_profile(entry.path()));
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    return out;
  }();
  return profiles;
}

std::optional<HardwareProfile> find_profile(std::string_view query) {
  const std::string q = normalise(query);
  if (q.empty()) return std::nullopt;
  const HardwareProfile* best = nullptr;
  std::size_t best_len = 0;
  const HardwareProfile* partial = nullptr;
  int partial_count = 0;
  for (const auto& p : builtin_profiles()) {
    const std::string key = normalise(p.name);
    if (key == q) return p;
    if (q.find(key) != std::string::npos && key.size() > best_len) {
      best = &p;
      best_len = key.size();
    }
    if (key.find(q) != std::string::npos) {
      partial = &p;
      ++partial_count;
    }
  }
  if (best != nullptr) return *best;
  if (partial_count == 1) return *partial;
  return std::nullopt;
}

std::optional<HardwareProfile> resolve_profile(std::string_view spec) {
  if (spec.empty() || spec == "none") return std::nullopt;
  std::error_code ec;
  if (std::filesystem::is_regular_file(std::filesystem::path(spec), ec))
    return load_profile(std::filesystem::path(spec));
  if (auto p = find_profile(spec)) return p;
  throw Error(fmt::format(
      "unknown hardware profile '{}': not a file, and no built-in profile matches (built-in: {}; "
      "or 'none')",
      spec, builtin_names()));
}

}  // namespace distmuon
