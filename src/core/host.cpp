// The host's name and CPU model (host.h).
#include "core/host.h"

#include <fmt/format.h>
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "distmuon/error.h"

namespace distmuon::detail {

std::string host_name() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0)
    throw Error(fmt::format("gethostname failed: {}", std::strerror(errno)));
  return buf;
}

int node_local_rank() {
  // The launcher that started this process first: under `srun torchrun`, SLURM_LOCALID is the
  // torchrun agent's (0 on every node) and LOCAL_RANK the worker's.
  for (const char* var :
       {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "LOCAL_RANK", "SLURM_LOCALID"}) {
    if (const char* v = std::getenv(var)) return std::atoi(v);
  }
  return 0;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto first = line.find_first_not_of(" \t", colon + 1);
    if (first != std::string::npos) return line.substr(first);
  }
  return "unknown CPU";
}

}  // namespace distmuon::detail
