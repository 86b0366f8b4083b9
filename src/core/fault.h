#pragma once
// Fault injection for the reliability tests (docs/reliability.md). A process whose environment
// holds DISTMUON_FAULT=RANK:POINT[:ACTION[:N]] fails on world rank RANK the N-th time (default
// 1) it reaches POINT; ACTION is
//   throw  throws distmuon::Error (a rank-local failure the program sees),
//   exit   ends the process at once with status 43 (std::_Exit: no unwinding, no MPI_Finalize),
//   kill   raises SIGKILL (kill -9),
//   oom    throws std::bad_alloc (an allocation that failed past the size estimates),
//   stall  stops answering: the thread sleeps until the process is ended (a hung peer),
//   stop   raises SIGSTOP: the whole process stops for good (a rank stopped, a stuck file
//          system), until a SIGCONT or the launcher's SIGKILL,
//   nan    (collective only) the collective's result on that rank becomes NaN (floating-point
//          payloads; an integer payload is left as it is).
// POINT is one of "optim-step" (inside Muon::step, half of the parameters updated),
// "checkpoint-between-files" (Trainer::save_checkpoint, the model file written, the optimizer's
// not yet), "collective" (every MPI collective: all-gather, all-reduce, reduce-scatter,
// broadcast, all-to-all, barrier, split), "file-write" (write_file_atomic, half of the temporary
// file written), "nccl" (every operation of an NCCL communicator, before it is queued:
// src/comm/nccl), "measure-reset" (a timed candidate's reset before its run, in the one runner
// of plan=measure and `bench --model`: plan/candidate_runner.h) and "bf16-hold" (Muon::step's
// float32 copy of each bfloat16 weight, before the step's first collective). The world rank comes
// from the launcher's environment (OMPI_COMM_WORLD_RANK, PMIX_RANK or PMI_RANK; 0 without one).
// Without the variable fault_point() costs one atomic load; a malformed value is an Error naming
// the variable.

#include <string>
#include <string_view>
#include <vector>

namespace distmuon::detail {

inline constexpr int kFaultExitCode = 43;

// True when the fault fires here with ACTION nan: the caller poisons what this point produces.
// The other actions act inside (throw, exit, kill, oom). `site` labels the place (recorded
// below); build it only when fault_watching().
bool fault_point(const char* point, std::string_view site = {});
// True while a fault is armed (the variable or arm_fault) or sites are recorded.
bool fault_watching();

// The fault-matrix tests drive the same hook within one process: arm a spec in DISTMUON_FAULT's
// format (it replaces the variable's; its count starts again), disarm it, and record every point
// reached on this rank, in order ("collective: all_reduce 3 x i64 over 4 ranks").
void arm_fault(const std::string& spec);
void disarm_fault();
void record_fault_sites(bool on);  // on: starts an empty record
std::vector<std::string> recorded_fault_sites();

}  // namespace distmuon::detail
