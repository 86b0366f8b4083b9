#pragma once
// The host's name and CPU model, as wisdom files, calibration profiles and the topology's
// domains name the machine.

#include <string>

namespace distmuon::detail {

// gethostname(); throws distmuon::Error "gethostname failed: <reason>" when it fails.
std::string host_name();

// The "model name" of /proc/cpuinfo (Linux), else "unknown CPU".
std::string cpu_model();

// This process's rank among the processes of its node, as the launcher that started it reports
// it: OpenMPI, MPICH/Intel MPI, torchrun (LOCAL_RANK), then Slurm (SLURM_LOCALID, which under
// `srun torchrun` is the agent's, not the worker's), else 0: which GPU a rank uses.
int node_local_rank();

}  // namespace distmuon::detail
