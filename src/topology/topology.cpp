#include "distmuon/topology.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/host.h"
#include "distmuon/agreement.h"
#include "distmuon/error.h"
#include "distmuon/json_file.h"
#include "topology/nvml_fabric.h"

namespace distmuon {
namespace {

using nlohmann::json;

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// The domain of world_rank in a topology file ({"ranks": [{"rank": r, "domain": "id"}, ...]}).
std::string domain_from_file(const std::string& path, int world_rank) {
  const json j = read_json_file(path, "DISTMUON_TOPOLOGY_FILE: topology file");
  const auto bad = [&](const std::string& what) {
    return Error(fmt::format("topology file '{}': {}", path, what));
  };
  if (!j.is_object() || !j.contains("ranks") || !j["ranks"].is_array()) {
    throw bad("missing field 'ranks' (an array of {\"rank\": N, \"domain\": \"id\"})");
  }
  for (std::size_t i = 0; i < j["ranks"].size(); ++i) {
    const json& e = j["ranks"][i];
    if (!e.is_object() || !e.contains("rank") || !e["rank"].is_number_integer()) {
      throw bad(fmt::format("field 'ranks[{}].rank' is missing or not an integer", i));
    }
    if (e["rank"].get<int>() != world_rank) continue;
    if (!e.contains("domain") || !e["domain"].is_string() ||
        e["domain"].get<std::string>().empty()) {
      throw bad(fmt::format("field 'ranks[{}].domain' is missing or not a non-empty string", i));
    }
    return e["domain"].get<std::string>();
  }
  throw bad(fmt::format("no entry for rank {} in 'ranks'", world_rank));
}

std::string host_name() {
  try {
    return detail::host_name();
  } catch (const Error& e) {
    throw Error(fmt::format("topology: {}", e.what()));
  }
}

}  // namespace

DomainInfo probe_domain(int world_rank, const TopologyProbeOptions& opts) {
  if (const char* id = env("DISTMUON_NVLINK_DOMAIN")) return {id, "env"};
  if (const char* file = env("DISTMUON_TOPOLOGY_FILE"))
    return {domain_from_file(file, world_rank), "file"};
  std::string reason;
  const int gpu = opts.gpu_index >= 0 ? opts.gpu_index : detail::node_local_rank();
  bool no_driver = false;
  std::string id = detail::nvml_fabric_domain(opts.nvml_library, gpu, &reason, &no_driver);
  if (!id.empty()) return {std::move(id), "nvml"};
  DomainInfo out{host_name(), "hostname"};
  static std::once_flag logged;
  std::call_once(logged, [&] {
    // Without an NVIDIA driver (no NVML library) the host name is the only possible answer:
    // worth a line only at debug level. With a driver, say why its fabric was not used.
    spdlog::log(no_driver ? spdlog::level::debug : spdlog::level::info,
                "topology: no NVML fabric information ({}); NVLink domain = host name '{}'", reason,
                out.id);
  });
  return out;
}

std::vector<DomainInfo> gather_domains(const Communicator& group, const DomainInfo& mine) {
  // "id\0source" of every rank.
  std::vector<DomainInfo> out;
  for (const std::string& s : all_gather_strings(group, mine.id + '\0' + mine.source)) {
    const auto cut = s.find('\0');
    out.push_back({s.substr(0, cut), cut == std::string::npos ? "" : s.substr(cut + 1)});
  }
  return out;
}

Topology Topology::gather(const Communicator& world, const TopologyProbeOptions& opts) {
  // A probe that fails on one rank (a bad override file) fails every rank of the world, before
  // any group's collective: no rank is left waiting.
  DomainInfo mine;
  bool ok = true;
  std::string why;
  try {
    mine = probe_domain(world.rank(), opts);
  } catch (const std::exception& e) {
    ok = false;  // the flag decides, not the text: a failure without a message still fails
    why = e.what();
  }
  agree_or_throw(world, ok, "NVLink-domain probe", why);
  return Topology(world, gather_domains(world, mine));
}

bool Topology::crosses(const std::vector<int>& world_ranks) const {
  for (const int r : world_ranks) {
    if (r < 0 || r >= world_size())
      throw Error(fmt::format("topology: rank {} is not in the world of {}", r, world_size()));
  }
  return std::any_of(world_ranks.begin(), world_ranks.end(), [&](int r) {
    return domains_[static_cast<std::size_t>(r)].id !=
           domains_[static_cast<std::size_t>(world_ranks.front())].id;
  });
}

bool Topology::crosses(const Communicator& group) const {
  if (group.size() == 1) return false;
  const std::vector<int> ranks = group.ranks_in(world_);
  if (ranks.empty()) {
    throw Error(fmt::format(
        "topology: the world ranks of a group of {} ({} backend, rank {}) are not known in the "
        "world of {} ({} backend)",
        group.size(), group.backend(), group.rank(), world_.size(), world_.backend()));
  }
  return crosses(ranks);
}

bool Topology::crosses_world() const {
  return std::any_of(domains_.begin(), domains_.end(),
                     [&](const DomainInfo& d) { return d.id != domains_.front().id; });
}

}  // namespace distmuon
