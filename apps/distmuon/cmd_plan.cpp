// `distmuon plan`: the cost model over a model's Muon weights (or given shapes): the mode per
// distinct shape and the totals per optimizer step. See docs/cost-model.md.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cctype>

#include <nlohmann/json.hpp>

#include "cli_checks.h"
#include "distmuon/agreement.h"
#include "distmuon/error.h"
#include "distmuon/file_io.h"
#include "distmuon/placement.h"
#include "distmuon/plan.h"
#include "distmuon/plots.h"
#include "distmuon/step_simulation.h"
#include "distmuon/train_config.h"
#include "planning_commands.h"

namespace distmuon::cli {
namespace {

struct PlanCliOptions {
  std::vector<std::string> shapes;
  std::string model, profile = "none", cost_model = "refined", map, algorithm = "standard";
  int group_size = 8, partition_dim = 0, steps = 5, elem_size = 2, replicas = 1;
  bool syrk = true, crosses = false, json = false, list_models = false;
  // The placement and its step simulation (--parallel).
  std::string parallel, sharding = "layerwise";
  int domain_size = 0, buckets = 1, rank = -1;
  bool batch_experts = true;
  std::string replica_wire = "fp32";
  double link_latency_us = 0, link_gbps = 0;  // an emulated link, as bench --model's
};

void run_simulation(const PlanCliOptions& o, const std::vector<WeightShape>& weights);

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
  cmd->add_option(
         "--parallel", o->parallel,
         "Simulate the optimizer step of the model placed as Megatron places it, e.g. "
         "tp=2,pp=4,vpp=4,ep=64,etp=1,dp=64,cp=1 (also gtp=, egtp=: row sharding inside "
         "dp); needs --profile; -G, --partition-dim and --crosses-domain then do not apply")
      ->check(non_empty_path());
  cmd->add_option("--optimizer-sharding", o->sharding,
                  "With --parallel: the optimizer state over the data-parallel replicas: none, "
                  "zero1 or layerwise")
      ->check(CLI::IsMember({"none", "zero1", "layerwise"}))
      ->capture_default_str();
  cmd->add_option("--domain-size", o->domain_size,
                  "With --parallel: ranks per NVLink domain (0: the profile's domain_size)")
      ->check(in_range<int>(0, ProfileBounds::kMaxDomainSize))
      ->capture_default_str();
  cmd->add_option("--buckets", o->buckets,
                  "With --parallel: pipelined buckets of owner and replicated-home (1: serial)")
      ->check(in_range<int>(1, 4096))
      ->capture_default_str();
  cmd->add_option("--replica-wire", o->replica_wire,
                  "With --parallel: what replicated-home sends to the other replicas: fp32 or "
                  "bf16 (replica_wire)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--link-latency-us", o->link_latency_us,
                  "With --parallel: price owner's and replicated-home's exchanges over an "
                  "emulated link of this latency, as bench --model --link-latency-us runs them")
      ->check(in_range<double>(0, ProfileBounds::kMaxLatencyUs));
  cmd->add_option("--link-gbps", o->link_gbps,
                  "With --parallel: price owner's and replicated-home's exchanges over an "
                  "emulated link of this bandwidth (GB/s), as bench --model --link-gbps runs them")
      ->check(in_range<double>(0, ProfileBounds::kMaxGbps));
  cmd->add_option("--rank", o->rank,
                  "With --parallel: also list what this rank holds and the Muon work it owns in "
                  "each mode")
      ->check(in_range<int>(0, kMaxGroupSize));
  cmd->add_flag("--batch-experts,!--no-batch-experts", o->batch_experts,
                "With --parallel: a layer's experts on a rank share their collectives (default)");
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
          "{:<14} hidden {:>5}, ffn {:>5}, heads {:>3}/{:<3} kv, {:>3} layers{}\n", m.name,
          m.hidden, m.ffn, m.heads, m.kv_heads, m.layers,
          m.moe ? fmt::format(", {} experts of ffn {}", m.moe->experts, m.moe->expert_ffn) : "");
    }
    fmt::print("{:<14} the training run's default model (configs/train-default.json)\n",
               kTrainDefaultModel);
    return;
  }
  if (o->shapes.empty() == o->model.empty())
    throw Error("plan: give either --shape MxN (repeatable) or --model");
  std::vector<WeightShape> weights;
  if (!o->model.empty()) {
    weights = model_weights(o->model);
  } else {
    for (const auto& s : o->shapes) {
      const auto [m, n] = parse_shape(s, "--shape");
      weights.push_back({fmt::format("{}x{}", m, n), m, n, 1, false});
    }
  }
  if (!o->parallel.empty()) {
    if (!o->map.empty()) throw Error("plan: --map does not apply to --parallel");
    run_simulation(*o, weights);
    return;
  }
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

void run_simulation(const PlanCliOptions& o, const std::vector<WeightShape>& weights) {
  SimulationOptions sim;
  std::optional<HardwareProfile> profile = resolve_profile(o.profile);
  if (!profile)
    throw Error("plan --parallel: give --profile (a built-in name or a calibrated profile file)");
  sim.profile = std::move(*profile);
  sim.elem_size = o.elem_size;
  sim.steps = o.steps;
  sim.use_syrk = o.syrk;
  sim.algorithm = parse_ns_algorithm(o.algorithm);
  sim.buckets = o.buckets;
  sim.batch_experts = o.batch_experts;
  sim.wire_elem_size = o.replica_wire == "bf16" ? 2 : 4;
  sim.link = {o.link_latency_us * 1e-6, o.link_gbps * 1e9};
  Parallelism par = parse_parallelism(o.parallel);
  par.sharding = parse_optimizer_sharding(o.sharding);
  std::string lower = o.model;
  for (char& c : lower)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const bool preset = !o.model.empty() && lower != kTrainDefaultModel;
  const Placement placement(
      preset ? layered_weights(resolve_model(o.model)) : layered_weights(weights), par,
      o.domain_size > 0 ? o.domain_size : sim.profile.domain_size);
  if (o.rank >= placement.world()) {
    throw Error(fmt::format("plan: --rank {} is outside the placement's {} ranks", o.rank,
                            placement.world()));
  }
  const StepSimulation result = simulate_step(placement, sim);
  if (o.json) {
    nlohmann::json j = result;
    if (!o.model.empty()) j["model"] = o.model;
    fmt::print("{}\n", j.dump(2));
    return;
  }
  if (!o.model.empty()) fmt::print("model: {} ({} layers)\n", o.model, placement.layers());
  fmt::print("{}", format_simulation(result));
  if (o.rank >= 0) fmt::print("{}", format_rank(placement, sim, o.rank));
}

}  // namespace

}  // namespace distmuon::cli
