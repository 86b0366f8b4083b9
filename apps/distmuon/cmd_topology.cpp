// `mpirun -np G distmuon topology [--json]`: each rank's NVLink domain, where it came from, and
// whether the world group crosses domains. The JSON is also a topology file
// (DISTMUON_TOPOLOGY_FILE) for later runs.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "distmuon/topology.h"
#include "planning_commands.h"

namespace distmuon::cli {

void add_topology_command(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand("topology",
                                 "Print each rank's NVLink domain (run under mpirun for a group)");
  auto json_out = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json_out, "Print JSON (usable as DISTMUON_TOPOLOGY_FILE)");
  cmd->callback([json_out, &ctx] {
    log_to_stderr();
    const Topology topology = Topology::gather(ctx.world);
    const auto& all = topology.domains();
    const bool crosses = topology.crosses_world();
    if (ctx.world.rank() != 0) return;
    if (*json_out) {
      nlohmann::json ranks = nlohmann::json::array();
      for (std::size_t r = 0; r < all.size(); ++r) {
        ranks.push_back({{"rank", r}, {"domain", all[r].id}, {"source", all[r].source}});
      }
      fmt::print("{}\n", nlohmann::json{{"world_size", ctx.world.size()},
                                        {"ranks", ranks},
                                        {"crosses_domain", crosses}}
                             .dump(2));
      return;
    }
    fmt::print("{:>5}  {:<40} {}\n", "rank", "domain", "source");
    for (std::size_t r = 0; r < all.size(); ++r)
      fmt::print("{:>5}  {:<40} {}\n", r, all[r].id, all[r].source);
    fmt::print("world group of {}: {}\n", ctx.world.size(),
               crosses ? "crosses NVLink domains" : "inside one NVLink domain");
  });
}

}  // namespace distmuon::cli
