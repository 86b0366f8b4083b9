#pragma once
// Hardware profiles: the per-GPU figures the cost model needs, as data with their sources.
//
// A profile is a JSON object (see profiles/*.json and docs/cost-model.md):
//   {"name": "h100", "device": "NVIDIA H100 SXM5",
//    "peak_tflops": {"bf16": 989, "fp32": 494},
//    "intra_domain_gbps": 450, "inter_domain_gbps": 50,
//    "intra_domain_latency_us": 3.4, "inter_domain_latency_us": 14,
//    "domain_size": 8, "intra_domain_peer_gbps": 0, "source": "..."}
// Units: TFLOP/s of dense matmul; GB/s (1e9 bytes/s) per GPU, one direction; microseconds per
// ring step of a collective. "fp32" is the rate an fp32 GEMM runs at on the tensor cores (TF32
// on NVIDIA). intra_domain_peer_gbps > 0 describes a full mesh without a switch (MI300X): a
// group of G inside the domain then gets min(intra_domain_gbps, (G - 1) * peer) per GPU.
//
// The built-in registry is the set of JSON files shipped in profiles/ (source tree, or
// <prefix>/share/distmuon/profiles once installed).

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace distmuon {

struct HardwareProfile {
  std::string name;    // registry key, lower case ("gb200")
  std::string device;  // display name ("NVIDIA GB200 NVL72")
  double peak_tflops_bf16 = 0;
  double peak_tflops_fp32 = 0;
  double intra_domain_gbps = 0;
  double inter_domain_gbps = 0;
  double intra_domain_latency_us = 0;
  double inter_domain_latency_us = 0;
  int domain_size = 1;
  double intra_domain_peer_gbps = 0;  // 0: switched fabric, the per-GPU figure holds for any G
  std::string source;

  // Peak of the precision NS runs in: element size 2 is bf16, 4 is fp32. Throws otherwise.
  double peak_tflops(int elem_size) const;
  // Per-GPU one-direction bandwidth (GB/s) a collective over group_size ranks gets.
  double bandwidth_gbps(int group_size, bool crosses_domain) const;
  // Per ring step latency (microseconds).
  double latency_us(bool crosses_domain) const;
  // Throws distmuon::Error naming the first field that is missing, non-positive or inconsistent.
  void validate() const;
  friend bool operator==(const HardwareProfile&, const HardwareProfile&) = default;
};

// JSON conversion. from_json throws distmuon::Error naming the offending field.
void to_json(nlohmann::json& j, const HardwareProfile& p);
void from_json(const nlohmann::json& j, HardwareProfile& p);

HardwareProfile load_profile(const std::filesystem::path& file);  // errors name the file and field
void save_profile(const HardwareProfile& p, const std::filesystem::path& file);

// Folder the built-in profiles are read from: the source tree's profiles/ when it exists (build
// tree), else the installed one. Throws when neither exists.
std::filesystem::path profiles_dir();
// The built-in registry, sorted by name (loaded once).
const std::vector<HardwareProfile>& builtin_profiles();

// Registry lookup by name or by a reported device name: case and punctuation are ignored, and
// the longest profile name contained in the query wins ("NVIDIA GB200" -> gb200, not b200;
// "NVIDIA H100 80GB HBM3" -> h100). A query contained in exactly one name also matches ("mi300").
std::optional<HardwareProfile> find_profile(std::string_view query);

// A profile spec: "none" (or empty) gives no profile, an existing file is loaded, anything else
// is looked up in the registry. Throws listing the built-in names when nothing matches.
std::optional<HardwareProfile> resolve_profile(std::string_view spec);

}  // namespace distmuon
