#pragma once
// The planning subcommands (cost model, hardware profiles, topology), added together by
// add_planning_commands (commands.h).

#include "commands.h"

namespace distmuon::cli {

void add_plan_command(CLI::App& app, Context& ctx);
void add_profiles_command(CLI::App& app, Context& ctx);
void add_topology_command(CLI::App& app, Context& ctx);

// Sends the log to stderr (same pattern and level), so that stdout carries only the command's
// output (a table or JSON that other tools read).
void log_to_stderr();

}  // namespace distmuon::cli
