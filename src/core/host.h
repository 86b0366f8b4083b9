#pragma once
// The host's name and CPU model, as wisdom files, calibration profiles and the topology's
// domains name the machine.

#include <string>

namespace distmuon::detail {

// gethostname(); throws distmuon::Error "gethostname failed: <reason>" when it fails.
std::string host_name();

// The "model name" of /proc/cpuinfo (Linux), else "unknown CPU".
std::string cpu_model();

// This process's rank among the processes of its node, as the launcher reports it (OpenMPI,
// MPICH/Intel MPI, Slurm, torchrun), else 0: which GPU a rank uses.
int node_local_rank();

}  // namespace distmuon::detail
