#include "distmuon/hardware_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
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

}  // namespace

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
