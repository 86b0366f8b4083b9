#pragma once
// NVLink-domain topology: which ranks share a GPU fabric domain.
//
// CONTRACT (used by the optimizer; keep this declaration): crosses_domain(group).
//
// Each process finds its domain id once, in this order (docs/cost-model.md):
//  1. DISTMUON_NVLINK_DOMAIN: the id itself (source "env");
//  2. DISTMUON_TOPOLOGY_FILE: a JSON file mapping world ranks to ids, in the format that
//     `distmuon topology --json` prints: {"ranks": [{"rank": 0, "domain": "A"}, ...]} (source
//     "file");
//  3. NVML GPU fabric information (libnvidia-ml.so.1 opened with dlopen; a GPU whose fabric
//     registration is complete, with a non-zero cluster UUID): "nvml:<cluster uuid>:<clique id>";
//  4. the host name: ranks on one host share its NVLink domain (source "hostname").
// A missing driver or library falls through to the host name, logged once.

#include <string>
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

// Probes this process's domain now (not cached). world_rank selects the entry of a topology file.
// A malformed override file throws distmuon::Error naming the file and field.
DomainInfo probe_domain(int world_rank, const TopologyProbeOptions& opts = {});
// This process's domain, probed once with the rank of world_communicator().
const DomainInfo& local_domain();
// Forgets the cached local_domain() so the next call probes again (after the environment changed).
void reset_local_domain();

// Every rank's domain in group rank order. Collective over the group.
std::vector<DomainInfo> gather_domains(const Communicator& group, const DomainInfo& mine);

// True when the ranks of the group are not all in one NVLink domain. Collective: every rank of
// the group must call it; all-gathers the ranks' domain ids.
bool crosses_domain(const Communicator& group);
bool crosses_domain(const Communicator& group, const DomainInfo& mine);

}  // namespace distmuon
