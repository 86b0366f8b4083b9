#pragma once
// The planning subcommands (cost model, hardware profiles, topology, calibration), added together
// by add_planning_commands (commands.h).

#include "commands.h"

namespace distmuon::cli {

void add_plan_command(CLI::App& app, Context& ctx);
void add_profiles_command(CLI::App& app, Context& ctx);
void add_topology_command(CLI::App& app, Context& ctx);
void add_calibrate_command(CLI::App& app, Context& ctx);

// Sends the log to stderr (same pattern and level), so that stdout carries only the command's
// output (a table or JSON that other tools read).
void log_to_stderr();

// --cost-model (refined|reference), the name `train` and the training config use, on cmd; and
// --model-cost, its former name in `plan` and `bench`, kept as a deprecated alias. Returns the
// alias, for warn_deprecated_cost_model.
CLI::Option* add_cost_model_option(CLI::App& cmd, std::string& cost_model, const std::string& help);
// Rank 0 warns when the alias was used.
void warn_deprecated_cost_model(const CLI::Option* alias, const Communicator& world);

}  // namespace distmuon::cli
