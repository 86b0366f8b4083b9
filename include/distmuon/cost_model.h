#pragma once
// Cost model for choosing, per weight, between the duplicated and distributed TP modes, each with
// the standard or the Gram Newton-Schulz algorithm, and per bucket of weights owner mode against
// the best per-weight choices. The tp_mode=auto resolver built on it is in auto_mode.h.
//
// CONTRACT (used by the optimizer; keep these declarations): AutoKey and AutoChoice
// (auto_choice.h), AutoModeResolver (auto_mode.h).
//
// Two models, both pure functions of (key, profile) returning a breakdown per mode; choosing is
// a separate step (CostEstimate::choice). The equations, units and sources are in
// docs/cost-model.md.
//  - reference: the original model, kept exactly (rows split, Gram forced onto n, bandwidth only).
//  - refined (default): the op sequence newton_schulz_tp really runs (partition_dim 0 or 1, the
//    two-step TP x GTP case, the norm all-reduce), ring latencies, and the payload bytes the
//    counting communicator records.
// Without a profile both compare FLOPs (a group that crosses an NVLink domain gives duplicated).
// Only the refined model prices the Gram algorithm and owner mode; the reference model keeps the
// original two candidates (duplicated, distributed with standard NS).

#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "distmuon/auto_choice.h"
#include "distmuon/comm.h"
#include "distmuon/hardware_profile.h"
#include "distmuon/layout.h"
#include "distmuon/matrix.h"
#include "distmuon/newton_schulz.h"
#include "distmuon/tp.h"

namespace distmuon {

// The key of a weight of this layout (ranks ignored) orthogonalised with ns: the group distributed
// mode reduces over and the one gathered first (distributes_over_gtp), the partition dim of the
// former (0 when it is GTP), steps, syrk and the Gram formation count of ns. allowed: the
// algorithms auto may pick; crosses: whether a group of the weight crosses an NVLink domain;
// elem_size: bytes per element of NS (4 fp32, 2 bf16). An unsharded layout: group_size 1.
// A batched layout (layout.batch > 1) gives a batched key; batched_products: the backend runs one
// batched call per NS product (Compute::batches_newton_schulz).
AutoKey auto_key(const ShardLayout& layout, const NsOptions& ns, NsAlgorithm allowed, bool crosses,
                 int elem_size = 4, bool batched_products = false);

enum class CostModel { kReference, kRefined };
CostModel parse_cost_model(std::string_view name);  // "reference", "refined"; throws listing them
const char* to_string(CostModel model);

// What one mode costs on one rank of the group for one weight. Times are zero without a profile.
struct ModeCost {
  double flops = 0;          // per rank, as counted by ns_flops (syrk = s^2 L, gemm = 2 m n k)
  double payload_bytes = 0;  // summed payload per collective, as CommStats counts it
  double wire_bytes = 0;     // bytes a rank sends in ring collectives (the bandwidth term)
  int all_gathers = 0;       // collective calls per NS run
  int all_reduces = 0;
  double elementwise_elements = 0;  // elements the elementwise passes touch (refined only)
  double compute_s = 0;             // flops / (peak 1e12), or at the calibrated product rates
  double elementwise_s = 0;         // those passes at the calibrated elementwise rates (else 0)
  double bandwidth_s = 0;           // wire_bytes / (bandwidth 1e9)
  double latency_s = 0;             // ring steps x per-step latency (refined only)
  double comm_s() const { return bandwidth_s + latency_s; }
  double seconds() const { return compute_s + elementwise_s + comm_s(); }
};

struct CostEstimate {
  ModeCost duplicated, distributed;            // standard NS
  ModeCost duplicated_gram, distributed_gram;  // Gram NS (refined model; else zero)
  // Owner mode, this weight's share: the NS of the full matrix on its owner (compute and
  // elementwise terms) and the bytes it moves (its padded matrix in and out, as payload). The
  // time of a bucket (the busiest owner plus the all-to-alls) is estimate_owner_bucket's.
  ModeCost owner, owner_gram;
  bool has_profile = false;
  bool crosses_domain = false;
  bool prices_gram = false;  // refined model: the *_gram and owner costs are filled
  // The per-weight best among the candidates the key allows: duplicated or distributed, with
  // algorithm standard or gram.
  TpMode choice = TpMode::kDuplicated;
  NsAlgorithm algorithm = NsAlgorithm::kStandard;
  AutoChoice best() const { return {choice, algorithm}; }
  const ModeCost& of(TpMode mode, NsAlgorithm algorithm = NsAlgorithm::kStandard) const;
  // Seconds with a profile, FLOPs without (what the choice compares). Owner: this weight's NS on
  // its owner, without traffic.
  double cost(TpMode mode, NsAlgorithm algorithm = NsAlgorithm::kStandard) const;
  double cost(const AutoChoice& c) const { return cost(c.mode, c.algorithm); }
  double best_cost() const { return cost(best()); }
};

// The reference model exactly: s = min(m, n), L = max(m, n), k = m / G, gram = 1 with syrk else 2;
// FLOPs duplicated S (gram (s^2 L + s^3) + 2 s^2 L), distributed S (gram (n^2 k + n^3) + 2 n^2 k);
// bytes duplicated m n e r, distributed S 2 n^2 e r with r = (G - 1) / G. Reads m, n, group_size,
// steps, use_syrk, elem_size and crosses_domain of the key; ignores partition_dim and
// second_group_size. Ties go to duplicated.
CostEstimate estimate_reference(const AutoKey& key, const HardwareProfile* profile);
// The refined model (see the header comment and docs/cost-model.md). With a profile that carries a
// calibration of the key's precision (elem_size), compute time is each NS product's FLOPs at the
// calibrated sgemm or ssyrk rate for its size plus the elementwise bytes at the calibrated memory
// rate; when the key's crosses_domain equals the calibration's, every all-gather and all-reduce
// uses its own fitted latency and bandwidth. Otherwise the profile's datasheet figures apply.
CostEstimate estimate_refined(const AutoKey& key, const HardwareProfile* profile);
CostEstimate estimate(const AutoKey& key, const HardwareProfile* profile, CostModel model);

// How a bucket's exchanges are scheduled (tp/owner_ns.h, orthogonalize_owned): its weights in
// the executor's LPT order, cut into `chunks` chunks where it cuts them (chunk_starts), each
// chunk's exchange in flight while the next chunk's NS runs (1: the serial schedule: every NS,
// then one exchange; a bucket split over two groups at once: its two stages priced as one
// exchange over all its ranks). link: an emulated link under the bucket's
// exchanges (emulated_link_communicator, as `bench --model --link-gbps` sets it; zeros: none):
// an exchange then lasts at least latency + the bytes the rank sends / bandwidth from the rank's
// start, whatever else is in flight.
// chunks = kChosenChunks: the cheapest of kChunkCandidates (those up to the bucket's number of
// matrices) on this schedule, ties to the fewer chunks: the count the optimizer runs a bucket in
// (estimate's chunks says which; without a profile nothing is priced and it is
// kUnpricedChunks, capped the same way).
inline constexpr int kChosenChunks = 0;
inline constexpr int kChunkCandidates[] = {1, 2, 4, 8};
inline constexpr int kUnpricedChunks = 4;
struct ExchangeSchedule {
  int chunks = 1;
  LinkModel link;
};

// Owner mode for a bucket of weights that share their groups (every key with the same group
// sizes, partition and domain crossing): LPT assigns each weight to one of the
// group_size x second_group_size ranks on its FLOPs (the executor's assignment), the busiest
// owner's NS time is the compute term, and the gather and scatter all-to-alls are priced on the
// busiest rank's bytes sent or received (at the all-gather rates) plus ring latencies, with the
// staging copies at the calibrated copy rate (a calibrated profile). seconds: the bucket on its
// schedule, every rank's NS and exchanges on one timeline (src/plan/exchange_schedule.h).
// A batched key (batch > 1) is batch units of LPT, each a batch-th of its owner share, as the
// executor assigns a batched parameter's matrices one by one.
struct OwnerBucketEstimate {
  std::vector<int> owners;  // per matrix (a batched key's batch matrices in turn; else per key)
  std::vector<NsAlgorithm> algorithms;  // per key: the cheaper allowed on the owner
  double compute = 0;        // the busiest owner's NS: seconds with a profile, FLOPs without
  double comm_s = 0;         // both all-to-alls on the serial schedule (0 without a profile)
  double seconds = 0;        // the bucket on the given schedule (0 without a profile)
  double payload_bytes = 0;  // the bucket's bytes through the all-to-alls (in and out)
  int chunks = 1;            // the chunks the schedule ran in
  // Seconds on the schedule with a profile (serial, no link: compute + comm_s), FLOPs without.
  double cost() const { return seconds > 0 ? seconds : compute; }
  double exposed_comm_s() const { return seconds > 0 ? seconds - compute : 0; }
};
OwnerBucketEstimate estimate_owner_bucket(std::span<const AutoKey> keys,
                                          std::span<const CostEstimate> estimates,
                                          const HardwareProfile* profile,
                                          const ExchangeSchedule& schedule = {});

// auto over a bucket: owner (with each weight's cheaper algorithm) when its estimate on the
// schedule beats the sum of the per-weight best choices, else each weight's best. The reference
// model never picks owner. Every key must describe the same groups. Without a schedule: the
// optimizer's (kChosenChunks: the chunk count it runs the bucket in, no emulated link), the
// schedule owner mode runs.
// A batched key is one weight of the plan (one choice), its matrices LPT units of the owners.
struct BucketPlan {
  std::vector<AutoChoice> choices;           // per weight
  double per_weight_cost = 0;                // the sum of the per-weight best costs
  std::optional<OwnerBucketEstimate> owner;  // priced when the model and the keys allow it
  bool chose_owner() const { return !choices.empty() && choices[0].mode == TpMode::kOwner; }
};
BucketPlan plan_bucket(std::span<const AutoKey> keys, const HardwareProfile* profile,
                       CostModel model);
BucketPlan plan_bucket(std::span<const AutoKey> keys, const HardwareProfile* profile,
                       CostModel model, const ExchangeSchedule& schedule);

// Replicated weights: a bucket of unsharded weights held whole by each of `replicas` ranks (their
// data-parallel replicas; crosses: whether those ranks cross an NVLink domain), priced both ways.
// Every rank: each replica runs every weight's NS (its cheaper allowed algorithm). Home: LPT
// assigns each weight to one replica on its FLOPs (the executor's assignment), the busiest home's
// NS is the compute term, and one all-to-all sends each home's results (fp32, 4 bytes an element)
// to the other replicas, priced on the busiest rank's bytes sent or received (at the all-gather
// rates) plus replicas - 1 latency steps, with the staging copies (and the bf16 wire's rounding
// and packing) at the calibrated copy rate. seconds: the homes on the schedule (chunks, emulated
// link), every rank's NS and exchanges on one timeline. Without a profile both compare FLOPs
// (the exchange is free); a tie stays with every rank (it moves nothing).
// A batched key: batch units of the homes' LPT (a batch-th of the batch's NS each), as the
// executor assigns them; every rank runs the whole batch.
struct ReplicaBucketEstimate {
  std::vector<int> homes;  // per matrix (a batched key's matrices in turn): the replica running it
  std::vector<NsAlgorithm> algorithms;  // per key: the cheaper allowed
  double every_rank = 0;     // every replica's NS of the bucket: seconds with a profile, else FLOPs
  double compute = 0;        // the busiest home's NS, in the same unit
  double comm_s = 0;         // the results' all-to-all on the serial schedule (0 without a profile)
  double seconds = 0;        // the homes on the given schedule (0 without a profile)
  double payload_bytes = 0;  // the bytes the busiest rank sends
  int chunks = 1;            // the chunks the schedule ran in
  // Seconds on the schedule with a profile (serial, no link: compute + comm_s), FLOPs without.
  double home_cost() const { return seconds > 0 ? seconds : compute; }
  bool chose_home() const { return home_cost() < every_rank; }
};
// wire_bytes: bytes per element of the homes' results on the wire (4: fp32; 2: the bf16 wire).
ReplicaBucketEstimate estimate_replica_bucket(std::span<const AutoKey> keys, int replicas,
                                              bool crosses, const HardwareProfile* profile,
                                              CostModel model, double wire_bytes = 4.0,
                                              const ExchangeSchedule& schedule = {});

// The largest number of ranks a weight's groups may span (group_size x second_group_size): the
// owner estimate keeps per-rank loads, so an absurd group (-G 1000000000) would allocate gigabytes.
// 2^20 is far beyond any job the cost model describes.
inline constexpr int kMaxGroupSize = 1 << 20;
// The most matrices a batched key may hold (the owner estimate keeps one entry per matrix).
inline constexpr Index kMaxBatch = Index{1} << 20;

// Throws distmuon::Error when a key cannot be estimated (non-positive sizes, steps, elem_size,
// groups above kMaxGroupSize).
void validate_key(const AutoKey& key);
// "4096x1024 G=8 intra-domain" (with " dim=1" and " G2=2" when they apply).
std::string describe(const AutoKey& key);
// A cost for people: "1.92 ms" (seconds) or "3.41 GFLOP" (FLOPs, when there is no profile).
std::string format_cost(double value, bool seconds);

}  // namespace distmuon
