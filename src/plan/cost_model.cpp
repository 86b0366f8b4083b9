// The two cost models. Equations and sources: docs/cost-model.md.
#include "distmuon/cost_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "distmuon/error.h"
#include "distmuon/newton_schulz.h"
#include "plan/cost_rates.h"
#include "plan/plan_names.h"

namespace distmuon {
namespace {
using detail::Rates;

constexpr double kNormBytes = 8;  // the global Frobenius norm is all-reduced as one double

Index ceil_div(Index a, Index b) {
  return (a + b - 1) / b;
}

// Adds one ring collective over g ranks of `payload` bytes (as CommStats counts it) to a mode.
// All-gather: each rank sends payload (g - 1) / g in g - 1 steps; all-reduce (reduce-scatter then
// all-gather): 2 payload (g - 1) / g in 2 (g - 1) steps. A group of one issues nothing.
void add_collective(ModeCost& c, bool reduce, double payload, int g, bool crosses,
                    const Rates& rates) {
  if (g <= 1) return;
  const double factor = reduce ? 2.0 : 1.0;
  const double wire = factor * payload * (g - 1) / g;
  c.payload_bytes += payload;
  c.wire_bytes += wire;
  ++(reduce ? c.all_reduces : c.all_gathers);
  if (rates.profile == nullptr) return;
  const CollectiveFit* fit = reduce ? rates.all_reduce : rates.all_gather;
  const double gbps = fit != nullptr ? fit->gbps : rates.profile->bandwidth_gbps(g, crosses);
  const double alpha_us = fit != nullptr ? fit->latency_us : rates.profile->latency_us(crosses);
  c.bandwidth_s += wire / (gbps * 1e9);
  c.latency_s += factor * (g - 1) * alpha_us * 1e-6;
}

void add_all_gather(ModeCost& c, double payload, int g, bool crosses, const Rates& rates) {
  add_collective(c, false, payload, g, crosses, rates);
}

void add_all_reduce(ModeCost& c, double payload, int g, bool crosses, const Rates& rates) {
  add_collective(c, true, payload, g, crosses, rates);
}

// The Gram side s and the other side l of a rows x cols matrix iterated with the Gram on `side`.
std::pair<double, double> gram_and_long(Index rows, Index cols, GramSide side) {
  const bool on_rows = side == GramSide::kRows || (side == GramSide::kAuto && rows <= cols);
  return {static_cast<double>(on_rows ? rows : cols), static_cast<double>(on_rows ? cols : rows)};
}

// Seconds of NS's matrix products on a rows x cols matrix at the calibrated rates of their own
// shapes. Standard, per step: the Gram matrix (syrk s x s of inner size l, or a gemm s x s x l),
// A A (syrk or gemm of size s x s x s) and the update X B (gemm l x s x s). Gram algorithm: the
// Gram matrices of the s x L iterate (1 + restarts) and as many products Q X_0 (gemm s x s x l);
// per step R^2 (syrk s^3); on every step but the last and those ending in a restart, P Q, P^2
// and R P^2 (gemm, syrk, gemm of size s^3). FLOPs as ns_flops counts them.
//
// batch > 1: one batched call per product for batch matrices (a backend that batches NS): each
// call does batch times the FLOPs at the calibrated rate of one product of the same Gram side and
// batch times the other side (one launch for the work of batch products: on a GPU the small
// products' launch and latency, which their calibrated rates include, are paid once per call).
double calibrated_products_s(const Calibration& cal, Index rows, Index cols, GramSide side,
                             const AutoKey& key, NsAlgorithm algorithm, double batch = 1) {
  const auto [s, l] = gram_and_long(rows, cols, side);
  const bool syrk = key.use_syrk;
  const double gram = batch * (syrk ? s * s * l / cal.gram_syrk.flops_per_s(s, batch * l)
                                    : 2 * s * s * l / cal.update_gemm.flops_per_s(s, batch * l));
  const double square = batch * (syrk ? s * s * s / cal.gram_syrk.flops_per_s(s, batch * s)
                                      : 2 * s * s * s / cal.update_gemm.flops_per_s(s, batch * s));
  const double update = batch * 2 * s * s * l / cal.update_gemm.flops_per_s(s, batch * l);
  if (algorithm != NsAlgorithm::kGram) return key.steps * (gram + square + update);
  const double cube = batch * 2 * s * s * s / cal.update_gemm.flops_per_s(s, batch * s);
  const int grams = key.gram_formations;
  const int inner = key.steps - grams;  // steps followed by P Q, P^2 and R P^2
  return grams * (gram + update) + key.steps * square + inner * (square + 2 * cube);
}

// Elements touched by the elementwise passes of one orthogonalisation of a rows x cols matrix as
// the optimizer runs it (x = rows cols elements, s x s Gram matrices):
//  - sum_squares: the norm, x;
//  - fills of freshly allocated buffers: the iteration's scratch (x) and its s x s matrices (A
//    and B; the Gram algorithm's five); the optimizer orthogonalises its rows in place;
//  - passes over buffers in use (one read-write stream each): the normalisation and the Muon
//    scaling (2 x), and the copy back when the result sits in the scratch buffer (standard: an
//    odd step count; Gram: always, Q X_0 is formed there), x;
//  - axpby: B = b A + c A A (Gram: P = b R + c R^2), s^2 per step.
struct ElementwiseWork {
  double sum_squares = 0, scale = 0, axpby = 0, fill = 0;
};

ElementwiseWork ns_elementwise(Index rows, Index cols, GramSide side, int steps,
                               NsAlgorithm algorithm) {
  const double s = gram_and_long(rows, cols, side).first;
  const double x = static_cast<double>(rows) * static_cast<double>(cols);
  const bool gram = algorithm == NsAlgorithm::kGram;
  const bool copy_back = gram || steps % 2 == 1;
  return {.sum_squares = x,
          .scale = x * (2 + (copy_back ? 1 : 0)),
          .axpby = steps * s * s,
          .fill = x + (gram ? 5 : 2) * s * s};
}

void add_elementwise(ModeCost& c, const ElementwiseWork& w, const Rates& rates) {
  c.elementwise_elements += w.sum_squares + w.scale + w.axpby + w.fill;
  if (rates.compute == nullptr) return;
  const ElementwiseRates& r = rates.compute->elementwise;
  c.elementwise_s +=
      (w.sum_squares / r.sum_squares + w.scale / r.scale + w.axpby / r.axpby + w.fill / r.fill) *
      1e-9;
}

// Adds one NS run on a rows x cols matrix to a mode: FLOPs and elementwise work always; seconds
// at the calibrated rates when they apply, else FLOPs at the profile's peak (and no elementwise
// time: the datasheet model leaves it out).
void add_ns(ModeCost& c, Index rows, Index cols, GramSide side, const AutoKey& key,
            NsAlgorithm algorithm, const Rates& rates) {
  // FLOPs as ns_flops counts them (c != 0); the Gram algorithm's from its formation count.
  const auto [s, l] = gram_and_long(rows, cols, side);
  const double sym = key.use_syrk ? 1 : 2;
  const int inner = key.steps - key.gram_formations;
  const double flops = algorithm == NsAlgorithm::kGram
                           ? key.gram_formations * (sym + 2) * s * s * l +
                                 key.steps * sym * s * s * s + inner * (sym + 4) * s * s * s
                           : ns_flops(rows, cols, key.steps, key.use_syrk, side);
  c.flops += flops;
  add_elementwise(c, ns_elementwise(rows, cols, side, key.steps, algorithm), rates);
  if (rates.compute != nullptr) {
    c.compute_s += calibrated_products_s(*rates.compute, rows, cols, side, key, algorithm);
  } else if (rates.profile != nullptr) {
    c.compute_s += flops / (rates.profile->peak_tflops(key.elem_size) * 1e12);
  }
}

// Every term of every mode times batch (FLOPs, bytes, times, collective calls), the latencies
// times `calls` (the collectives a batch issues per matrix's one).
void scale_batch(CostEstimate& e, double batch, double calls) {
  if (batch == 1 && calls == 1) return;
  for (ModeCost* c : {&e.duplicated, &e.distributed, &e.duplicated_gram, &e.distributed_gram,
                      &e.owner, &e.owner_gram}) {
    c->flops *= batch;
    c->payload_bytes *= batch;
    c->wire_bytes *= batch;
    c->elementwise_elements *= batch;
    c->compute_s *= batch;
    c->elementwise_s *= batch;
    c->bandwidth_s *= batch;
    c->latency_s *= calls;
    c->all_gathers = static_cast<int>(c->all_gathers * calls);
    c->all_reduces = static_cast<int>(c->all_reduces * calls);
  }
}

CostEstimate estimate_refined_batch(const AutoKey& key, const HardwareProfile* profile);

// Fewer seconds (profile) or fewer FLOPs (none; a crossing group gives duplicated) among the
// candidates: duplicated and distributed, with the standard algorithm and, when the estimate
// prices it and the key allows it, the Gram algorithm. Ties: duplicated, then standard.
void choose(CostEstimate& e, const AutoKey& key) {
  std::vector<NsAlgorithm> algorithms;
  if (!e.prices_gram || auto_key_allows(key, NsAlgorithm::kStandard))
    algorithms.push_back(NsAlgorithm::kStandard);
  if (e.prices_gram && auto_key_allows(key, NsAlgorithm::kGram))
    algorithms.push_back(NsAlgorithm::kGram);
  const bool only_duplicated = !e.has_profile && e.crosses_domain;
  bool first = true;
  for (TpMode mode : {TpMode::kDuplicated, TpMode::kDistributed}) {
    if (only_duplicated && mode == TpMode::kDistributed) continue;
    for (NsAlgorithm a : algorithms) {
      if (first || e.cost(mode, a) < e.best_cost()) {
        e.choice = mode;
        e.algorithm = a;
        first = false;
      }
    }
  }
}

}  // namespace

CostModel parse_cost_model(std::string_view name) {
  return detail::parse_enum<CostModel>(name, "cost model");
}

const char* to_string(CostModel model) {
  return detail::name_of(model);
}

std::int64_t to_code(const AutoChoice& choice) {
  return static_cast<std::int64_t>(choice.mode) * 4 + static_cast<std::int64_t>(choice.algorithm);
}

AutoChoice choice_from_code(std::int64_t code) {
  return {static_cast<TpMode>(code / 4), static_cast<NsAlgorithm>(code % 4)};
}

std::string to_string(const AutoChoice& choice) {
  return choice.algorithm == NsAlgorithm::kGram ? fmt::format("{}+gram", to_string(choice.mode))
                                                : std::string(to_string(choice.mode));
}

const ModeCost& CostEstimate::of(TpMode mode, NsAlgorithm algorithm) const {
  const bool gram = algorithm == NsAlgorithm::kGram;
  switch (mode) {
    case TpMode::kDuplicated:
      return gram ? duplicated_gram : duplicated;
    case TpMode::kDistributed:
      return gram ? distributed_gram : distributed;
    case TpMode::kOwner:
      return gram ? owner_gram : owner;
    default:
      break;
  }
  throw Error(fmt::format("cost model: no estimate for mode {}", to_string(mode)));
}

double CostEstimate::cost(TpMode mode, NsAlgorithm algorithm) const {
  const ModeCost& c = of(mode, algorithm);
  return has_profile ? c.seconds() : c.flops;
}

void validate_key(const AutoKey& key) {
  const auto bad = [&](const std::string& why) {
    throw Error(fmt::format("cost model: invalid weight {} G={}: {}", shape_str(key.m, key.n),
                            key.group_size, why));
  };
  if (key.m < 1 || key.n < 1) bad("the shape must be positive");
  if (key.group_size < 1 || key.second_group_size < 1) bad("group sizes must be >= 1");
  if (static_cast<std::int64_t>(key.group_size) * key.second_group_size > kMaxGroupSize)
    bad(fmt::format("groups of {} x {} ranks exceed the maximum of {}", key.group_size,
                    key.second_group_size, kMaxGroupSize));
  if (key.partition_dim != 0 && key.partition_dim != 1) bad("partition_dim must be 0 or 1");
  if (key.steps < 1) bad(fmt::format("steps must be >= 1, got {}", key.steps));
  if (key.elem_size < 1) bad(fmt::format("elem_size must be >= 1, got {}", key.elem_size));
  if (key.gram_formations < 1 || key.gram_formations > key.steps)
    bad(fmt::format("gram_formations must be in [1, steps], got {}", key.gram_formations));
  if (key.batch < 1 || key.batch > kMaxBatch)
    bad(fmt::format("batch must be in [1, {}], got {}", kMaxBatch, key.batch));
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
  scale_batch(est, static_cast<double>(key.batch), static_cast<double>(key.batch));
  choose(est, key);
  return est;
}

CostEstimate estimate_refined(const AutoKey& key, const HardwareProfile* profile) {
  validate_key(key);
  if (key.batch > 1) return estimate_refined_batch(key, profile);
  const int g = key.group_size, g2 = key.second_group_size, e = key.elem_size;
  const bool x = key.crosses_domain;
  const Rates rates(profile, e, x);
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
  // duplicated: gather the whole matrix, NS of it along min(m, n) on every rank. The gathered
  // matrix is a fresh buffer (a contiguous shard is sent as it is) and the slice is copied back.
  for (ModeCost* c : {&est.duplicated, &est.duplicated_gram}) {
    add_all_gather(*c, first_gather, g2, x, rates);
    add_all_gather(*c, padded * e, g, x, rates);
    if (g > 1) add_elementwise(*c, {.scale = padded / g, .fill = padded}, rates);
  }
  add_ns(est.duplicated, key.m, key.n, GramSide::kAuto, key, NsAlgorithm::kStandard, rates);
  add_ns(est.duplicated_gram, key.m, key.n, GramSide::kAuto, key, NsAlgorithm::kGram, rates);
  // distributed: keep the shard, Gram on the unsplit side (n x n for rows, m x m for columns),
  // the norm all-reduce, then one Gram all-reduce per step (Gram algorithm: 1 + restarts).
  const double gram_side = static_cast<double>(rows_split ? key.n : key.m);
  const GramSide shard_side = rows_split ? GramSide::kCols : GramSide::kRows;
  const Index shard_rows = rows_split ? k : key.m, shard_cols = rows_split ? key.n : k;
  for (NsAlgorithm a : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
    ModeCost& dist = a == NsAlgorithm::kGram ? est.distributed_gram : est.distributed;
    add_all_gather(dist, first_gather, g2, x, rates);
    add_all_reduce(dist, kNormBytes, g, x, rates);
    const int grams = a == NsAlgorithm::kGram ? key.gram_formations : key.steps;
    for (int i = 0; i < grams; ++i)
      add_all_reduce(dist, gram_side * gram_side * e, g, x, rates);
    add_ns(dist, shard_rows, shard_cols, shard_side, key, a, rates);
  }
  // owner: the full (padded) matrix's NS on one rank; its bytes in and out of the all-to-alls.
  for (NsAlgorithm a : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
    ModeCost& own = a == NsAlgorithm::kGram ? est.owner_gram : est.owner;
    own.payload_bytes = 2 * padded * e;
    add_ns(own, key.m, key.n, GramSide::kAuto, key, a, rates);
  }
  est.prices_gram = true;
  choose(est, key);
  return est;
}

namespace {

// A batched key (docs/cost-model.md, "Batched parameters"): what the executor runs for its batch
// matrices (tp/sharded_ns.h, orthogonalize_shards). Duplicated gathers the whole batch in one
// collective per group (the latency once, the bytes of all, and what arrives copied into place:
// gather_batch_into), then runs their NS as one batch (one batched call per product where the
// backend batches); distributed runs one matrix after the other (batch x everything); owner: each
// matrix one unit of the bucket's LPT (estimate_owner_bucket), its share the batch's NS.
CostEstimate estimate_refined_batch(const AutoKey& key, const HardwareProfile* profile) {
  AutoKey one = key;
  one.batch = 1;
  one.batched_products = false;
  CostEstimate est = estimate_refined(one, profile);
  const double b = static_cast<double>(key.batch);
  scale_batch(est, b, b);
  const Rates rates(profile, key.elem_size, key.crosses_domain);
  const int g = key.group_size, g2 = key.second_group_size;
  const bool rows_split = key.partition_dim == 0;
  const Index k = ceil_div(rows_split ? key.m : key.n, g);
  const double padded =
      rows_split ? static_cast<double>(k * g) * key.n : static_cast<double>(key.m) * (k * g);
  // Per group gathered over: the first (smaller) group's arrivals are the TP-local tensors, the
  // second's the full matrices.
  const double unstaged = (g2 > 1 ? padded / g : 0.0) + (g > 1 ? padded : 0.0);
  for (ModeCost* c : {&est.duplicated, &est.duplicated_gram}) {
    c->latency_s /= b;
    c->all_gathers /= static_cast<int>(key.batch);
    add_elementwise(*c, {.scale = b * unstaged}, rates);
  }
  if (key.batched_products && rates.compute != nullptr) {
    // The duplicated batch's NS: one batched call per product for all b gathered matrices.
    for (NsAlgorithm a : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
      ModeCost& dup = a == NsAlgorithm::kGram ? est.duplicated_gram : est.duplicated;
      dup.compute_s =
          calibrated_products_s(*rates.compute, key.m, key.n, GramSide::kAuto, key, a, b);
    }
  }
  choose(est, key);
  return est;
}

}  // namespace

CostEstimate estimate(const AutoKey& key, const HardwareProfile* profile, CostModel model) {
  return model == CostModel::kReference ? estimate_reference(key, profile)
                                        : estimate_refined(key, profile);
}

AutoKey auto_key(const ShardLayout& layout, const NsOptions& ns, NsAlgorithm allowed, bool crosses,
                 int elem_size, bool batched_products) {
  AutoKey key{.m = layout.m,
              .n = layout.n,
              .crosses_domain = crosses,
              .steps = ns.steps,
              .use_syrk = ns.use_syrk,
              .elem_size = elem_size,
              .algorithm = allowed,
              .gram_formations = gram_ns_gram_count(ns),
              .batch = layout.batch,
              .batched_products = batched_products};
  const bool tp_on = layout.tp_on(), gtp_on = layout.gtp_on();
  const bool over_gtp = distributes_over_gtp(layout);
  key.group_size = over_gtp ? layout.gtp_size : tp_on ? layout.tp_size : 1;
  key.second_group_size = !(tp_on && gtp_on) ? 1 : over_gtp ? layout.tp_size : layout.gtp_size;
  key.partition_dim = over_gtp || layout.tp_dim == kNoPartition ? 0 : layout.tp_dim;
  return key;
}

std::string describe(const AutoKey& key) {
  std::string out = key.batch > 1 ? fmt::format("{} x ", key.batch) : std::string();
  out += fmt::format("{}x{} G={}", key.m, key.n, key.group_size);
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
