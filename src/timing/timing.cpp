// Timing across a group, the sgemm rate and collective bandwidth (nccl-tests conventions).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "distmuon/error.h"
#include "distmuon/timing.h"
#include "timing/timing_names.h"

namespace distmuon {

TimingSummary summarize(std::vector<double> samples_s) {
  TimingSummary t;
  t.samples_s = samples_s;
  if (samples_s.empty()) return t;
  std::sort(samples_s.begin(), samples_s.end());
  const std::size_t n = samples_s.size();
  t.median_s = n % 2 == 1 ? samples_s[n / 2] : 0.5 * (samples_s[n / 2 - 1] + samples_s[n / 2]);
  t.min_s = samples_s.front();
  t.max_s = samples_s.back();
  return t;
}

TimingSummary time_on_group(const Communicator& group, const TimingOptions& timing,
                            const std::function<void()>& run,
                            const std::function<void()>& prepare) {
  if (timing.warmup < 0 || timing.reps < 1) {
    throw Error(fmt::format("benchmark timing: warm-up {} must be >= 0 and reps {} >= 1",
                            timing.warmup, timing.reps));
  }
  std::vector<double> samples;
  samples.reserve(static_cast<std::size_t>(timing.reps));
  for (int i = 0; i < timing.warmup + timing.reps; ++i) {
    if (prepare) prepare();
    group.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    run();
    const double local =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double slowest = group.all_reduce(local, ReduceOp::kMax);
    if (i >= timing.warmup) samples.push_back(slowest);
  }
  return summarize(std::move(samples));
}

GemmRate measure_sgemm(const Communicator& group, Index m, Index n, Index k,
                       const TimingOptions& timing, Compute& compute) {
  Matrix a(m, k), b(k, n);
  std::mt19937 rng(static_cast<unsigned>(group.rank()) + 1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& v : a.values())
    v = dist(rng);
  for (float& v : b.values())
    v = dist(rng);
  // The operands in the backend's memory; each run waits for the backend before the clock.
  const DeviceMatrix da = to_device(compute, a.view()), db = to_device(compute, b.view());
  DeviceMatrix dc(compute, m, n);
  GemmRate r{m, n, k, {}, 0};
  r.time = time_on_group(group, timing, [&] {
    compute.gemm(Trans::kNo, Trans::kNo, 1.0f, da.view(), db.view(), 0.0f, dc.view());
    compute.synchronize();
  });
  r.flops_per_s = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) /
                  r.time.median_s;
  return r;
}

GemmRate measure_ssyrk(const Communicator& group, Index n, Index k, const TimingOptions& timing,
                       Compute& compute) {
  Matrix a(n, k);
  std::mt19937 rng(static_cast<unsigned>(group.rank()) + 1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& v : a.values())
    v = dist(rng);
  const DeviceMatrix da = to_device(compute, a.view());
  DeviceMatrix dc(compute, n, n);
  GemmRate r{n, n, k, {}, 0};
  r.time = time_on_group(group, timing, [&] {
    compute.syrk(Trans::kNo, 1.0f, da.view(), 0.0f, dc.view());
    compute.synchronize();
  });
  r.flops_per_s =
      static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(k) / r.time.median_s;
  return r;
}

const char* to_string(CollectiveKind kind) {
  return detail::name_of(kind);
}

CollectiveRate measure_collective(const Communicator& group, CollectiveKind kind, DType dtype,
                                  std::size_t bytes, const TimingOptions& timing) {
  const std::size_t elem = dtype_size(dtype);
  const auto g = static_cast<std::size_t>(group.size());
  const std::size_t unit = kind == CollectiveKind::kAllGather ? elem * g : elem;
  if (bytes == 0 || bytes % unit != 0) {
    throw Error(
        fmt::format("measure_collective: {} of {} bytes is not a whole number of {} {} "
                    "elements over {} ranks",
                    to_string(kind), bytes, dtype_name(dtype), elem, g));
  }
  // double storage keeps every element type aligned.
  std::vector<double> recv((bytes + sizeof(double) - 1) / sizeof(double), 0.0);
  std::vector<double> send;
  if (kind == CollectiveKind::kAllGather) send.assign(recv.size() / g + 1, 0.0);
  CommImpl& impl = group.impl();
  const auto run = [&] {
    if (kind == CollectiveKind::kAllGather) {
      impl.all_gather(send.data(), recv.data(), bytes / unit, dtype);
    } else {
      impl.all_reduce(recv.data(), bytes / elem, dtype, ReduceOp::kSum);
    }
  };
  CollectiveRate r{kind, dtype, bytes, time_on_group(group, timing, run), 0, 0};
  r.alg_bw = static_cast<double>(bytes) / r.time.median_s;
  const double gd = static_cast<double>(g);
  r.bus_bw = r.alg_bw * (kind == CollectiveKind::kAllGather ? 1.0 : 2.0) * (gd - 1.0) / gd;
  return r;
}

}  // namespace distmuon
