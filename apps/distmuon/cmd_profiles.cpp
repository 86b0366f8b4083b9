// `distmuon profiles [--json] [--show NAME]`: the built-in hardware profiles.
#include <fmt/format.h>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "distmuon/error.h"
#include "distmuon/hardware_profile.h"
#include "planning_commands.h"

namespace distmuon::cli {

void add_profiles_command(CLI::App& app, Context& ctx) {
  auto* cmd =
      app.add_subcommand("profiles", "List the built-in hardware profiles of the cost model");
  struct Opts {
    bool json = false;
    std::string show;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_flag("--json", o->json, "Print the profiles as JSON (the format of a profile file)");
  cmd->add_option("--show", o->show, "Print one profile (a built-in name or a JSON file) in full");
  cmd->callback([o, &ctx] {
    if (ctx.world.rank() != 0) return;
    if (!o->show.empty()) {
      const auto p = resolve_profile(o->show);
      if (!p) throw Error("--show needs a profile, not 'none'");
      fmt::print("{}\n", nlohmann::json(*p).dump(2));
      return;
    }
    const auto& all = builtin_profiles();
    if (o->json) {
      fmt::print("{}\n", nlohmann::json(all).dump(2));
      return;
    }
    fmt::print("hardware profiles in {}\n", profiles_dir().string());
    fmt::print("{:<8} {:<28} {:>10} {:>10} {:>11} {:>11} {:>9} {:>9} {:>7}\n", "name", "device",
               "bf16 TF/s", "fp32 TF/s", "intra GB/s", "inter GB/s", "intra us", "inter us",
               "domain");
    for (const auto& p : all) {
      const std::string intra = p.intra_domain_peer_gbps > 0
                                    ? fmt::format("{:g}*(G-1)", p.intra_domain_peer_gbps)
                                    : fmt::format("{:g}", p.intra_domain_gbps);
      fmt::print("{:<8} {:<28} {:>10g} {:>10g} {:>11} {:>11g} {:>9g} {:>9g} {:>7}\n", p.name,
                 p.device, p.peak_tflops_bf16, p.peak_tflops_fp32, intra, p.inter_domain_gbps,
                 p.intra_domain_latency_us, p.inter_domain_latency_us, p.domain_size);
    }
    fmt::print("sources: distmuon profiles --show NAME\n");
  });
}

void log_to_stderr() {
  if (spdlog::default_logger()->name() == "stderr") return;
  const auto level = spdlog::default_logger()->level();
  spdlog::set_default_logger(spdlog::stderr_color_mt("stderr"));
  spdlog::default_logger()->set_level(level);
}

CLI::Option* add_cost_model_option(CLI::App& cmd, std::string& cost_model,
                                   const std::string& help) {
  const std::vector<std::string> models{"refined", "reference"};
  auto* name = cmd.add_option("--cost-model", cost_model, help + ": refined or reference")
                   ->check(CLI::IsMember(models))
                   ->capture_default_str();
  return cmd.add_option("--model-cost", cost_model, "Deprecated: the former name of --cost-model")
      ->check(CLI::IsMember(models))
      ->excludes(name);
}

void warn_deprecated_cost_model(const CLI::Option* alias, const Communicator& world) {
  if (alias->count() > 0 && world.rank() == 0)
    spdlog::warn("--model-cost is deprecated: use --cost-model (as train and its config name it)");
}

void add_planning_commands(CLI::App& app, Context& ctx) {
  add_plan_command(app, ctx);
  add_profiles_command(app, ctx);
  add_topology_command(app, ctx);
  add_calibrate_command(app, ctx);
}

}  // namespace distmuon::cli
