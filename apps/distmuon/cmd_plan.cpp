// `distmuon plan`: the cost model over a model's Muon weights (or given shapes): the mode per
// distinct shape and the totals per optimizer step. See docs/cost-model.md.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "cli_checks.h"
#include "distmuon/agreement.h"
#include "distmuon/error.h"
#include "distmuon/file_io.h"
#include "distmuon/plan.h"
#include "distmuon/plots.h"
#include "distmuon/train_config.h"
#include "planning_commands.h"

namespace distmuon::cli {
namespace {

struct PlanCliOptions {
  std::vector<std::string> shapes;
  std::string model, profile = "none", cost_model = "refined", map, algorithm = "standard";
  int group_size = 8, partition_dim = 0, steps = 5, elem_size = 2, replicas = 1;
  bool syrk = true, crosses = false, json = false, list_models = false;
};

void run_plan(const PlanCliOptions& o);

}  // namespace

void add_plan_command(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand(
      "plan",
      "Choose per weight (duplicated or distributed, standard or Gram NS) and owner mode "
      "for the model, from the cost model");
  auto o = std::make_shared<PlanCliOptions>();
  cmd->add_option("--shape", o->shapes, "Weight shape MxN (repeatable)");
  cmd->add_option("--model", o->model,
                  "Model preset name or JSON file (see --list-models), or train-default");
  cmd->add_flag("--list-models", o->list_models, "List the built-in model presets");
  cmd->add_option("--group-size,-G", o->group_size, "Ranks each weight is sharded over")
      ->check(in_range<int>(1, kMaxGroupSize))
      ->capture_default_str();
  cmd->add_option("--partition-dim", o->partition_dim,
                  "Dimension the weights are split along (0 rows, 1 columns)")
      ->check(CLI::IsMember({0, 1}))
      ->capture_default_str();
  cmd->add_option("--steps", o->steps, "Newton-Schulz steps")
      ->check(in_range<int>(1, kMaxNsStepsOption))
      ->capture_default_str();
  cmd->add_flag("--syrk,!--no-syrk", o->syrk, "Symmetric products with syrk (default) or gemm");
  cmd->add_option("--ns-algorithm", o->algorithm,
                  "Newton-Schulz algorithms auto may pick: standard (the optimizer's default), "
                  "auto (standard or gram, refined model only), gram")
      ->check(CLI::IsMember(names_of<NsAlgorithm>()))
      ->capture_default_str();
  cmd->add_option("--elem-size", o->elem_size, "Bytes per element NS runs in (2 bf16, 4 fp32)")
      ->check(CLI::IsMember({2, 4}))
      ->capture_default_str();
  cmd->add_option("--profile", o->profile,
                  "Hardware profile: a name (distmuon profiles), a JSON file, or none")
      ->check(non_empty_path())
      ->capture_default_str();
  cmd->add_flag("--crosses-domain", o->crosses, "The group spans NVLink domains");
  cmd->add_option("--replicas", o->replicas,
                  "Also price the weights replicated (unsharded) over this many data-parallel "
                  "ranks: one home per weight against every rank's Newton-Schulz")
      ->check(at_least<int>(1));
  auto* model_cost = add_cost_model_option(*cmd, o->cost_model, "Cost model");
  cmd->add_flag("--json", o->json, "Print the plan as JSON");
  cmd->add_option("--map", o->map,
                  "Also draw the decision over (m, n) into this PNG (needs gnuplot)")
      ->check(non_empty_path());
  cmd->callback([o, &ctx, model_cost] {
    log_to_stderr();
    warn_deprecated_cost_model(model_cost, ctx.world);
    // Planning is local to rank 0; its errors are agreed on so that every rank ends with them
    // (none is left in MPI_Finalize while rank 0 aborts).
    run_on_root(ctx.world, "plan", [&] { run_plan(*o); });
  });
}

namespace {

void run_plan(const PlanCliOptions& opts_in) {
  const PlanCliOptions* o = &opts_in;
  if (o->list_models) {
    for (const auto& m : builtin_models()) {
      fmt::print(
          "{:<12} hidden {:>5}, ffn {:>5}, heads {:>3}/{:<3} kv, {:>3} layers{}\n", m.name,
          m.hidden, m.ffn, m.heads, m.kv_heads, m.layers,
          m.moe ? fmt::format(", {} experts of ffn {}", m.moe->experts, m.moe->expert_ffn) : "");
    }
    fmt::print("{:<12} the training run's default model (configs/train-default.json)\n",
               kTrainDefaultModel);
    return;
  }
  if (o->shapes.empty() == o->model.empty())
    throw Error("plan: give either --shape MxN (repeatable) or --model");
  if (!o->map.empty()) check_output_file(o->map, "--map");
  PlanOptions opts;
  opts.group_size = o->group_size;
  opts.partition_dim = o->partition_dim;
  opts.steps = o->steps;
  opts.use_syrk = o->syrk;
  opts.algorithm = parse_ns_algorithm(o->algorithm);
  opts.elem_size = o->elem_size;
  opts.crosses_domain = o->crosses;
  opts.replicas = o->replicas;
  opts.model = parse_cost_model(o->cost_model);
  opts.profile = resolve_profile(o->profile);
  if (opts.profile && !opts.crosses_domain && opts.group_size > opts.profile->domain_size) {
    spdlog::warn(
        "plan: a group of {} does not fit in one {} NVLink domain of {}: planning as "
        "cross-domain",
        opts.group_size, opts.profile->name, opts.profile->domain_size);
    opts.crosses_domain = true;
  }
  std::vector<WeightShape> weights;
  if (!o->model.empty()) {
    weights = model_weights(o->model);
  } else {
    for (const auto& s : o->shapes) {
      const auto [m, n] = parse_shape(s, "--shape");
      weights.push_back({fmt::format("{}x{}", m, n), m, n, 1, false});
    }
  }
  const Plan plan = make_plan(weights, opts);
  if (o->json) {
    fmt::print("{}\n", nlohmann::json(plan).dump(2));
  } else {
    if (!o->model.empty()) fmt::print("model: {}\n", o->model);
    fmt::print("{}", format_plan(plan));
  }
  if (!o->map.empty()) {
    render_decision_map(opts, weights, o->map);
    if (!o->json) fmt::print("decision map written to {}\n", o->map);
  }
}

}  // namespace

}  // namespace distmuon::cli
