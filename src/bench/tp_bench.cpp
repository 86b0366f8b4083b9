// The tensor-parallel Newton-Schulz benchmark: every (shape, mode) timed and set against its
// bound from the sgemm rate and collective bandwidth measured in the same run.
#include <fmt/format.h>

#include <random>
#include <tuple>

#include <nlohmann/json.hpp>

#include "distmuon/agreement.h"
#include "distmuon/bench.h"
#include "distmuon/error.h"
#include "distmuon/memory_check.h"

namespace distmuon {
namespace {

// The NS update product of the local problem, as the iteration issues it:
// kRows: B (s x s) X (s x l); kCols: X (l x s) B (s x s).
std::tuple<Index, Index, Index> update_gemm(const TpLocalNs& local) {
  const Index s = local.gram_dim(), l = local.long_dim();
  return local.side == GramSide::kRows ? std::make_tuple(s, l, s) : std::make_tuple(l, s, s);
}

// One call of each collective a mode sends, as (kind, dtype, bytes) with the number of calls.
struct Message {
  CollectiveKind kind;
  DType dtype;
  std::size_t bytes;
  std::size_t calls;
};
std::vector<Message> messages(Index m, Index n, int g, int dim, TpMode mode, const NsOptions& ns) {
  const TpTraffic t = tp_traffic(m, n, g, dim, mode, ns);
  std::vector<Message> out;
  if (t.all_gather_calls > 0) {
    out.push_back({CollectiveKind::kAllGather, DType::kF32, t.all_gather_bytes / t.all_gather_calls,
                   t.all_gather_calls});
  }
  if (t.all_reduce_calls > 0) {
    // Gram matrices (fp32; steps of them, or one per Gram-algorithm run) and one double.
    const std::size_t gram = (t.all_reduce_bytes - sizeof(double)) / (t.all_reduce_calls - 1);
    out.push_back({CollectiveKind::kAllReduce, DType::kF32, gram, t.all_reduce_calls - 1});
    out.push_back({CollectiveKind::kAllReduce, DType::kF64, sizeof(double), 1});
  }
  return out;
}

void validate(const Communicator& group, const TpBenchConfig& c) {
  std::string why;
  if (c.partition_dim != 0 && c.partition_dim != 1) {
    why = fmt::format("partition dim {} (valid: 0, 1)", c.partition_dim);
  }
  for (const auto& [m, n] : c.shapes) {
    const Index extent = c.partition_dim == 0 ? m : n;
    if (m < 1 || n < 1 || (why.empty() && extent % group.size() != 0)) {
      why = fmt::format("shape {} does not split into {} equal shards along dim {}",
                        shape_str(m, n), group.size(), c.partition_dim);
    }
  }
  for (TpMode mode : c.modes)
    if (mode == TpMode::kAuto)
      why = "mode auto cannot be benchmarked (it resolves to another mode)";
    else if (mode == TpMode::kOwner)
      why = "mode owner orthogonalises a list of weights: benchmark it with --model";
  if (c.shapes.empty() || c.modes.empty()) why = "no shapes or no modes to benchmark";
  try {
    c.ns.validate();
  } catch (const Error& e) {
    why = e.what();
  }
  // Per shape, one at a time: the full random matrix, the shard and its work copy, and NS's
  // workspace of the full matrix (duplicated mode gathers it).
  for (const auto& [m, n] : c.shapes) {
    if (!why.empty()) break;
    const double full = static_cast<double>(m) * static_cast<double>(n);
    try {
      check_memory_fits(
          sizeof(float) * (2 * full + 2 * full / group.size()) + ns_workspace_bytes(m, n),
          fmt::format("bench of a {} matrix (per rank)", shape_str(m, n)));
    } catch (const Error& e) {
      why = e.what();
    }
  }
  agree_or_throw(group, why.empty(), "tp bench configuration", why);
}

}  // namespace

TpBenchReport run_tp_bench(const Communicator& group, const TpBenchConfig& config,
                           Compute& compute) {
  validate(group, config);
  const int g = group.size();
  const int dim = config.partition_dim;
  TpBenchReport report;
  report.group_size = g;
  report.blas_threads = blas_threads();
  report.coefficients = config.ns.coefficients.name;
  report.steps = config.ns.steps;
  report.use_syrk = config.ns.use_syrk;
  report.algorithm = config.ns.algorithm;
  report.timing = config.timing;
  report.rate_timing = config.rate_timing;

  for (std::size_t si = 0; si < config.shapes.size(); ++si) {
    const auto [m, n] = config.shapes[si];
    Matrix full(m, n);
    std::mt19937_64 rng(config.seed + si);
    std::normal_distribution<float> dist;
    for (float& v : full.values())
      v = dist(rng);
    // The shard and its working copy in the backend's memory.
    const DeviceMatrix shard =
        to_device(compute, shard_of(full.view(), dim, g, group.rank()).view());
    DeviceMatrix work(compute, shard.rows(), shard.cols());
    for (TpMode mode : config.modes) {
      TpBenchResult r;
      r.m = m;
      r.n = n;
      r.partition_dim = dim;
      r.mode = mode;
      r.local = tp_local_ns(m, n, g, dim, mode, config.ns.side);
      r.flops_per_rank = tp_flops(m, n, g, dim, mode, config.ns);
      r.traffic = tp_traffic(m, n, g, dim, mode, config.ns);

      const auto [gm, gn, gk] = update_gemm(r.local);
      r.sgemm = measure_sgemm(group, gm, gn, gk, config.rate_timing, compute);
      r.compute_bound_s = r.flops_per_rank / r.sgemm.flops_per_s;
      for (const Message& msg : messages(m, n, g, dim, mode, config.ns)) {
        r.collectives.push_back(
            measure_collective(group, msg.kind, msg.dtype, msg.bytes, config.rate_timing));
        r.comm_bound_s += static_cast<double>(msg.calls * msg.bytes) / r.collectives.back().alg_bw;
      }
      r.bound_s = r.compute_bound_s + r.comm_bound_s;

      r.time = time_on_group(
          group, config.timing,
          [&] {
            newton_schulz_tp(work.view(), dim, group, mode, config.ns, compute);
            compute.synchronize();  // the clock is read after the backend's work is done
          },
          [&] {
            compute.copy(shard.view(), work.view());
            compute.synchronize();
          });
      r.ratio = r.time.median_s / r.bound_s;
      report.results.push_back(std::move(r));
    }
  }
  return report;
}

nlohmann::json to_json(const TpBenchReport& report) {
  using nlohmann::json;
  json j = {{"group_size", report.group_size},
            {"blas_threads", report.blas_threads},
            {"coefficients", report.coefficients},
            {"steps", report.steps},
            {"syrk", report.use_syrk},
            {"ns_algorithm", to_string(report.algorithm)},
            {"warmup", report.timing.warmup},
            {"reps", report.timing.reps},
            {"rate_reps", report.rate_timing.reps}};
  j["results"] = json::array();
  for (const TpBenchResult& r : report.results) {
    json samples = json::array();
    for (double t : r.time.samples_s)
      samples.push_back(t * 1e3);
    json collectives = json::array();
    for (const CollectiveRate& c : r.collectives) {
      collectives.push_back({{"op", to_string(c.kind)},
                             {"dtype", dtype_name(c.dtype)},
                             {"bytes", c.bytes},
                             {"median_ms", c.time.median_s * 1e3},
                             {"alg_bw_gbps", c.alg_bw * 1e-9},
                             {"bus_bw_gbps", c.bus_bw * 1e-9}});
    }
    j["results"].push_back({{"m", r.m},
                            {"n", r.n},
                            {"partition_dim", r.partition_dim},
                            {"mode", to_string(r.mode)},
                            {"median_ms", r.time.median_s * 1e3},
                            {"min_ms", r.time.min_s * 1e3},
                            {"max_ms", r.time.max_s * 1e3},
                            {"samples_ms", samples},
                            {"local_rows", r.local.rows},
                            {"local_cols", r.local.cols},
                            {"gram_dim", r.local.gram_dim()},
                            {"gflop_per_rank", r.flops_per_rank * 1e-9},
                            {"all_gather_bytes", r.traffic.all_gather_bytes},
                            {"all_reduce_bytes", r.traffic.all_reduce_bytes},
                            {"sgemm",
                             {{"m", r.sgemm.m},
                              {"n", r.sgemm.n},
                              {"k", r.sgemm.k},
                              {"median_ms", r.sgemm.time.median_s * 1e3},
                              {"gflops_per_rank", r.sgemm.flops_per_s * 1e-9}}},
                            {"collectives", collectives},
                            {"compute_bound_ms", r.compute_bound_s * 1e3},
                            {"comm_bound_ms", r.comm_bound_s * 1e3},
                            {"bound_ms", r.bound_s * 1e3},
                            {"ratio", r.ratio}});
  }
  return j;
}

std::string format_report(const TpBenchReport& report) {
  std::string out = fmt::format(
      "distmuon bench: {} rank(s), {} BLAS thread(s) per rank, {} x {} steps, {}, {} NS; {} timed "
      "run(s) after {} warm-up; a run's time is the slowest rank's\n",
      report.group_size, report.blas_threads, report.coefficients, report.steps,
      report.use_syrk ? "syrk" : "gemm", to_string(report.algorithm), report.timing.reps,
      report.timing.warmup);
  out +=
      "bound = GFLOP/rank at the sgemm rate + bytes at the collective bandwidth, both measured "
      "(all ranks at once) right before each case\n\n";
  out += fmt::format(
      "  {:<10} {:>3} {:<12} {:>9} {:>8} {:>8} {:>9} {:>8} {:>7} {:>8} {:>8} {:>8} {:>6}\n",
      "shape", "dim", "mode", "median_ms", "min_ms", "max_ms", "GFLOP/rk", "sgemm_GF", "comm_MB",
      "cmp_ms", "comm_ms", "bound_ms", "ratio");
  for (const TpBenchResult& r : report.results) {
    const double mb =
        static_cast<double>(r.traffic.all_gather_bytes + r.traffic.all_reduce_bytes) / 1e6;
    out += fmt::format(
        "  {:<10} {:>3} {:<12} {:>9.1f} {:>8.1f} {:>8.1f} {:>9.2f} {:>8.1f} {:>7.1f} {:>8.1f} "
        "{:>8.1f} {:>8.1f} {:>6.2f}\n",
        shape_str(r.m, r.n), r.partition_dim, to_string(r.mode), r.time.median_s * 1e3,
        r.time.min_s * 1e3, r.time.max_s * 1e3, r.flops_per_rank * 1e-9, r.sgemm.flops_per_s * 1e-9,
        mb, r.compute_bound_s * 1e3, r.comm_bound_s * 1e3, r.bound_s * 1e3, r.ratio);
  }
  out +=
      "\nrates per case: sgemm m x n x k (the NS update product) in GFLOP/s per rank; "
      "collectives: bytes per call\n  as counted (all-gather: gathered buffer), algbw = bytes / "
      "time, busbw = nccl-tests bus bandwidth, GB/s\n";
  for (const TpBenchResult& r : report.results) {
    out +=
        fmt::format("  {:<10} {:<12} sgemm {}x{}x{} {:.1f}", shape_str(r.m, r.n), to_string(r.mode),
                    r.sgemm.m, r.sgemm.n, r.sgemm.k, r.sgemm.flops_per_s * 1e-9);
    for (const CollectiveRate& c : r.collectives) {
      out += fmt::format("; {} {} {} B {:.3f} ms algbw {:.2f} busbw {:.2f}", to_string(c.kind),
                         dtype_name(c.dtype), c.bytes, c.time.median_s * 1e3, c.alg_bw * 1e-9,
                         c.bus_bw * 1e-9);
    }
    out += "\n";
  }
  return out;
}

}  // namespace distmuon
