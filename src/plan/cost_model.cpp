// The two cost models. Equations and sources: docs/cost-model.md.
#include "distmuon/cost_model.h"

#include <fmt/format.h>

#include <algorithm>

#include "distmuon/error.h"
#include "distmuon/newton_schulz.h"

namespace distmuon {
namespace {

constexpr double kNormBytes = 8;  // the global Frobenius norm is all-reduced as one double

Index ceil_div(Index a, Index b) {
  return (a + b - 1) / b;
}

// Adds one ring collective over g ranks of `payload` bytes (as CommStats counts it) to a mode.
// All-gather: each rank sends payload (g - 1) / g in g - 1 steps; all-reduce (reduce-scatter then
// all-gather): 2 payload (g - 1) / g in 2 (g - 1) steps. A group of one issues nothing.
void add_all_gather(ModeCost& c, double payload, int g, bool crosses, const HardwareProfile* p) {
  if (g <= 1) return;
  const double wire = payload * (g - 1) / g;
  c.payload_bytes += payload;
  c.wire_bytes += wire;
  ++c.all_gathers;
  if (p != nullptr) {
    c.bandwidth_s += wire / (p->bandwidth_gbps(g, crosses) * 1e9);
    c.latency_s += (g - 1) * p->latency_us(crosses) * 1e-6;
  }
}

void add_all_reduce(ModeCost& c, double payload, int g, bool crosses, const HardwareProfile* p) {
  if (g <= 1) return;
  const double wire = 2 * payload * (g - 1) / g;
  c.payload_bytes += payload;
  c.wire_bytes += wire;
  ++c.all_reduces;
  if (p != nullptr) {
    c.bandwidth_s += wire / (p->bandwidth_gbps(g, crosses) * 1e9);
    c.latency_s += 2.0 * (g - 1) * p->latency_us(crosses) * 1e-6;
  }
}

void add_compute(ModeCost& c, double flops, int elem_size, const HardwareProfile* p) {
  c.flops += flops;
  if (p != nullptr) c.compute_s += flops / (p->peak_tflops(elem_size) * 1e12);
}

// Fewer seconds (profile) or fewer FLOPs (none; a crossing group gives duplicated). Ties:
// duplicated.
void choose(CostEstimate& e) {
  if (!e.has_profile && e.crosses_domain) {
    e.choice = TpMode::kDuplicated;
    return;
  }
  e.choice = e.cost(TpMode::kDistributed) < e.cost(TpMode::kDuplicated) ? TpMode::kDistributed
                                                                        : TpMode::kDuplicated;
}

}  // namespace

CostModel parse_cost_model(std::string_view name) {
  if (name == "reference") return CostModel::kReference;
  if (name == "refined") return CostModel::kRefined;
  throw Error(fmt::format("unknown cost model '{}'; valid: refined, reference", name));
}

const char* to_string(CostModel model) {
  return model == CostModel::kReference ? "reference" : "refined";
}

double CostEstimate::cost(TpMode mode) const {
  DISTMUON_ASSERT(mode == TpMode::kDuplicated || mode == TpMode::kDistributed,
                  "cost of a non-estimated mode");
  const ModeCost& c = mode == TpMode::kDuplicated ? duplicated : distributed;
  return has_profile ? c.seconds() : c.flops;
}

void validate_key(const AutoKey& key) {
  const auto bad = [&](const std::string& why) {
    throw Error(fmt::format("cost model: invalid weight {} G={}: {}", shape_str(key.m, key.n),
                            key.group_size, why));
  };
  if (key.m < 1 || key.n < 1) bad("the shape must be positive");
  if (key.group_size < 1 || key.second_group_size < 1) bad("group sizes must be >= 1");
  if (key.partition_dim != 0 && key.partition_dim != 1) bad("partition_dim must be 0 or 1");
  if (key.steps < 1) bad(fmt::format("steps must be >= 1, got {}", key.steps));
  if (key.elem_size < 1) bad(fmt::format("elem_size must be >= 1, got {}", key.elem_size));
}

CostEstimate estimate_reference(const AutoKey& key, const HardwareProfile* profile) {
  validate_key(key);
  const double m = static_cast<double>(key.m), n = static_cast<double>(key.n);
  const double s = std::min(m, n), l = std::max(m, n);
  const double k = static_cast<double>(key.m / key.group_size);
  const double gram = key.use_syrk ? 1 : 2;
  const double steps = key.steps, e = key.elem_size, g = key.group_size;
  const double r = (g - 1) / g;

  CostEstimate est;
  est.has_profile = profile != nullptr;
  est.crosses_domain = key.crosses_domain;
  ModeCost& dup = est.duplicated;
  ModeCost& dist = est.distributed;
  dup.flops = steps * (gram * (s * s * l + s * s * s) + 2 * s * s * l);
  dist.flops = steps * (gram * (n * n * k + n * n * n) + 2 * n * n * k);
  dup.wire_bytes = m * n * e * r;
  dist.wire_bytes = steps * 2 * n * n * e * r;
  dup.payload_bytes = m * n * e;
  dist.payload_bytes = steps * n * n * e;
  dup.all_gathers = 1;
  dist.all_reduces = key.steps;
  if (profile != nullptr) {
    const double peak = profile->peak_tflops(key.elem_size) * 1e12;
    const double bw =
        (key.crosses_domain ? profile->inter_domain_gbps : profile->intra_domain_gbps) * 1e9;
    for (ModeCost* c : {&dup, &dist}) {
      c->compute_s = c->flops / peak;
      c->bandwidth_s = c->wire_bytes / bw;
    }
  }
  choose(est);
  return est;
}

CostEstimate estimate_refined(const AutoKey& key, const HardwareProfile* profile) {
  validate_key(key);
  const int g = key.group_size, g2 = key.second_group_size, e = key.elem_size;
  const bool x = key.crosses_domain;
  // Shards along partition_dim are padded to equal size (GTP pads rows); k is the local extent.
  const bool rows_split = key.partition_dim == 0;
  const Index k = ceil_div(rows_split ? key.m : key.n, g);
  const double padded =
      rows_split ? static_cast<double>(k * g) * key.n : static_cast<double>(key.m) * (k * g);

  CostEstimate est;
  est.has_profile = profile != nullptr;
  est.crosses_domain = x;
  // Two-step TP x GTP: the smaller group is all-gathered first (each rank then holds the shard of
  // the larger group), in both modes.
  const double first_gather = padded * e / g;
  // duplicated: gather the whole matrix, NS of it along min(m, n) on every rank.
  add_all_gather(est.duplicated, first_gather, g2, x, profile);
  add_all_gather(est.duplicated, padded * e, g, x, profile);
  add_compute(est.duplicated, ns_flops(key.m, key.n, key.steps, key.use_syrk), e, profile);
  // distributed: keep the shard, Gram on the unsplit side (n x n for rows, m x m for columns),
  // the norm all-reduce, then one Gram all-reduce per step.
  ModeCost& dist = est.distributed;
  add_all_gather(dist, first_gather, g2, x, profile);
  const double gram_side = static_cast<double>(rows_split ? key.n : key.m);
  add_all_reduce(dist, kNormBytes, g, x, profile);
  for (int step = 0; step < key.steps; ++step)
    add_all_reduce(dist, gram_side * gram_side * e, g, x, profile);
  const double flops = rows_split ? ns_flops(k, key.n, key.steps, key.use_syrk, GramSide::kCols)
                                  : ns_flops(key.m, k, key.steps, key.use_syrk, GramSide::kRows);
  add_compute(dist, flops, e, profile);
  choose(est);
  return est;
}

CostEstimate estimate(const AutoKey& key, const HardwareProfile* profile, CostModel model) {
  return model == CostModel::kReference ? estimate_reference(key, profile)
                                        : estimate_refined(key, profile);
}

std::string describe(const AutoKey& key) {
  std::string out = fmt::format("{}x{} G={}", key.m, key.n, key.group_size);
  if (key.partition_dim != 0) out += fmt::format(" dim={}", key.partition_dim);
  if (key.second_group_size > 1) out += fmt::format(" G2={}", key.second_group_size);
  out += key.crosses_domain ? " cross-domain" : " intra-domain";
  return out;
}

std::string format_cost(double value, bool seconds) {
  if (!seconds) {
    if (value >= 1e12) return fmt::format("{:.2f} TFLOP", value * 1e-12);
    if (value >= 1e9) return fmt::format("{:.2f} GFLOP", value * 1e-9);
    return fmt::format("{:.2f} MFLOP", value * 1e-6);
  }
  if (value >= 1) return fmt::format("{:.2f} s", value);
  if (value >= 1e-3) return fmt::format("{:.2f} ms", value * 1e3);
  return fmt::format("{:.2f} us", value * 1e6);
}

}  // namespace distmuon
