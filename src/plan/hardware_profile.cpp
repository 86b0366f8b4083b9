#include "distmuon/hardware_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string_view>

#include "distmuon/error.h"
#include "distmuon/file_io.h"
#include "distmuon/json_file.h"
#include "plan/data_folder.h"
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

using B = ProfileBounds;

// v must lie in [lo, hi] (lo > 0: a rate, refused at 0 and below with "must be > 0").
void require_within(double v, std::string_view key, double lo, double hi, std::string_view unit) {
  if (lo > 0 && !(v > 0))
    throw Error(fmt::format("hardware profile: field '{}' must be > 0, got {}", key, v));
  if (!(v >= lo && v <= hi)) {
    throw Error(
        fmt::format("hardware profile: field '{}' is {}, outside the plausible range [{}, "
                    "{}] {}",
                    key, v, lo, hi, unit));
  }
}

void require_positive(double v, std::string_view key, double hi = B::kMaxGbps,
                      std::string_view unit = "GB/s") {
  require_within(v, key, B::kMinRate, hi, unit);
}

void require_latency(double v, std::string_view key) {
  require_within(v, key, 0, B::kMaxLatencyUs, "us");
}

void require_count(int v, std::string_view key, int hi) {
  if (v < 1 || v > hi) {
    throw Error(fmt::format("hardware profile: field '{}' must be in [1, {}], got {}", key, hi, v));
  }
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

// Index i and weight t of x between axis[i] and axis[i + 1] in log space, clamped to the ends.
std::pair<std::size_t, double> locate(const std::vector<double>& axis, double x) {
  if (axis.size() == 1 || x <= axis.front()) return {0, 0.0};
  if (x >= axis.back()) return {axis.size() - 2, 1.0};
  const auto hi = std::upper_bound(axis.begin(), axis.end(), x);
  const auto i = static_cast<std::size_t>(hi - axis.begin()) - 1;
  return {i, std::log(x / axis[i]) / std::log(axis[i + 1] / axis[i])};
}

void check_axis(const std::vector<double>& axis, const std::string& key) {
  if (axis.empty()) throw Error(fmt::format("hardware profile: field '{}' is empty", key));
  for (std::size_t i = 0; i < axis.size(); ++i) {
    if (!(axis[i] >= 1 && axis[i] <= B::kMaxTableSize) || (i > 0 && !(axis[i] > axis[i - 1]))) {
      throw Error(
          fmt::format("hardware profile: field '{}' must be ascending sizes in [1, {}], got {}",
                      key, B::kMaxTableSize, json(axis).dump()));
    }
  }
}

json table_json(const RateTable& t) {
  return {{"s", t.s}, {"l", t.l}, {"gflops", t.gflops}};
}

RateTable table_from_json(const json& j, const char* key) {
  const json t = field<json>(j, key);
  if (!t.is_object()) {
    throw Error(fmt::format(
        "hardware profile: field 'calibration.{}' must be an object {{\"s\", \"l\", \"gflops\"}}",
        key));
  }
  const std::string where = fmt::format("calibration.{}", key);
  RateTable out;
  try {
    out.s = field<std::vector<double>>(t, "s");
    out.l = field<std::vector<double>>(t, "l");
    out.gflops = field<std::vector<std::vector<double>>>(t, "gflops");
  } catch (const Error& e) {
    throw Error(fmt::format("{} (in '{}')", e.what(), where));
  }
  return out;
}

ElementwiseRates elementwise_from_json(const json& j) {
  const json e = field<json>(j, "elementwise_gelems");
  if (!e.is_object())
    throw Error("hardware profile: field 'calibration.elementwise_gelems' must be an object");
  try {
    return {field<double>(e, "sum_squares"), field<double>(e, "scale"), field<double>(e, "axpby"),
            field<double>(e, "fill")};
  } catch (const Error& err) {
    throw Error(fmt::format("{} (in 'calibration.elementwise_gelems')", err.what()));
  }
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
  detail::json_known_fields(
      j,
      {"elem_size", "group_size", "blas_threads", "crosses_domain", "gram_syrk", "update_gemm",
       "elementwise_gelems", "all_gather", "all_reduce", "host", "date"},
      kWhat, "calibration.");
  Calibration c;
  c.elem_size = field<int>(j, "elem_size");
  c.group_size = field<int>(j, "group_size");
  c.blas_threads = optional_field<int>(j, "blas_threads", 1);
  c.crosses_domain = optional_field<bool>(j, "crosses_domain", false);
  c.gram_syrk = table_from_json(j, "gram_syrk");
  c.update_gemm = table_from_json(j, "update_gemm");
  c.elementwise = elementwise_from_json(j);
  c.all_gather = fit_from_json(j, "all_gather");
  c.all_reduce = fit_from_json(j, "all_reduce");
  c.host = optional_field<std::string>(j, "host", "");
  c.date = optional_field<std::string>(j, "date", "");
  return c;
}

}  // namespace

double RateTable::flops_per_s(double s_size, double l_size) const {
  DISTMUON_ASSERT(!s.empty() && !l.empty(), "empty calibrated rate table");
  const auto [i, ti] = locate(s, s_size);
  const auto [j, tj] = locate(l, l_size);
  const auto at = [&](std::size_t a, std::size_t b) {
    return std::log(gflops[std::min(a, s.size() - 1)][std::min(b, l.size() - 1)]);
  };
  const double v = (1 - ti) * ((1 - tj) * at(i, j) + tj * at(i, j + 1)) +
                   ti * ((1 - tj) * at(i + 1, j) + tj * at(i + 1, j + 1));
  return std::exp(v) * 1e9;
}

void RateTable::validate(const char* key) const {
  const std::string where = fmt::format("calibration.{}", key);
  check_axis(s, where + ".s");
  check_axis(l, where + ".l");
  bool ok = gflops.size() == s.size();
  for (const auto& row : gflops) {
    ok = ok && row.size() == l.size();
    for (double v : row)
      ok = ok && v >= B::kMinRate && v <= B::kMaxGflops;
  }
  if (!ok) {
    throw Error(fmt::format(
        "hardware profile: field '{}.gflops' must hold {} rows of {} rates in [{}, {}] GFLOP/s "
        "(one per s, then per l)",
        where, s.size(), l.size(), B::kMinRate, B::kMaxGflops));
  }
}

void Calibration::validate() const {
  if (elem_size != 2 && elem_size != 4) {
    throw Error(fmt::format(
        "hardware profile: field 'calibration.elem_size' must be 2 or 4, got {}", elem_size));
  }
  require_count(group_size, "calibration.group_size", B::kMaxDomainSize);
  require_count(blas_threads, "calibration.blas_threads", B::kMaxBlasThreads);
  gram_syrk.validate("gram_syrk");
  update_gemm.validate("update_gemm");
  for (const auto& [v, key] :
       {std::pair{elementwise.sum_squares, "sum_squares"}, std::pair{elementwise.scale, "scale"},
        std::pair{elementwise.axpby, "axpby"}, std::pair{elementwise.fill, "fill"}}) {
    require_positive(v, fmt::format("calibration.elementwise_gelems.{}", key), B::kMaxGelems,
                     "G elements/s");
  }
  for (const auto& [fit, key] : {std::pair{&all_gather, "calibration.all_gather"},
                                 std::pair{&all_reduce, "calibration.all_reduce"}}) {
    if (!fit->has_value()) continue;
    require_latency((*fit)->latency_us, fmt::format("{}.latency_us", key));
    require_positive((*fit)->gbps, fmt::format("{}.gbps", key));
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
  require_positive(peak_tflops_bf16, "peak_tflops.bf16", B::kMaxTflops, "TFLOP/s");
  require_positive(peak_tflops_fp32, "peak_tflops.fp32", B::kMaxTflops, "TFLOP/s");
  require_positive(intra_domain_gbps, "intra_domain_gbps");
  require_positive(inter_domain_gbps, "inter_domain_gbps");
  require_latency(intra_domain_latency_us, "intra_domain_latency_us");
  require_latency(inter_domain_latency_us, "inter_domain_latency_us");
  require_count(domain_size, "domain_size", B::kMaxDomainSize);
  // 0: a switched fabric (the per-GPU figure holds for any group).
  if (intra_domain_peer_gbps != 0)
    require_positive(intra_domain_peer_gbps, "intra_domain_peer_gbps");
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
              {"gram_syrk", table_json(c.gram_syrk)},
              {"update_gemm", table_json(c.update_gemm)},
              {"elementwise_gelems",
               {{"sum_squares", c.elementwise.sum_squares},
                {"scale", c.elementwise.scale},
                {"axpby", c.elementwise.axpby},
                {"fill", c.elementwise.fill}}},
              {"host", c.host},
              {"date", c.date}};
  for (const auto& [fit, key] :
       {std::pair{&c.all_gather, "all_gather"}, std::pair{&c.all_reduce, "all_reduce"}}) {
    if (fit->has_value()) cal[key] = {{"latency_us", (*fit)->latency_us}, {"gbps", (*fit)->gbps}};
  }
  j["calibration"] = std::move(cal);
}

void from_json(const json& j, HardwareProfile& p) {
  if (!j.is_object())
    throw Error(fmt::format("hardware profile: expected a JSON object, got {}", j.type_name()));
  detail::json_known_fields(
      j,
      {"name", "device", "peak_tflops", "intra_domain_gbps", "inter_domain_gbps",
       "intra_domain_latency_us", "inter_domain_latency_us", "domain_size",
       "intra_domain_peer_gbps", "source", "calibration"},
      kWhat);
  HardwareProfile out;
  out.name = field<std::string>(j, "name");
  out.device = optional_field<std::string>(j, "device", out.name);
  const json peak = field<json>(j, "peak_tflops");
  if (!peak.is_object())
    throw Error("hardware profile: field 'peak_tflops' must be an object {\"bf16\", \"fp32\"}");
  detail::json_known_fields(peak, {"bf16", "fp32"}, kWhat, "peak_tflops.");
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
  const json j = read_json_file(file, "hardware profile");
  try {
    return j.get<HardwareProfile>();
  } catch (const json::exception& e) {
    throw Error(
        fmt::format("hardware profile '{}': invalid JSON: {}", file.string(), json_error_text(e)));
  } catch (const Error& e) {
    throw Error(fmt::format("{} in '{}'", e.what(), file.string()));
  }
}

void save_profile(const HardwareProfile& p, const std::filesystem::path& file) {
  p.validate();
  const std::string text = json(p).dump(2) + '\n';
  write_file_atomic(file, text.data(), text.size());
}

std::filesystem::path profiles_dir() {
  return detail::find_data_folder("profiles",
                                  {DISTMUON_PROFILES_DIR, DISTMUON_INSTALL_PROFILES_DIR});
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
  const std::filesystem::path path(spec);
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) return load_profile(path);
  const auto lower = [](std::string_view t) {
    std::string out(t);
    std::transform(out.begin(), out.end(), out.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return out;
  };
  if (spec.find('/') != std::string_view::npos || lower(path.extension().string()) == ".json") {
    throw Error(fmt::format(
        "hardware profile file '{}' does not exist{} (a built-in profile is named without a path: "
        "{})",
        spec, std::filesystem::exists(path, ec) ? " as a regular file" : "", builtin_names()));
  }
  const std::string name = lower(spec);
  for (const auto& p : builtin_profiles())
    if (lower(p.name) == name) return p;
  // Not a name: say which ones it is part of, or which one it contains.
  const std::string q = normalise(spec);
  std::vector<std::string> containing, contained;
  for (const auto& p : builtin_profiles()) {
    const std::string key = normalise(p.name);
    if (!q.empty() && key.find(q) != std::string::npos) containing.push_back(p.name);
    if (!q.empty() && q.find(key) != std::string::npos) contained.push_back(p.name);
  }
  if (containing.size() > 1) {
    throw Error(
        fmt::format("ambiguous hardware profile name '{}': it is part of {}; give the whole name",
                    spec, fmt::join(containing, ", ")));
  }
  std::string hint;
  if (containing.size() == 1) hint = containing.front();
  for (const std::string& c : contained)  // the longest name inside the spec ("gb200x": gb200)
    if (c.size() > hint.size()) hint = c;
  throw Error(fmt::format(
      "unknown hardware profile '{}'{}: not a file, and no built-in profile has that name "
      "(built-in: {}; or 'none')",
      spec, hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint), builtin_names()));
}

}  // namespace distmuon
