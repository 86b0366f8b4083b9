// The model benchmark's JSON and tables (the plot: plot/model_bench_plot.cpp).
#include <fmt/format.h>

#include <cmath>

#include "distmuon/model_bench.h"

namespace distmuon {
namespace {

using nlohmann::json;

double ratio(double a, double b) {
  return b > 0 ? a / b : 0.0;
}

json cost_json(const ModeCost& c, bool seconds) {
  json j = {{"gflop", c.flops * 1e-9},
            {"payload_bytes", c.payload_bytes},
            {"elementwise_elements", c.elementwise_elements}};
  if (seconds) {
    j["predicted_ms"] = c.seconds() * 1e3;
    j["compute_ms"] = c.compute_s * 1e3;
    j["elementwise_ms"] = c.elementwise_s * 1e3;
    j["comm_ms"] = c.comm_s() * 1e3;
  }
  return j;
}

}  // namespace

json to_json(const ModelBenchReport& r) {
  json modes = json::array();
  for (TpMode m : r.modes)
    modes.push_back(to_string(m));
  json j = {{"model", r.model},
            {"group_size", r.group_size},
            {"partition_dim", 0},
            {"blas_threads", r.blas_threads},
            {"crosses_domain", r.crosses_domain},
            {"profile", r.profile},
            {"cost_model", r.cost_model},
            {"coefficients", r.coefficients},
            {"steps", r.steps},
            {"syrk", r.use_syrk},
            {"warmup", r.timing.warmup},
            {"reps", r.timing.reps},
            {"modes", modes}};
  j["shapes"] = json::array();
  for (const ModelBenchShape& s : r.shapes) {
    json measured = json::object();
    for (const ModelBenchMode& m : s.modes) {
      json samples = json::array();
      for (double t : m.time.samples_s)
        samples.push_back(t * 1e3);
      measured[to_string(m.mode)] = {{"median_ms", m.time.median_s * 1e3},
                                     {"min_ms", m.time.min_s * 1e3},
                                     {"max_ms", m.time.max_s * 1e3},
                                     {"samples_ms", samples}};
    }
    j["shapes"].push_back({{"m", s.m},
                           {"n", s.n},
                           {"count", s.count},
                           {"names", s.names},
                           {"shard_rows", s.shard_rows},
                           {"pad", s.pad},
                           {"measured", measured},
                           {"model",
                            {{"duplicated", cost_json(s.estimate.duplicated, r.has_profile)},
                             {"distributed", cost_json(s.estimate.distributed, r.has_profile)}}},
                           {"auto", to_string(s.auto_mode)},
                           {"fastest", to_string(s.fastest)},
                           {"auto_ms", s.median_s(s.auto_mode) * 1e3},
                           {"fastest_ms", s.median_s(s.fastest) * 1e3},
                           {"regret", s.regret}});
  }
  const ModelBenchTotals& t = r.totals;
  j["totals"] = {{"duplicated_ms", t.duplicated_s * 1e3},
                 {"distributed_ms", t.distributed_s * 1e3},
                 {"auto_ms", t.auto_s * 1e3},
                 {"oracle_ms", t.oracle_s * 1e3},
                 {"auto_over_oracle", ratio(t.auto_s, t.oracle_s) - 1},
                 {"auto_speedup_vs_duplicated", ratio(t.duplicated_s, t.auto_s)},
                 {"auto_speedup_vs_distributed", ratio(t.distributed_s, t.auto_s)}};
  if (r.has_profile) {
    j["totals"]["predicted"] = {{"duplicated_ms", t.predicted_duplicated_s * 1e3},
                                {"distributed_ms", t.predicted_distributed_s * 1e3},
                                {"auto_ms", t.predicted_auto_s * 1e3}};
  }
  return j;
}

std::string format_report(const ModelBenchReport& r) {
  std::string out = fmt::format(
      "distmuon bench --model {}: {} rank(s), weights row-sharded over G = {} as in training, {} "
      "BLAS thread(s) per rank, {} x {} steps, {}; {} timed round(s) after {} warm-up, modes "
      "interleaved; a run's time is the slowest rank's\n"
      "auto: profile {}, {} model, {}\n\n",
      r.model, r.group_size, r.group_size, r.blas_threads, r.coefficients, r.steps,
      r.use_syrk ? "syrk" : "gemm", r.timing.reps, r.timing.warmup, r.profile, r.cost_model,
      r.crosses_domain ? "group crosses domains" : "group inside one domain");
  out += fmt::format("  {:<18} {:>5} {:>10}", "weight", "count", "shard");
  for (TpMode m : r.modes)
    out += fmt::format(" {:>15}", fmt::format("{}_ms", to_string(m)));
  if (r.has_profile) out += fmt::format(" {:>10} {:>11}", "pred_dup", "pred_dist");
  out += fmt::format(" {:<12} {:<12} {:>7}\n", " auto", " fastest", "regret");
  for (const ModelBenchShape& s : r.shapes) {
    out += fmt::format("  {:<18} {:>5} {:>10}",
                       fmt::format("{} {}", fmt::join(s.names, ","), shape_str(s.m, s.n)), s.count,
                       shape_str(s.shard_rows, s.n));
    for (const ModelBenchMode& m : s.modes)
      out += fmt::format(" {:>15.2f}", m.time.median_s * 1e3);
    if (r.has_profile) {
      out += fmt::format(" {:>10.4g} {:>11.4g}", s.estimate.duplicated.seconds() * 1e3,
                         s.estimate.distributed.seconds() * 1e3);
    }
    out += fmt::format(" {:<12} {:<12} {:>6.1f}%\n", " " + std::string(to_string(s.auto_mode)),
                       " " + std::string(to_string(s.fastest)), s.regret * 100);
  }
  const ModelBenchTotals& t = r.totals;
  out += "\ntotals per optimizer step (count x median" +
         std::string(r.has_profile ? "; predicted by the model" : "") + "):\n";
  const auto line = [&](const char* name, double measured, double predicted, std::string note) {
    out += fmt::format("  {:<20} {:>10.2f} ms", name, measured * 1e3);
    if (r.has_profile && predicted > 0)
      out += fmt::format("   (predicted {:.4g} ms)", predicted * 1e3);
    out += note.empty() ? "\n" : "   " + note + "\n";
  };
  line("always duplicated", t.duplicated_s, t.predicted_duplicated_s,
       fmt::format("auto is {:.2f}x faster", ratio(t.duplicated_s, t.auto_s)));
  line("always distributed", t.distributed_s, t.predicted_distributed_s,
       fmt::format("auto is {:.2f}x faster", ratio(t.distributed_s, t.auto_s)));
  line("auto", t.auto_s, t.predicted_auto_s,
       fmt::format("{:+.1f}% over the oracle", (ratio(t.auto_s, t.oracle_s) - 1) * 100));
  line("oracle (fastest)", t.oracle_s, 0, "");
  return out;
}

}  // namespace distmuon
