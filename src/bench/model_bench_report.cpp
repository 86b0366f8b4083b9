// The model benchmark's JSON and tables (the plot: plot/model_bench_plot.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "distmuon/model_bench.h"

namespace distmuon {
namespace {

using nlohmann::json;

double ratio(double a, double b) {
  return b > 0 ? a / b : 0.0;
}

// "   (predicted 101.8 ms, -12.3%)": a prediction beside its measurement (nothing when there is
// none).
std::string predicted(double predicted_s, double measured_s) {
  if (!(predicted_s > 0)) return "";
  return fmt::format("   (predicted {:.4g} ms, {:+.1f}%)", predicted_s * 1e3,
                     (ratio(predicted_s, measured_s) - 1) * 100);
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

json timing_json(const TimingSummary& t) {
  json samples = json::array();
  for (double v : t.samples_s)
    samples.push_back(v * 1e3);
  return {{"median_ms", t.median_s * 1e3},
          {"min_ms", t.min_s * 1e3},
          {"max_ms", t.max_s * 1e3},
          {"samples_ms", samples}};
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
            {"plan", to_string(r.plan)},
            {"coefficients", r.coefficients},
            {"steps", r.steps},
            {"syrk", r.use_syrk},
            {"warmup", r.timing.warmup},
            {"reps", r.timing.reps},
            {"modes", modes}};
  j["shapes"] = json::array();
  for (const ModelBenchShape& s : r.shapes) {
    json measured = json::object();
    for (const ModelBenchMode& m : s.modes)
      measured[to_string(AutoChoice{m.mode, m.algorithm})] = timing_json(m.time);
    json model = json::object();
    for (TpMode mode : {TpMode::kDuplicated, TpMode::kDistributed, TpMode::kOwner}) {
      for (NsAlgorithm a : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
        if (s.estimate.prices_gram || (a == NsAlgorithm::kStandard && mode != TpMode::kOwner))
          model[to_string(AutoChoice{mode, a})] = cost_json(s.estimate.of(mode, a), r.has_profile);
      }
    }
    j["shapes"].push_back({{"m", s.m},
                           {"n", s.n},
                           {"count", s.count},
                           {"batch", s.batch},
                           {"names", s.names},
                           {"shard_rows", s.shard_rows},
                           {"pad", s.pad},
                           {"measured", measured},
                           {"model", model},
                           {"auto", to_string(s.auto_choice)},
                           {"fastest", to_string(s.fastest)},
                           {"fastest_ms", s.median_s(s.fastest.mode, s.fastest.algorithm) * 1e3},
                           {"regret", s.regret}});
    if (r.plan == PlanMode::kMeasure) {
      json planned = json::object();
      for (const MeasuredCandidate& c : s.planned)
        planned[to_string(c.choice)] = c.seconds * 1e3;
      j["shapes"].back()["planned_ms"] = planned;
    }
    if (!r.auto_owner)
      j["shapes"].back()["auto_ms"] = s.median_s(s.auto_choice.mode, s.auto_choice.algorithm) * 1e3;
  }
  j["owner"] = json::array();
  for (const ModelBenchOwner& o : r.owner) {
    json algorithms = json::array();
    for (NsAlgorithm a : o.algorithms)
      algorithms.push_back(to_string(a));
    j["owner"].push_back({{"label", o.label},
                          {"algorithms", algorithms},
                          {"measured", timing_json(o.time)},
                          {"predicted_ms", o.predicted_s * 1e3},
                          {"serial", o.serial},
                          {"chunks", o.chunks}});
    if (o.planned_s > 0) j["owner"].back()["planned_ms"] = o.planned_s * 1e3;
  }
  j["auto_owner"] = r.auto_owner;
  if (r.replicated) {
    const ModelBenchReplicated& d = *r.replicated;
    j["replicated"] = {{"replicas", d.replicas},
                       {"every_rank", timing_json(d.every_rank)},
                       {"home", timing_json(d.home)},
                       {"home_pipelined", timing_json(d.home_pipelined)},
                       {"home_bf16", timing_json(d.home_bf16)},
                       {"pipeline", d.pipeline},
                       {"link_latency_us", d.link.latency_s * 1e6},
                       {"link_gbps", d.link.bytes_per_s / 1e9},
                       {"homes", d.homes},
                       {"auto", d.auto_home ? "home" : "every_rank"},
                       {"regret", d.regret}};
    if (r.has_profile) {
      j["replicated"]["predicted_every_rank_ms"] = d.predicted_every_rank_s * 1e3;
      j["replicated"]["predicted_home_ms"] = d.predicted_home_s * 1e3;
      j["replicated"]["predicted_home_pipelined_ms"] = d.predicted_home_pipelined_s * 1e3;
      j["replicated"]["predicted_home_bf16_ms"] = d.predicted_home_bf16_s * 1e3;
    }
  }
  const ModelBenchTotals& t = r.totals;
  j["totals"] = {{"duplicated_ms", t.duplicated_s * 1e3},
                 {"distributed_ms", t.distributed_s * 1e3},
                 {"auto_ms", t.auto_s * 1e3},
                 {"oracle_ms", t.oracle_s * 1e3},
                 {"per_weight_oracle_ms", t.per_weight_oracle_s * 1e3},
                 {"auto_speedup_vs_best_fixed", ratio(t.best_fixed_s(), t.auto_s)},
                 {"auto_over_oracle", ratio(t.auto_s, t.oracle_s) - 1},
                 {"auto_speedup_vs_duplicated", ratio(t.duplicated_s, t.auto_s)},
                 {"auto_speedup_vs_distributed", ratio(t.distributed_s, t.auto_s)}};
  if (r.plan == PlanMode::kMeasure) j["plan_timed_runs"] = r.plan_timed_runs;
  if (r.has_profile || r.plan == PlanMode::kMeasure) {
    j["totals"]["predicted"] = {{"duplicated_ms", t.predicted_duplicated_s * 1e3},
                                {"distributed_ms", t.predicted_distributed_s * 1e3},
                                {"auto_ms", t.predicted_auto_s * 1e3}};
  }
  return j;
}

std::string format_report(const ModelBenchReport& r) {
  std::string out = fmt::format(
      "distmuon bench --model {}: {} rank(s), weights row-sharded over G = {} as in training, {} "
      "BLAS thread(s) per rank, {} x {} steps, {}; {} timed round(s) after {} warm-up, candidates "
      "interleaved; a run's time is the slowest rank's\n"
      "auto: profile {}, {} model, plan {}, {}\n\n",
      r.model, r.group_size, r.group_size, r.blas_threads, r.coefficients, r.steps,
      r.use_syrk ? "syrk" : "gemm", r.timing.reps, r.timing.warmup, r.profile, r.cost_model,
      r.plan == PlanMode::kMeasure
          ? fmt::format("measure ({} run(s) timed before the benchmark)", r.plan_timed_runs)
          : std::string("estimate"),
      r.crosses_domain ? "group crosses domains" : "group inside one domain");
  out += "median ms per NS run of one weight (xB: a batched weight, its B matrices together)";
  out += r.has_profile ? " (the model's prediction in brackets)\n" : "\n";
  const auto label = [](const ModelBenchShape& s) {
    return fmt::format("{}{} {}", s.batch > 1 ? fmt::format("x{} ", s.batch) : "",
                       fmt::join(s.names, ","), shape_str(s.m, s.n));
  };
  std::size_t width = 18;
  for (const ModelBenchShape& s : r.shapes)
    width = std::max(width, label(s).size());
  out += fmt::format("  {:<{}} {:>5} {:>10}", "weight", width, "count", "shard");
  const std::size_t k = r.shapes.empty() ? 0 : r.shapes.front().modes.size();
  for (std::size_t c = 0; c < k; ++c) {
    const ModelBenchMode& m = r.shapes.front().modes[c];
    out += fmt::format(" {:>22}", to_string(AutoChoice{m.mode, m.algorithm}));
  }
  out += fmt::format("  {:<17} {:<17} {:>7}\n", "auto", "fastest", "regret");
  for (const ModelBenchShape& s : r.shapes) {
    out += fmt::format("  {:<{}} {:>5} {:>10}", label(s), width, s.parameters(),
                       shape_str(s.shard_rows, s.n));
    for (const ModelBenchMode& m : s.modes) {
      const bool priced = r.has_profile && m.mode != TpMode::kBlockwise &&
                          (s.estimate.prices_gram || m.algorithm == NsAlgorithm::kStandard);
      out += priced ? fmt::format(" {:>22}",
                                  fmt::format("{:.2f} ({:.3g})", m.time.median_s * 1e3,
                                              s.estimate.of(m.mode, m.algorithm).seconds() * 1e3))
                    : fmt::format(" {:>22.2f}", m.time.median_s * 1e3);
    }
    out += fmt::format("  {:<17} {:<17} {:>6.1f}%\n", to_string(s.auto_choice),
                       to_string(s.fastest), s.regret * 100);
  }
  if (!r.owner.empty()) {
    out += "\nowner mode over every weight at once (LPT owners, bucketed all-to-alls):\n";
    for (const ModelBenchOwner& o : r.owner) {
      out += fmt::format("  {:<28} {:>10.2f} ms", o.label, o.time.median_s * 1e3);
      if (!o.serial) out += fmt::format("   {} chunk{}", o.chunks, o.chunks == 1 ? "" : "s");
      if (r.has_profile) out += predicted(o.predicted_s, o.time.median_s);
      if (o.serial) {
        out += fmt::format("   {} pipelined: {:.2f}x of this", r.owner.front().label,
                           ratio(r.owner.front().time.median_s, o.time.median_s));
      }
      out += "\n";
    }
  }
  if (r.plan == PlanMode::kMeasure) {
    out += "\nplan measure: the planner's times (its predictions) against this benchmark's:\n";
    const auto row = [&](const std::string& what, double planned, double measured) {
      out += fmt::format("  {:<40} planned {:>9.2f} ms   measured {:>9.2f} ms   {:+.1f}%\n", what,
                         planned * 1e3, measured * 1e3, (ratio(planned, measured) - 1) * 100);
    };
    for (const ModelBenchShape& s : r.shapes) {
      for (const MeasuredCandidate& c : s.planned) {
        row(fmt::format("{} {} {}", fmt::join(s.names, ","), shape_str(s.m, s.n),
                        to_string(c.choice)),
            c.seconds, s.median_s(c.choice.mode, c.choice.algorithm));
      }
    }
    for (const ModelBenchOwner& o : r.owner)
      if (o.planned_s > 0) row(o.label + " (every weight)", o.planned_s, o.time.median_s);
  }
  const ModelBenchTotals& t = r.totals;
  out += "\ntotals per optimizer step (count x median" +
         std::string(r.has_profile ? "; predicted by the model" : "") +
         std::string(r.plan == PlanMode::kMeasure ? "; auto's predicted by the planner" : "") +
         "):\n";
  const auto line = [&](const char* name, double measured, double predicted_s, std::string note) {
    out += fmt::format("  {:<24} {:>10.2f} ms", name, measured * 1e3);
    out += predicted(predicted_s, measured);
    out += note.empty() ? "\n" : "   " + note + "\n";
  };
  line("always duplicated", t.duplicated_s, t.predicted_duplicated_s,
       fmt::format("auto is {:.2f}x faster", ratio(t.duplicated_s, t.auto_s)));
  line("always distributed", t.distributed_s, t.predicted_distributed_s,
       fmt::format("auto is {:.2f}x faster", ratio(t.distributed_s, t.auto_s)));
  line(r.auto_owner ? "auto (owner)" : "auto (per weight)", t.auto_s, t.predicted_auto_s,
       fmt::format("{:+.1f}% over the oracle; {:.2f}x faster than the best of duplicated and "
                   "distributed",
                   (ratio(t.auto_s, t.oracle_s) - 1) * 100, ratio(t.best_fixed_s(), t.auto_s)));
  line("oracle per weight", t.per_weight_oracle_s, 0, "");
  line("oracle (all candidates)", t.oracle_s, 0, "");
  if (r.replicated) {
    const ModelBenchReplicated& d = *r.replicated;
    out += fmt::format(
        "\nreplicated over {} ranks (data parallel, unsharded; same rounds; auto: {}, {:+.1f}% "
        "over the faster mode, every rank or home pipelined):\n",
        d.replicas, d.auto_home ? "home, pipelined" : "every rank", d.regret * 100);
    line("every rank's NS", d.every_rank.median_s, d.predicted_every_rank_s, "");
    if (d.link.latency_s > 0 || d.link.bytes_per_s > 0) {
      out +=
          fmt::format("  (the replicas' exchange over an emulated link: {:.4g} us, {:.4g} GB/s)\n",
                      d.link.latency_s * 1e6, d.link.bytes_per_s / 1e9);
    }
    line("one home per weight", d.home.median_s, d.predicted_home_s,
         fmt::format("{:.2f}x of every rank's", ratio(d.home.median_s, d.every_rank.median_s)));
    line("  pipelined", d.home_pipelined.median_s, d.predicted_home_pipelined_s,
         fmt::format("{} chunks: {:.2f}x of the serial schedule", d.pipeline,
                     ratio(d.home_pipelined.median_s, d.home.median_s)));
    line("  pipelined, bf16 wire", d.home_bf16.median_s, d.predicted_home_bf16_s,
         fmt::format("{:.2f}x of the fp32 wire's",
                     ratio(d.home_bf16.median_s, d.home_pipelined.median_s)));
  }
  return out;
}

}  // namespace distmuon
