// `distmuon bench --model`: the model benchmark's options and run. See docs/bench.md.
#include <fmt/format.h>

#include <iostream>

#include <nlohmann/json.hpp>

#include "bench_model_options.h"
#include "blas_fix.h"
#include "cli_checks.h"
#include "command_line_errors.h"
#include "distmuon/agreement.h"
#include "distmuon/blas_info.h"
#include "distmuon/error.h"
#include "distmuon/file_io.h"
#include "distmuon/model_bench.h"
#include "distmuon/plots.h"
#include "distmuon/progress.h"
#include "distmuon/train_config.h"
#include "planning_commands.h"

namespace distmuon::cli {

void BenchModelOptions::add_to(CLI::App& cmd) {
  auto* m = cmd.add_option("--model", model,
                           "Benchmark every Muon shape of a model: train-default (the training "
                           "run's model), a preset name (distmuon plan --list-models) or a preset "
                           "JSON file")
                ->check(non_empty_path());
  // Each option below applies to --model only: given without it, it is refused (it used to be
  // ignored silently).
  cmd.add_option("--profile", profile,
                 "With --model: auto's hardware profile (a name, a JSON file such as distmuon "
                 "calibrate writes, or none)")
      ->check(non_empty_path())
      ->capture_default_str()
      ->needs(m);
  model_cost_alias = add_cost_model_option(cmd, cost_model, "With --model: auto's cost model");
  model_cost_alias->needs(m);
  cmd.get_option("--cost-model")->needs(m);
  cmd.add_option("--config", config,
                 "With --model train-default: a training config JSON whose model overrides the "
                 "default one")
      ->check(non_empty_path())
      ->needs(m);
  cmd.add_option("--max-elements", max_elements,
                 "With --model: refuse shapes whose matrix or distributed Gram matrix holds more "
                 "elements")
      ->check(at_least<Index>(1))
      ->capture_default_str()
      ->needs(m);
  cmd.add_option("--plan", plan,
                 "With --model: how auto plans, estimate (the cost model) or measure (time the "
                 "model's leading candidates first, as the optimizer does with plan measure)")
      ->check(CLI::IsMember(names_of<PlanMode>()))
      ->capture_default_str()
      ->needs(m);
  cmd.add_option("--wisdom", wisdom,
                 "With --plan measure: read and write measured times in this JSON file")
      ->check(non_empty_path())
      ->needs(m);
  cmd.add_flag("--replicated", replicated,
               "With --model: also time the weights replicated over the ranks (data parallel, "
               "unsharded): every rank's Newton-Schulz against one home rank per weight")
      ->needs(m);
  cmd.add_option("--pipeline", pipeline,
                 "With --model: chunks of the pipelined owner and home schedules (owner's timed "
                 "beside its serial schedule; the homes' with --replicated); 0: the cost "
                 "model's cheapest count for each, as the optimizer chooses")
      ->check(at_least<int>(0))
      ->capture_default_str()
      ->needs(m);
  cmd.add_option("--link-latency-us", link_latency_us,
                 "With --model: emulate a link of this latency under owner mode's exchanges and "
                 "(with --replicated) the replicas' exchange")
      ->check(at_least<double>(0))
      ->needs(m);
  cmd.add_option("--link-gbps", link_gbps,
                 "With --model: emulate a link of this bandwidth (GB/s) under owner mode's "
                 "exchanges and (with --replicated) the replicas' exchange")
      ->check(at_least<double>(0))
      ->needs(m);
  cmd.add_option("--plan-reps", plan_reps,
                 "With --plan measure: timed rounds of the planner's candidates (after one "
                 "warm-up)")
      ->check(at_least<int>(1))
      ->capture_default_str()
      ->needs(m);
  cmd.add_option("--plot", plot, "With --model: draw per-shape bars per mode into this PNG")
      ->check(non_empty_path())
      ->needs(m);
}

void run_bench_model(const BenchModelOptions& model, const BenchCommonOptions& common,
                     const CLI::App& cmd, Context& ctx) {
  log_to_stderr();
  warn_deprecated_cost_model(model.model_cost_alias, ctx.world);
  // Reads --config on every rank (a file one rank may fail to read): agreed on.
  const ModelBenchConfig config = check_on_every_rank(ctx.world, "bench --model", [&] {
    if (cmd.count("--shape") > 0 || cmd.count("--partition-dim") > 0) {
      throw Error(
          "bench: --model takes its shapes from the model and shards rows as training does; "
          "drop --shape / --partition-dim");
    }
    ModelBenchConfig c;
    c.model = model.model;
    if (!model.config.empty()) {
      if (model.model != kTrainDefaultModel)
        throw Error("bench: --config applies to --model train-default only");
      c.weights = charlm_muon_weights(load_train_config(model.config).model);
      c.model = fmt::format("{} ({})", kTrainDefaultModel, model.config);
    } else {
      c.weights = model_weights(model.model);
    }
    if (cmd.count("--modes") > 0) {  // else duplicated, distributed, blockwise
      c.modes.clear();
      for (const auto& m : common.modes)
        c.modes.push_back(parse_tp_mode(m));
    }
    // The algorithms measured and offered to auto: standard (the optimizer's default), gram,
    // or auto (both).
    c.algorithm = parse_ns_algorithm(common.ns.algorithm);
    NsCliOptions ns = common.ns;
    ns.algorithm = "standard";
    c.ns = ns.resolve();
    c.timing = {common.warmup, common.reps};
    c.profile = model.profile;
    c.cost_model = model.cost_model;
    c.plan = parse_plan_mode(model.plan);
    c.measure.wisdom = model.wisdom;
    c.measure.reps = model.plan_reps;
    if (!model.wisdom.empty() && c.plan != PlanMode::kMeasure)
      throw Error("bench: --wisdom applies to --plan measure");
    c.max_elements = model.max_elements;
    c.seed = common.seed;
    c.replicated = model.replicated;
    c.pipeline = model.pipeline;
    c.link = {model.link_latency_us * 1e-6, model.link_gbps * 1e9};
    return c;
  });
  // The outputs are checked before anything is timed (the wisdom is written after the plan's
  // timing, the plot at the end).
  run_on_root(ctx.world, "bench --model", [&] {
    if (!model.plot.empty()) check_output_file(model.plot, "--plot");
    if (!model.wisdom.empty()) check_output_file(model.wisdom, "--wisdom");
  });
  Compute& compute = common.device.resolve(ctx.world);
  set_blas_threads(common.threads);
  ProgressLine progress(stdout, ctx.world.rank() == 0 && !common.json);
  ModelBenchConfig run = config;
  run.ns.precision = common.ns.precision_on(compute);
  run.progress = [&](const std::string& what) { progress.update(what); };
  const ModelBenchReport report = run_model_bench(ctx.world, run, compute);
  progress.clear();
  run_on_root(ctx.world, "bench --plot", [&] {
    if (!model.plot.empty()) render_model_bench_plot(report, model.plot);
  });
  if (ctx.world.rank() != 0) return;
  if (common.json) {
    nlohmann::json j = to_json(report);
    j["device"] = common.device.name;
    j["blas"] = blas_json();
    std::cout << j.dump(2) << std::endl;
  } else {
    std::cout << "device: " << common.device.name << "\nBLAS: " << blas_summary() << "\n"
              << format_report(report);
    if (!model.plot.empty()) std::cout << "plot written to " << model.plot << "\n";
    std::cout << std::flush;
  }
}

}  // namespace distmuon::cli
