#pragma once
// The one runner of timed candidates (MeasureTask: a run and the reset of its input), shared by
// the planner (plan_by_measuring: plan=measure in the optimizer and in `bench --model --plan
// measure`) and the model benchmark's own rounds (`bench --model`):
//
// - warm-up rounds, then timed rounds; each round runs every task once, the order rotating from
//   round to round, so that a slow spell of a shared machine hits every candidate alike;
// - before each run, untimed: the fault point "measure-reset" (core/fault.h) and the task's reset,
//   whose failure on any rank is agreed over the world before the run (whose collectives span the
//   failing rank: the others would wait there for it); then a barrier, the run, and its time as
//   the slowest rank's (time_on_group); a time that is not finite is agreed after the run, as a
//   failure; a run's exception is not caught (a rank leaving the run's collectives midway would
//   strand its partners there: it is a rank-local error, on which a program aborts the job);
// - a reset made by copy_reset restores the run's input with backend copies and returns with the
//   backend synchronised, so that the clock of the run after it sees none of the copies' work.

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/measure_plan.h"

namespace distmuon::detail {

struct CandidateRounds {
  int warmup = 1;  // untimed rounds (>= 0)
  int reps = 5;    // timed rounds (>= 1)
  // Names the runs in the agreed error: "<what>: a timed run failed on rank(s) ... of N: ...".
  std::string what;
  // Called on every rank before each run (round from 0, run from 0 within the round); may be
  // empty. Progress only: it must not throw.
  std::function<void(int round, std::size_t run)> before_run;
};

// Runs tasks in rounds as described above, collective over world (every rank passes as many
// tasks, the same rounds). Returns per task its timed rounds' times in seconds (the slowest
// rank's each; identical on every rank). A reset that throws, or a time that is not finite, on
// some ranks throws CollectiveError on every rank, with the first failing rank's message; no
// later run starts. A run that throws is this rank's own error (see above).
std::vector<std::vector<double>> run_candidates(const Communicator& world,
                                                std::span<const MeasureTask> tasks,
                                                const CandidateRounds& rounds);

// A reset that copies each source to its work matrix (both in compute's memory) and returns with
// compute synchronised. hold keeps the matrices alive as long as the reset (may be empty when
// their owner outlives it).
using ResetCopies = std::vector<std::pair<ConstMatrixView, MatrixView>>;
std::function<void()> copy_reset(Compute& compute, ResetCopies copies,
                                 std::shared_ptr<const void> hold = {});

}  // namespace distmuon::detail
