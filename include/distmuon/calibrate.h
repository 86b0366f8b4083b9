#pragma once
// Calibration: measuring this machine, with the group in use, into a HardwareProfile whose
// "calibration" the refined cost model then uses (`distmuon calibrate`). Measurements follow the
// nccl-tests conventions of bench.h: warm-up runs, timed runs started together on every rank, a
// run's time is the slowest rank's, medians.
//
// Measured, every rank of the group at once (ranks share the machine's cores and memory, as they
// do during NS):
//  - NS's two product shapes over a grid (s, l) of sizes, s the Gram side and l the other side:
//    Compute::syrk of an s x l matrix (the Gram matrix; l = s is the A A product) and
//    Compute::gemm of (l x s) times (s x s) (the update X B): the rate tables;
//  - NS's elementwise passes (Compute::sum_squares, scale, axpby) over one buffer, and the zero
//    fill of freshly allocated buffers (page faults included);
//  - all-gather and all-reduce of f32 over a sweep of payload sizes, `factor` apart (nccl-tests'
//    -b/-e/-f): per collective a line t(P) = a + b P fitted by relative least squares, turned
//    into the ring terms the cost model uses (latency per ring step, bus bandwidth).

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/hardware_profile.h"
#include "distmuon/timing.h"

namespace distmuon {

// Bounds of CalibrateOptions (validate): an sgemm of 16384^3 is already about 9 TFLOP a run, and
// a collective payload past 1 GiB nears MPI's int counts (and the payload sweep multiplying past
// SIZE_MAX would never end).
inline constexpr Index kMaxCalibrateSize = 16384;
inline constexpr std::size_t kMaxCalibrateBytes = std::size_t{1} << 30;

struct CalibrateOptions {
  std::string name = "calibrated";                             // the profile's name
  std::vector<Index> sizes = {64, 128, 256, 512, 1024, 2048};  // grid of s and l, ascending
  std::size_t min_bytes = 8;                                   // collective sweep: first payload
  std::size_t max_bytes = 64u << 20;                           // last payload (at most)
  int factor = 4;                                              // ratio of consecutive payloads
  Index elementwise_elements = 1 << 20;  // elements of the elementwise buffers (4 MiB of f32)
  TimingOptions compute_timing{1, 5};
  TimingOptions comm_timing{5, 20};
  // Called (where set) before each measurement with what it measures, e.g. "syrk 512x1024
  // (14/36)"; the CLI sets it on rank 0 for its progress line.
  std::function<void(const std::string&)> progress;
  void validate() const;  // throws distmuon::Error naming the option
  // Bytes one rank of a group of group_size allocates at most during calibrate(): the largest
  // sgemm's and ssyrk's matrices, the collective buffers of the largest payload (an all-gather
  // receives group_size of them) and the elementwise buffers. For check_memory_fits before the
  // measurements; a double, so absurd sizes cannot wrap.
  double memory_bytes(int group_size) const;
};

// A line t(P) = a + b P (seconds, P in payload bytes) through a collective's sweep.
struct LineFit {
  double a_s = 0;            // time of an empty message: the latency of one call
  double b_s_per_byte = 0;   // inverse of the algorithm bandwidth
  double max_rel_error = 0;  // max over the sweep of |fit / measured - 1|
  bool fallback = false;     // the fitted slope was not positive (see fit_latency_bandwidth)
};

// Fits the medians of a sweep (ascending payloads) by minimising sum ((a + b P_i) / t_i - 1)^2, so
// that small messages (latency) and large ones (bandwidth) weigh alike. A negative intercept is
// clamped to 0 (and b refitted). A slope that is not positive (a sweep too small or too noisy to
// see the bandwidth) falls back to a = the smallest time and b = t / P of the largest message,
// with fallback set. Throws on an empty sweep.
LineFit fit_latency_bandwidth(const std::vector<CollectiveRate>& sweep);
// The ring terms of a line over g > 1 ranks. All-gather: t = (g - 1) alpha + P (g - 1) / g / bw;
// all-reduce: t = 2 (g - 1) alpha + 2 P (g - 1) / g / bw.
CollectiveFit ring_terms(CollectiveKind kind, int group_size, const LineFit& line);

struct CollectiveSweep {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  std::vector<CollectiveRate> points;
  LineFit line;
  CollectiveFit fit;
};

struct CalibrationReport {
  HardwareProfile profile;                        // what `calibrate --out` writes
  std::vector<GemmRate> gram_syrk, update_gemm;   // s-major over the grid (m, n, k as run)
  TimingSummary sum_squares, scale, axpby, fill;  // one pass each
  std::vector<CollectiveSweep> collectives;       // empty for a group of one
};

// Collective over the group: every rank must call it with the same options. The profile is the
// same on every rank (rank 0's host name and CPU model).
CalibrationReport calibrate(const Communicator& group, const CalibrateOptions& options,
                            Compute& compute);
// The measurements as tables, and the profile's summary.
std::string format_calibration(const CalibrationReport& report);

}  // namespace distmuon
