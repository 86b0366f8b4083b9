#pragma once
// The per-model benchmark (`distmuon bench --model`): for every distinct Muon weight shape of a
// model, the Newton-Schulz time of each TP mode measured as training runs it, set beside
// tp_mode=auto's choice and the measured-fastest mode.
//
// Each weight is sharded as the training run shards it: GTP rows (dim 0) over the whole group,
// padded to ceil(m / G) rows per rank (RowSharding), and orthogonalised by the optimizer's code
// path (the same call Muon::step makes). Timing follows bench.h (a run's time is the slowest
// rank's, medians); the modes of a shape are interleaved round by round, so that a slow spell of a
// shared machine hits every mode alike. Auto's choice comes from AutoModeResolver with the given
// profile and cost model, on the key the optimizer builds (partition_dim 0, the group's size,
// crosses_domain of the group, fp32).
//
// Totals are per optimizer step, count-weighted medians: always-duplicated, always-distributed,
// auto (each shape in auto's mode) and the oracle (each shape in its measured-fastest exact mode;
// blockwise is reported for reference only, it changes the mathematics).

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "distmuon/bench.h"
#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/cost_model.h"
#include "distmuon/model_preset.h"
#include "distmuon/newton_schulz.h"
#include "distmuon/tp.h"

namespace distmuon {

struct ModelBenchConfig {
  std::string model;                 // what the weights are called in reports (the model spec)
  std::vector<WeightShape> weights;  // e.g. muon_weights(resolve_model(model))
  // Must hold duplicated and distributed; blockwise is optional (reference); auto is refused.
  std::vector<TpMode> modes = {TpMode::kDuplicated, TpMode::kDistributed, TpMode::kBlockwise};
  NsOptions ns;
  TimingOptions timing{1, 5};    // warm-up rounds and timed rounds
  std::string profile = "none";  // auto's profile spec (name, file or none)
  std::string cost_model = "refined";
  // Shapes whose matrix (m n) or distributed Gram matrix (n^2) holds more elements are refused.
  Index max_elements = Index{1} << 24;
  std::uint64_t seed = 0;
};

struct ModelBenchMode {
  TpMode mode = TpMode::kDuplicated;
  TimingSummary time;
};

struct ModelBenchShape {
  Index m = 0, n = 0, count = 0;
  std::vector<std::string> names;
  Index shard_rows = 0, pad = 0;      // per rank, and zero rows appended to the weight
  std::vector<ModelBenchMode> modes;  // in config order
  AutoKey key;                        // what auto resolved
  CostEstimate estimate;              // the cost model's estimate for the key
  TpMode auto_mode = TpMode::kDuplicated;
  TpMode fastest = TpMode::kDuplicated;  // of duplicated and distributed, by median
  double regret = 0;                     // auto's median / fastest's median - 1

  double median_s(TpMode mode) const;  // throws when the mode was not measured
};

struct ModelBenchTotals {
  double duplicated_s = 0, distributed_s = 0, auto_s = 0, oracle_s = 0;
  // The cost model's predictions of the same totals (seconds; zero without a profile).
  double predicted_duplicated_s = 0, predicted_distributed_s = 0, predicted_auto_s = 0;
};

struct ModelBenchReport {
  std::string model;
  int group_size = 1;
  int blas_threads = 1;
  bool crosses_domain = false;
  std::string profile;  // the profile's name, or "none"
  bool has_profile = false;
  std::string cost_model;
  std::string coefficients;
  int steps = 0;
  bool use_syrk = true;
  TimingOptions timing;
  std::vector<TpMode> modes;
  std::vector<ModelBenchShape> shapes;  // distinct (m, n), in order of first appearance
  ModelBenchTotals totals;
};

// Collective over the group (every rank with the same config). Invalid configurations and shapes
// above max_elements throw CollectiveError on every rank, naming the shapes.
ModelBenchReport run_model_bench(const Communicator& group, const ModelBenchConfig& config,
                                 Compute& compute = cpu_compute());

// Every number of the report (times in ms).
nlohmann::json to_json(const ModelBenchReport& report);
// The per-shape table and the totals.
std::string format_report(const ModelBenchReport& report);

}  // namespace distmuon
