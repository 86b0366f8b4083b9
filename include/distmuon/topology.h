#pragma once
// NVLink-domain topology: which ranks share a GPU fabric domain.
//
// CONTRACT (used by the optimizer): Topology::gather(world), once per optimizer at planning time,
// then Topology::crosses(group) for each group (local).
//
// Each process finds its domain id, in this order (docs/cost-model.md):
//  1. DISTMUON_NVLINK_DOMAIN: the id itself (source "env");
//  2. DISTMUON_TOPOLOGY_FILE: a JSON file mapping world ranks to ids, in the format that
//     `distmuon topology --json` prints: {"ranks": [{"rank": 0, "domain": "A"}, ...]} (source
//     "file");
//  3. NVML GPU fabric information (libnvidia-ml.so.1 opened with dlopen; a GPU whose fabric
//     registration is complete, with a non-zero cluster UUID): "nvml:<cluster uuid>:<clique id>";
//  4. the host name: ranks on one host share its NVLink domain (source "hostname").
// A missing driver or library falls through to the host name, logged once.

#include <string>
#include <utility>
#include <vector>

#include "distmuon/comm.h"

namespace distmuon {

struct DomainInfo {
  std::string id;      // equal ids = same NVLink domain
  std::string source;  // "env", "file", "nvml" or "hostname"
  friend bool operator==(const DomainInfo&, const DomainInfo&) = default;
};

struct TopologyProbeOptions {
  std::string nvml_library = "libnvidia-ml.so.1";
  int gpu_index =
      -1;  // NVML device queried; -1: the node-local rank (from the launcher) modulo the GPU count
};

// Probes this process's domain now (not cached). world_rank (this process's rank in the world
// whose topology is gathered) selects the entry of a topology file. A malformed override file
// throws distmuon::Error naming the file and field.
DomainInfo probe_domain(int world_rank, const TopologyProbeOptions& opts = {});

// Every rank's domain in group rank order. Collective over the group.
std::vector<DomainInfo> gather_domains(const Communicator& group, const DomainInfo& mine);

// The NVLink domains of every rank of a world (the optimizer's, or a command's group), gathered
// once; which sub-groups of that world cross a domain is then known without communicating.
class Topology {
 public:
  // Collective over world: each rank probes its domain with its rank in world, the probes'
  // success is agreed over world (a failure on any rank throws CollectiveError on every rank,
  // with the world's scope: "NVLink-domain probe failed on rank(s) 3 of 4: ..."), then one
  // all-gather of the domains.
  static Topology gather(const Communicator& world, const TopologyProbeOptions& opts = {});

  // The world's size and each rank's domain, in world rank order.
  int world_size() const { return static_cast<int>(domains_.size()); }
  const std::vector<DomainInfo>& domains() const { return domains_; }
  // True when these ranks of the world are not all in one domain. Local.
  bool crosses(const std::vector<int>& world_ranks) const;
  // True when the ranks of group (a group of this rank, made from the world or over its ranks)
  // are not all in one domain. Local: the members' world ranks come from the communicators
  // (Communicator::ranks_in). Throws distmuon::Error when they are not known, or when the group
  // has ranks outside the world.
  bool crosses(const Communicator& group) const;
  bool crosses_world() const;

 private:
  Topology(Communicator world, std::vector<DomainInfo> domains)
      : world_(std::move(world)), domains_(std::move(domains)) {}
  Communicator world_;
  std::vector<DomainInfo> domains_;
};

}  // namespace distmuon
