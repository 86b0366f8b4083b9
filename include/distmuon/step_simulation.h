#pragma once
// The optimizer step of a placed model, simulated per rank: for each mode the Muon work every
// rank runs (Newton-Schulz at the profile's rates, the collectives by link class), the busiest
// rank's time (the step: every rank waits for it) and the optimizer state per rank. A pure
// function of (placement, options) with its full breakdown; deciding (auto) is a separate
// reading of the same numbers. Equations and assumptions: docs/cost-model.md, "Placement and
// step simulation".
//
// Modes (per weight class: dense weights and expert weights, each with its own groups):
//  - duplicated: every rank gathers each weight over its tp x gtp shard group and runs the whole
//    NS (redundant over the shard group and the data-parallel replicas);
//  - distributed: NS over the shard group (Gram all-reduces), redundant over the replicas;
//  - owner (Megatron's layer-sharded mode): each weight gets one home in its shard group (LPT),
//    all-to-alls gather and scatter it; redundant over the replicas;
//  - replicated-home: each weight gets one home among its data-parallel replicas (LPT on its
//    per-weight best cost over the shard group), which runs it in its best TP mode; the updated
//    shards are then all-gathered over the replicas (the layer-wise distributed optimizer);
//  - auto: per weight class the mode whose busiest rank is fastest.
// Owner and replicated-home move their traffic in `buckets` pipelined chunks, as the executor
// schedules them (ExchangeSchedule: the exchange of a chunk in flight while the next chunk's NS
// runs; buckets = 1: serial): owner buckets and the homes of unsharded replicated weights on
// every rank's timeline (estimate_owner_bucket, estimate_replica_bucket); the all-gather of
// sharded replicated weights costs max(ns, comm) + min(ns, comm) / buckets. Experts of a layer on
// one rank are batched (one collective per batch: the latency once, the bytes of all) unless
// batch_experts is off.

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "distmuon/comm.h"
#include "distmuon/hardware_profile.h"
#include "distmuon/newton_schulz.h"
#include "distmuon/placement.h"

namespace distmuon {

enum class StepMode { kDuplicated, kDistributed, kOwner, kReplicatedHome, kAuto };
const char* to_string(StepMode mode);  // "duplicated", ..., "replicated-home", "auto"
inline constexpr StepMode kStepModes[] = {StepMode::kDuplicated, StepMode::kDistributed,
                                          StepMode::kOwner, StepMode::kReplicatedHome,
                                          StepMode::kAuto};

struct SimulationOptions {
  HardwareProfile profile;  // rates, link classes (a measured profile: its calibration)
  int elem_size = 2;        // NS precision: 2 bf16 (GPUs), 4 fp32 (CPUs, a CPU calibration)
  int steps = 5;
  bool use_syrk = true;
  NsAlgorithm algorithm = NsAlgorithm::kStandard;  // kAuto: the cheaper per weight
  int buckets = 1;  // pipelined buckets of owner and replicated-home (1: serial)
  bool batch_experts = true;
  int wire_elem_size = 4;  // bytes per element of the replicated-home exchange (4 fp32, 2 bf16)
  // An emulated link under owner's and replicated-home's exchanges (as `bench --model
  // --link-gbps` puts one there; zeros: none): estimate_owner_bucket's ExchangeSchedule.
  LinkModel link;
};

// One class of weights on one rank.
struct ClassStep {
  double ns_s = 0;     // NS (products and elementwise passes) on the critical path
  double comm_s = 0;   // communication on the critical path, before overlap
  double seconds = 0;  // the class's time: ns + comm, less what the buckets overlap
  int weights = 0;     // weights (experts counted one by one) of the class on the rank
  double exposed_comm_s() const { return seconds - ns_s; }
};

struct RankStep {
  int rank = 0;
  ClassStep dense, expert;
  double seconds() const { return dense.seconds + expert.seconds; }
  double ns_s() const { return dense.ns_s + expert.ns_s; }
  double comm_s() const { return dense.comm_s + expert.comm_s; }
};

struct ModeStep {
  StepMode mode = StepMode::kDuplicated;
  std::vector<RankStep> ranks;  // every rank
  int busiest = 0;              // the rank that sets the step
  double workspace_bytes = 0;   // the largest NS working set of one weight (batch) on a rank
  StepMode dense_choice = StepMode::kDuplicated, expert_choice = StepMode::kDuplicated;  // auto
  const RankStep& step() const { return ranks[static_cast<std::size_t>(busiest)]; }
  double seconds() const { return step().seconds(); }
};

struct StepSimulation {
  Parallelism parallelism;
  int domain_size = 1;
  SimulationOptions options;
  std::vector<ModeStep> modes;  // in kStepModes order
  double momentum_bytes = 0;    // Muon momentum (fp32) of the busiest rank, by options' sharding
  double parameters = 0;        // Muon weight elements of the whole model
  bool has_experts = false;
  const ModeStep& of(StepMode mode) const;
};

// Throws distmuon::Error for options out of range (steps, elem sizes, buckets < 1).
StepSimulation simulate_step(const Placement& placement, const SimulationOptions& options);

// Which Muon work one rank owns in a priced mode (not auto: ask for the mode auto chose per class),
// per weight it holds (owner and replicated-home: per expert): the NS of the whole matrix here,
// its shard's part of a distributed NS, or none (home: the rank that runs it; a home is the
// home-th rank, in rank order, of the weight's shard group (owner) or replica group
// (replicated-home)). The same assignment (LPT) the simulation prices.
enum class NsWork { kWhole, kShard, kElsewhere };
struct RankWork {
  std::string name;
  Index layer = 0;
  Index expert = -1;  // an expert's index; -1: the rank's experts of the layer together, or none
  Index experts = 0;  // how many experts the entry stands for (0: not an expert)
  NsWork work = NsWork::kWhole;
  int home = -1;  // kElsewhere: the rank that runs it
};
std::vector<RankWork> rank_work(const Placement& placement, const SimulationOptions& options,
                                int rank, StepMode mode);
std::string format_rank(const Placement& placement, const SimulationOptions& options, int rank);

// The table (per mode: step, NS, communication, exposed communication, busiest rank, memory;
// auto's choice per class) as text, and as JSON.
std::string format_simulation(const StepSimulation& sim);
void to_json(nlohmann::json& j, const StepSimulation& sim);

}  // namespace distmuon
