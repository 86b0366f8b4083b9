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
//
// A measured profile (`distmuon calibrate`) also carries an optional "calibration" object: the
// per-rank ssyrk and sgemm rates of NS's products over a grid of sizes with every rank of the
// group busy at once, the rates of NS's elementwise passes, and the fitted all-gather and
// all-reduce latency and bandwidth over the group. The refined cost model uses those figures in
// place of the datasheet ones when they apply (see cost_model.h and docs/cost-model.md). Files
// without it load as before.

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace distmuon {

// Plausible bounds of a profile's figures (validate() refuses a value outside them, naming the
// field): far beyond any device, network or host distmuon could meet, so that only a typo, a unit
// mistake or a corrupt file is refused. Rates and bandwidths must be finite and > 0, latencies
// finite and >= 0, counts integers.
struct ProfileBounds {
  static constexpr double kMinRate = 1e-6;          // TFLOP/s, GFLOP/s, GB/s, G elements/s
  static constexpr double kMaxTflops = 1e6;         // peak_tflops.*: an exaflop per device
  static constexpr double kMaxGflops = 1e9;         // calibration rate tables (the same exaflop)
  static constexpr double kMaxGbps = 1e6;           // bandwidths: a petabyte per second
  static constexpr double kMaxGelems = 1e6;         // elementwise rates
  static constexpr double kMaxLatencyUs = 1e7;      // latencies: 10 s per ring step
  static constexpr int kMaxDomainSize = 1 << 20;    // domain_size, calibration.group_size
  static constexpr int kMaxBlasThreads = 1 << 12;   // calibration.blas_threads
  static constexpr double kMaxTableSize = 1 << 24;  // calibration tables' s and l
};

// Measured rates of one NS matrix product over a grid of its two sizes: s, the Gram side, and l,
// the other side of the matrix NS iterates on (for a product of the Gram matrix with itself,
// l = s). gflops[i][j] is the rate at (s[i], l[j]), per rank, FLOPs counted as ns_flops counts
// them (gemm 2 m n k, syrk n^2 k).
struct RateTable {
  std::vector<double> s, l;                 // ascending, at least one each
  std::vector<std::vector<double>> gflops;  // s.size() rows of l.size() rates
  // FLOP/s at (s, l): bilinear interpolation of log(rate) over (log s, log l), the grid's edge
  // values outside it.
  double flops_per_s(double s, double l) const;
  void validate(const char* key) const;  // throws naming the field ("calibration.<key>")
  friend bool operator==(const RateTable&, const RateTable&) = default;
};

// Measured rates of NS's elementwise passes, in G elements per second per rank.
struct ElementwiseRates {
  double sum_squares = 0;  // the norm (accumulated in double)
  double scale = 0;        // one read-write pass; also used for copies and zero fills
  double axpby = 0;        // y = a x + b y (B = b A + c A A)
  double fill = 0;         // zero fill of freshly mapped memory (page faults included)
  friend bool operator==(const ElementwiseRates&, const ElementwiseRates&) = default;
};

// A collective's fitted cost over the calibrated group, in the ring terms the cost model uses:
// latency per ring step (microseconds) and per-rank one-direction bandwidth (GB/s, nccl-tests'
// bus bandwidth). An all-gather of P payload bytes over g ranks then takes
// (g - 1) latency + P (g - 1) / g / bandwidth, an all-reduce 2 (g - 1) latency + 2 P (g - 1) / g /
// bandwidth.
struct CollectiveFit {
  double latency_us = 0;
  double gbps = 0;
  friend bool operator==(const CollectiveFit&, const CollectiveFit&) = default;
};

// What `distmuon calibrate` measured on a machine.
struct Calibration {
  int elem_size = 4;            // bytes per element of the precision measured (4: fp32)
  int group_size = 1;           // ranks that computed and communicated at once
  int blas_threads = 1;         // BLAS threads per rank during the measurement
  bool crosses_domain = false;  // whether the measured group spans NVLink domains (hosts)
  RateTable gram_syrk;          // Compute::syrk, C (s x s) = X X^T with X s x l, both triangles
  RateTable update_gemm;        // Compute::gemm, (l x s) times (s x s): the update X B
  ElementwiseRates elementwise;
  std::optional<CollectiveFit> all_gather, all_reduce;  // absent for a group of one
  std::string host, date;  // where and when (UTC, ISO 8601) it was measured

  void validate() const;  // throws distmuon::Error naming the field ("calibration.gram_syrk", ...)
  friend bool operator==(const Calibration&, const Calibration&) = default;
};

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
  std::optional<Calibration> calibration;  // measured profiles only

  // Peak of the precision NS runs in: element size 2 is bf16, 4 is fp32. Throws otherwise.
  double peak_tflops(int elem_size) const;
  // Per-GPU one-direction bandwidth (GB/s) a collective over group_size ranks gets.
  double bandwidth_gbps(int group_size, bool crosses_domain) const;
  // Per ring step latency (microseconds).
  double latency_us(bool crosses_domain) const;
  // Throws distmuon::Error naming the first field that is missing, non-positive, outside
  // ProfileBounds or inconsistent.
  void validate() const;
  friend bool operator==(const HardwareProfile&, const HardwareProfile&) = default;
};

// JSON conversion. from_json throws distmuon::Error naming the offending field.
void to_json(nlohmann::json& j, const HardwareProfile& p);
void from_json(const nlohmann::json& j, HardwareProfile& p);

HardwareProfile load_profile(const std::filesystem::path& file);  // errors name the file and field
void save_profile(const HardwareProfile& p,
                  const std::filesystem::path& file);  // atomic (file_io.h)

// Folder the built-in profiles are read from: the source tree's profiles/ when it exists (build
// tree), else the installed one. Throws when neither exists.
std::filesystem::path profiles_dir();
// The built-in registry, sorted by name (loaded once).
const std::vector<HardwareProfile>& builtin_profiles();

// Registry lookup by name or by a reported device name: case and punctuation are ignored, and
// the longest profile name contained in the query wins ("NVIDIA GB200" -> gb200, not b200;
// "NVIDIA H100 80GB HBM3" -> h100). A query contained in exactly one name also matches ("mi300").
std::optional<HardwareProfile> find_profile(std::string_view query);

// A profile spec: "none" (or empty) gives no profile; an existing file is loaded; a spec that
// names a file (it holds a '/' or ends in ".json") but does not exist is an error; anything else
// must be a built-in name, exactly (case aside). Throws listing the built-in names when nothing
// matches, and saying so when the spec is part of several names ("gb2": ambiguous) or close to
// one ("h1000": did you mean h100?).
std::optional<HardwareProfile> resolve_profile(std::string_view spec);

}  // namespace distmuon
