#pragma once
// The tensor-parallel NS benchmark: run_tp_bench() times every (shape, mode) of newton_schulz_tp
// with the building blocks of timing.h (timing across a group, the sgemm rate and the collective
// bandwidth measured with all ranks busy at once) and reports each against its own bound:
//   bound = per-rank FLOPs / measured sgemm rate + sum over collectives of bytes / bandwidth.

#include <cstddef>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/matrix.h"
#include "distmuon/newton_schulz.h"
#include "distmuon/timing.h"
#include "distmuon/tp.h"

namespace distmuon {

// The tensor-parallel NS benchmark.
struct TpBenchConfig {
  std::vector<std::pair<Index, Index>> shapes = {{4096, 1024}, {1024, 4096}, {2048, 2048}};
  int partition_dim = 0;
  std::vector<TpMode> modes = {TpMode::kBlockwise, TpMode::kDuplicated, TpMode::kDistributed};
  NsOptions ns;
  TimingOptions timing;             // the NS runs
  TimingOptions rate_timing{1, 5};  // sgemm and collective measurements
  std::uint64_t seed = 0;
};

struct TpBenchResult {
  Index m = 0, n = 0;
  int partition_dim = 0;
  TpMode mode = TpMode::kDuplicated;
  TimingSummary time;
  TpLocalNs local;            // what each rank iterates on
  double flops_per_rank = 0;  // tp_flops
  TpTraffic traffic;          // tp_traffic
  // Rates measured right before this case's runs (so that they see the same machine load):
  // the NS update product of `local`, and one collective per distinct message the mode sends.
  GemmRate sgemm;
  std::vector<CollectiveRate> collectives;
  double compute_bound_s = 0, comm_bound_s = 0, bound_s = 0;
  double ratio = 0;  // median / bound
};

struct TpBenchReport {
  int group_size = 1;
  int blas_threads = 1;
  std::string coefficients;
  int steps = 0;
  bool use_syrk = true;
  NsAlgorithm algorithm = NsAlgorithm::kStandard;
  TimingOptions timing, rate_timing;
  std::vector<TpBenchResult> results;  // shapes x modes, in config order
};

// Runs the benchmark on every rank of group (collective). Shapes must split evenly along the
// partition dim (else CollectiveError on every rank). For each (shape, mode): its sgemm and
// collective rates, then its NS runs (a fresh copy of the shard before each; warm-up, timed).
TpBenchReport run_tp_bench(const Communicator& group, const TpBenchConfig& config,
                           Compute& compute);

// {"group_size", ..., "results": [{"m", "n", "partition_dim", "mode", "median_ms", "min_ms",
// "max_ms", "bound_ms", "ratio", ..., "sgemm": {...}, "collectives": [...]}]}.
nlohmann::json to_json(const TpBenchReport& report);
// Human-readable tables of the rates and the results.
std::string format_report(const TpBenchReport& report);

}  // namespace distmuon
