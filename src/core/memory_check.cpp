// Memory estimates against what the machine has left (memory_check.h).
#include "distmuon/memory_check.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>

#include "distmuon/error.h"

namespace distmuon {
namespace {

constexpr std::uint64_t kUnknown = std::numeric_limits<std::uint64_t>::max();

// "MemAvailable:   123456 kB" from /proc/meminfo, in bytes.
std::optional<std::uint64_t> meminfo_available() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  std::uint64_t kib = 0;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return std::nullopt;
}

// A number from a one-line cgroup file ("max" or missing: none).
std::optional<std::uint64_t> cgroup_value(const char* file) {
  std::ifstream in(file);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  try {
    return std::stoull(text);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// "anon N" from the cgroup's memory.stat (0 when absent).
std::uint64_t cgroup_anon_bytes() {
  std::ifstream in("/sys/fs/cgroup/memory.stat");
  std::string key;
  std::uint64_t value = 0;
  while (in >> key >> value)
    if (key == "anon") return value;
  return 0;
}

// Virtual memory this process already maps (VmSize in /proc/self/status), in bytes.
std::uint64_t mapped_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmSize:", 0) == 0) {
      std::istringstream fields(line.substr(7));
      std::uint64_t kib = 0;
      if (fields >> kib) return kib * 1024;
    }
  }
  return 0;
}

}  // namespace

int ranks_on_this_host() {
  // The launchers' own count of the job's processes on this host (Open MPI, MPICH / Hydra).
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    if (const char* v = std::getenv(name)) {
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      if (end != v && *end == '\0' && n >= 1 && n <= (1 << 20)) return static_cast<int>(n);
    }
  }
  return 1;
}

std::uint64_t available_memory_bytes() {
  std::uint64_t avail = kUnknown;
  if (const auto m = meminfo_available()) {
    avail = *m;
  } else {
    const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0)
      avail = static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page);
  }
  // Under a cgroup v2 limit, the room left above the anonymous memory in use (its page cache is
  // reclaimable, so memory.current would understate the room).
  if (const auto max = cgroup_value("/sys/fs/cgroup/memory.max")) {
    const std::uint64_t anon = cgroup_anon_bytes();
    avail = std::min(avail, *max > anon ? *max - anon : 0);
  }
  // The host's memory is shared by the job's ranks on it, which allocate alike: each may count on
  // its share only (two ranks that each take the whole would need twice the host).
  if (avail != kUnknown) avail /= static_cast<std::uint64_t>(ranks_on_this_host());
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    const std::uint64_t used = mapped_bytes();
    avail = std::min<std::uint64_t>(avail, as.rlim_cur > used ? as.rlim_cur - used : 0);
  }
  return avail;
}

void check_memory_fits(double bytes, std::string_view what) {
  const std::uint64_t avail = available_memory_bytes();
  if (std::isfinite(bytes) && bytes >= 0 &&
      (avail == kUnknown || bytes <= static_cast<double>(avail)))
    return;
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const int ranks = ranks_on_this_host();
  throw Error(fmt::format(
      "{} needs about {:.1f} GiB of memory, more than the {:.1f} GiB available{}", what,
      bytes / kGiB, static_cast<double>(avail) / kGiB,
      ranks > 1 ? fmt::format(" to each of the {} ranks on this host", ranks) : std::string()));
}

}  // namespace distmuon
