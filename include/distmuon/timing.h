#pragma once
// Timing in the nccl-tests manner: warm-up runs, then timed runs, each started together on every
// rank (barrier) and timed as the slowest rank (all-reduce max); median and spread are reported.
// And the rates other benchmarks and calibration build on: the sgemm and ssyrk rates and the
// collective bandwidth, measured with all ranks busy at once.

#include <cstddef>
#include <functional>
#include <vector>

#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/matrix.h"

namespace distmuon {

// Times of the timed runs, in seconds (each the max over ranks), and their summary.
struct TimingSummary {
  std::vector<double> samples_s;
  double median_s = 0, min_s = 0, max_s = 0;
};
TimingSummary summarize(std::vector<double> samples_s);  // median of an even count: mean of the two

struct TimingOptions {
  int warmup = 1;
  int reps = 5;
};

// Runs `run` on every rank of group, warmup + reps times. Before each run: `prepare` (untimed,
// may be empty), then a barrier. A run's time is the slowest rank's wall time. Collective: every
// rank must call it with the same options.
TimingSummary time_on_group(const Communicator& group, const TimingOptions& timing,
                            const std::function<void()>& run,
                            const std::function<void()>& prepare = {});

// sgemm C (m x n) = A (m x k) B (k x n), row-major, on every rank at once (ranks share the
// machine's cores and memory bandwidth, as they do in NS). flops_per_s is per rank:
// 2 m n k / median time.
struct GemmRate {
  Index m = 0, n = 0, k = 0;
  TimingSummary time;
  double flops_per_s = 0;
};
GemmRate measure_sgemm(const Communicator& group, Index m, Index n, Index k,
                       const TimingOptions& timing, Compute& compute);

// Compute::syrk C (n x n) = A A^T with A n x k, both triangles written (as NS calls it), on every
// rank at once. flops_per_s is per rank in ns_flops' convention: n^2 k / median time. The result's
// m and n are both n.
GemmRate measure_ssyrk(const Communicator& group, Index n, Index k, const TimingOptions& timing,
                       Compute& compute);

// A collective at one payload size. bytes is what counting_communicator counts for one call
// (nccl-tests' "size"): all-gather: the gathered buffer (group size x chunk); all-reduce: the
// reduced buffer. alg_bw = bytes / median time (bytes/s); bus_bw is nccl-tests' bus bandwidth:
// alg_bw (G - 1) / G for all-gather, alg_bw 2 (G - 1) / G for all-reduce (sum).
enum class CollectiveKind { kAllGather, kAllReduce };
const char* to_string(CollectiveKind kind);
struct CollectiveRate {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  DType dtype = DType::kF32;
  std::size_t bytes = 0;
  TimingSummary time;
  double alg_bw = 0, bus_bw = 0;
};
// bytes must be a multiple of the element size (times the group size for an all-gather).
CollectiveRate measure_collective(const Communicator& group, CollectiveKind kind, DType dtype,
                                  std::size_t bytes, const TimingOptions& timing);

}  // namespace distmuon
