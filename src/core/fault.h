#pragma once
// Fault injection for the reliability tests (docs/reliability.md). A process whose environment
// holds DISTMUON_FAULT=RANK:POINT[:ACTION[:N]] fails on world rank RANK the N-th time (default
// 1) it reaches POINT; ACTION is
//   throw  throws distmuon::Error (a rank-local failure the program sees),
//   exit   ends the process at once with status 43 (std::_Exit: no unwinding, no MPI_Finalize),
//   kill   raises SIGKILL (kill -9),
//   oom    throws std::bad_alloc (an allocation that failed past the size estimates).
// POINT is one of "optim-step" (inside Muon::step, half of the parameters updated),
// "checkpoint-between-files" (Trainer::save_checkpoint, the model file written, the optimizer's
// not yet), "collective" (before an MPI all-reduce), "file-write" (write_file_atomic, half of
// the temporary file written) and "measure-reset" (a timed candidate's reset before its run, in
// the one runner of plan=measure and `bench --model`: plan/candidate_runner.h). The world rank
// comes from the launcher's environment (OMPI_COMM_WORLD_RANK, PMIX_RANK or PMI_RANK; 0 without
// one). Without the variable fault_point() costs one cached check; a malformed value is an Error
// naming the variable.

namespace distmuon::detail {

inline constexpr int kFaultExitCode = 43;

void fault_point(const char* point);

}  // namespace distmuon::detail
