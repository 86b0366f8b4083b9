#pragma once
// The per-model benchmark (`distmuon bench --model`): for every distinct Muon weight shape of a
// model, the Newton-Schulz time of each TP mode with each NS algorithm measured as training runs
// it, owner mode measured over the whole model at once, set beside tp_mode=auto's plan and the
// measured-fastest candidates.
//
// Each weight is sharded as the training run shards it: GTP rows (dim 0) over the whole group,
// padded to ceil(m / G) rows per rank (RowSharding), and orthogonalised by the optimizer's code
// path (the same calls Muon::step makes). Timing follows bench.h (a run's time is the slowest
// rank's, medians); the candidates of a shape are interleaved round by round, so that a slow spell
// of a shared machine hits every candidate alike. Auto's plan comes from AutoModeResolver::plan
// with the given profile and cost model over every weight of the model (one bucket: they share
// the group), on the keys the optimizer builds (partition_dim 0, the group's size,
// crosses_domain of the group, fp32), planned on rank 0 and shared; with plan measure, from
// plan_by_measuring on those keys (its timed runs come before the benchmark's own).
//
// Totals are per optimizer step, count-weighted medians: always-duplicated and always-distributed
// (standard NS: the modes before owner and Gram existed), each owner run, auto (owner's measured
// time when it planned owner, else each shape in its planned candidate) and the oracle (the
// fastest of: every shape in its measured-fastest exact per-weight candidate, and each owner run).
// Blockwise is reported for reference only, it changes the mathematics.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "distmuon/bench.h"
#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/cost_model.h"
#include "distmuon/measure_plan.h"
#include "distmuon/model_preset.h"
#include "distmuon/newton_schulz.h"
#include "distmuon/tp.h"

namespace distmuon {

struct ModelBenchConfig {
  std::string model;                 // what the weights are called in reports (the model spec)
  std::vector<WeightShape> weights;  // e.g. muon_weights(resolve_model(model))
  // Must hold duplicated and distributed; blockwise is optional (reference); auto is refused.
  std::vector<TpMode> modes = {TpMode::kDuplicated, TpMode::kDistributed, TpMode::kBlockwise};
  NsOptions ns;  // ns.algorithm is ignored: see algorithm
  // The algorithms measured and offered to auto: standard (the optimizer's default), gram, or
  // kAuto (both).
  NsAlgorithm algorithm = NsAlgorithm::kStandard;
  TimingOptions timing{1, 5};    // warm-up rounds and timed rounds
  std::string profile = "none";  // auto's profile spec (name, file or none)
  std::string cost_model = "refined";
  // How auto plans: by the model's estimate, or by timing its leading candidates first
  // (measure_plan.h: measure.wisdom, measure.reps, ...) on this benchmark's sharding.
  PlanMode plan = PlanMode::kEstimate;
  MeasurePlanOptions measure;
  // Shapes whose matrix (m n) or distributed Gram matrix (n^2) holds more elements are refused.
  Index max_elements = Index{1} << 24;
  std::uint64_t seed = 0;
  // Also time the weights replicated over the group (data parallelism, unsharded): every rank's
  // NS of every weight against one home per weight (ModelBenchReplicated).
  bool replicated = false;
  // The chunks of the pipelined owner and home schedules (owner's first run also timed on the
  // serial schedule; the homes' with replicated); 0: the cost model's cheapest count for each run
  // over the link (kChosenChunks, as the optimizer chooses; kUnpricedChunks without a profile).
  // An emulated link (emulated_link_communicator) under owner mode's exchanges and the
  // replicas' (zeros: none; the per-shape candidates run without it).
  int pipeline = 0;
  LinkModel link;
  // Called (where set) before each timed round with what is being measured, e.g. "round 2 of 6";
  // the CLI sets it on rank 0 for its progress line.
  std::function<void(const std::string&)> progress;
};

struct ModelBenchMode {
  TpMode mode = TpMode::kDuplicated;
  NsAlgorithm algorithm = NsAlgorithm::kStandard;
  TimingSummary time;
};

// A batched shape (WeightShape::batch > 1: a layer's experts, one [batch, m, n] parameter) is
// timed per parameter, its batch matrices together as the optimizer runs them
// (orthogonalize_shards: duplicated gathers them and runs their NS as one batch, distributed one
// after the other); count / batch parameters per step. Owner and the replicated runs take its
// matrices one by one as LPT units, as the optimizer does.
struct ModelBenchShape {
  Index m = 0, n = 0, count = 0;  // count: matrices per step
  Index batch = 1;                // matrices per parameter
  Index parameters() const { return count / batch; }
  std::vector<std::string> names;
  Index shard_rows = 0, pad = 0;      // per rank, and zero rows appended to the weight
  std::vector<ModelBenchMode> modes;  // config modes x algorithms, in config order
  AutoKey key;                        // what auto planned on (batch: the parameter's)
  CostEstimate estimate;              // the cost model's estimate for the key
  AutoChoice auto_choice;             // auto's plan (owner: for the whole model)
  AutoChoice fastest;                 // the fastest exact per-weight candidate, by median
  double regret = 0;  // per-weight plans: auto's median / fastest's median - 1 (owner: 0)
  // plan measure: the planner's times of the candidates it measured (or read from wisdom).
  std::vector<MeasuredCandidate> planned;

  // Throws when the candidate was not measured.
  double median_s(TpMode mode, NsAlgorithm algorithm = NsAlgorithm::kStandard) const;
};

// Owner mode over every Muon weight of the model at once (one bucket, LPT owners).
struct ModelBenchOwner {
  std::string label;                    // "owner", "owner+gram", "owner (auto's algorithms)"
  std::vector<NsAlgorithm> algorithms;  // per weight, shapes in order, count copies each
  TimingSummary time;
  double predicted_s = 0;  // estimate_owner_bucket's cost with a profile (else 0)
  double planned_s = 0;    // plan measure: the planner's time of this run, when it timed it
  // The first run again on the serial schedule (one exchange per stage, when the first runs in
  // more than one chunk), timed beside the pipelined runs; never auto's choice.
  bool serial = false;
  int chunks = 1;  // the chunks the run took
};

// The model's weights replicated over the group (ModelBenchConfig::replicated): one optimizer
// step's NS with every rank running every weight, and with one home per weight (LPT on the
// FLOPs, results sent to the other replicas) on the serial and the pipelined schedule, and
// pipelined with the bf16 wire, timed in the same interleaved rounds; the cost model's
// predictions of each (estimate_replica_bucket on each schedule, with the emulated link; zero
// without a profile) and auto's choice.
struct ModelBenchReplicated {
  int replicas = 1;
  // home: the serial schedule; home_pipelined: pipeline chunks (the optimizer's schedule);
  // home_bf16: pipelined, the results in bf16 on the wire (replica_wire bf16).
  TimingSummary every_rank, home, home_pipelined, home_bf16;
  int pipeline = 1;        // home_pipelined's chunks
  LinkModel link;          // the emulated link (zeros: none)
  std::vector<int> homes;  // per weight (count copies per shape, in order)
  double predicted_every_rank_s = 0, predicted_home_s = 0, predicted_home_pipelined_s = 0,
         predicted_home_bf16_s = 0;
  // replica_mode auto (tp_mode auto) would choose homes: estimate_replica_bucket on the pipelined
  // schedule and the emulated link, fp32 wire (without a profile: on FLOPs).
  bool auto_home = false;
  // Auto's measured time over the faster mode's, as the optimizer runs them (every rank, or the
  // homes on the pipelined schedule, fp32 wire), - 1.
  double regret = 0;
};

struct ModelBenchTotals {
  double duplicated_s = 0, distributed_s = 0, auto_s = 0, oracle_s = 0;
  double per_weight_oracle_s = 0;  // every shape in its fastest per-weight candidate
  // The predictions of the same totals (seconds): the cost model's (zero without a profile);
  // auto's is the planner's measured time with plan measure.
  double predicted_duplicated_s = 0, predicted_distributed_s = 0, predicted_auto_s = 0;
  double best_fixed_s() const {
    return duplicated_s < distributed_s ? duplicated_s : distributed_s;
  }
};

struct ModelBenchReport {
  std::string model;
  int group_size = 1;
  int blas_threads = 1;
  bool crosses_domain = false;
  std::string profile;  // the profile's name, or "none"
  bool has_profile = false;
  std::string cost_model;
  PlanMode plan = PlanMode::kEstimate;
  std::size_t plan_timed_runs = 0;  // plan measure: runs the planner timed (0: all from wisdom)
  std::string coefficients;
  int steps = 0;
  bool use_syrk = true;
  TimingOptions timing;
  std::vector<TpMode> modes;
  std::vector<ModelBenchShape> shapes;  // distinct (m, n), in order of first appearance
  std::vector<ModelBenchOwner> owner;   // measured with more than one rank
  bool auto_owner = false;              // auto planned owner mode for the model
  std::vector<NsAlgorithm> algorithms;  // the algorithms measured
  ModelBenchTotals totals;
  std::optional<ModelBenchReplicated> replicated;  // when the config asked for it
};

// Collective over the group (every rank with the same config). Invalid configurations and shapes
// above max_elements throw CollectiveError on every rank, naming the shapes. Runs on compute's
// memory (any backend): each shape's full matrix is drawn on the host and this rank's shard
// uploaded once; work copies, NS scratch and gathered buffers are the backend's (the scratch kept
// across runs, as the optimizer keeps it); the shards move over compute.data_communicator(group)
// (attached once, unless group already has a data plane); the backend is synchronised before the
// clock is read.
ModelBenchReport run_model_bench(const Communicator& group, const ModelBenchConfig& config,
                                 Compute& compute);

// Every number of the report (times in ms).
nlohmann::json to_json(const ModelBenchReport& report);
// The per-shape table and the totals.
std::string format_report(const ModelBenchReport& report);

}  // namespace distmuon
