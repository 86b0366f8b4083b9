#pragma once
// Memory estimates checked before large allocations: a size that cannot fit (a 200000 x 200000
// demo matrix, a preset with 2^24 layers) is refused at once with the figure, instead of ending
// in a bare std::bad_alloc, or swapping, after seconds of allocation.

#include <cstdint>
#include <string_view>

namespace distmuon {

// Bytes this process can still expect to allocate: the smallest of MemAvailable in /proc/meminfo
// (else sysconf(_SC_AVPHYS_PAGES) x the page size), the room left under a cgroup v2 limit
// (memory.max less the anonymous memory in memory.stat) and under the address-space limit
// (RLIMIT_AS, as `ulimit -v` sets it, less what the process maps). The host's and the cgroup's
// room is divided by ranks_on_this_host(): the ranks of a job on one host share it.
std::uint64_t available_memory_bytes();

// The job's processes on this host, as the launcher tells them (OMPI_COMM_WORLD_LOCAL_SIZE,
// MPI_LOCALNRANKS); 1 without a launcher.
int ranks_on_this_host();

// Throws distmuon::Error "<what> needs about X GiB of memory, more than the Y GiB available"
// when bytes exceeds available_memory_bytes(). bytes is an estimate, a double so that a product
// of absurd sizes cannot wrap; a NaN or infinite estimate is refused too.
void check_memory_fits(double bytes, std::string_view what);

}  // namespace distmuon
