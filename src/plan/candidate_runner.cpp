// The one runner of timed candidates (candidate_runner.h).
#include "plan/candidate_runner.h"

#include <fmt/format.h>

#include <cmath>

#include <exception>

#include "core/fault.h"
#include "distmuon/agreement.h"
#include "distmuon/error.h"
#include "distmuon/timing.h"

namespace distmuon::detail {

std::vector<std::vector<double>> run_candidates(const Communicator& world,
                                                std::span<const MeasureTask> tasks,
                                                const CandidateRounds& rounds) {
  // The same options on every rank: a bad value throws on all of them, before any collective.
  if (rounds.warmup < 0 || rounds.reps < 1) {
    throw Error(fmt::format("{}: warm-up {} must be >= 0 and reps {} >= 1", rounds.what,
                            rounds.warmup, rounds.reps));
  }
  const std::string what = rounds.what + ": a timed run";
  std::vector<std::vector<double>> samples(tasks.size());
  // The first rank-local failure of a reset (or a time that is not finite); caught so that every
  // rank still reaches the agreement that follows.
  std::string failed;
  const auto guarded = [&failed](const std::function<void()>& f) {
    if (!failed.empty()) return;
    try {
      f();
    } catch (const std::exception& e) {
      failed = e.what();
    } catch (...) {
      failed = "an unknown exception";
    }
  };
  for (int round = 0; round < rounds.warmup + rounds.reps; ++round) {
    for (std::size_t j = 0; j < tasks.size(); ++j) {
      if (rounds.before_run) rounds.before_run(round, j);
      const MeasureTask& task = tasks[(j + static_cast<std::size_t>(round)) % tasks.size()];
      const TimingSummary s = time_on_group(
          world, {0, 1},
          [&] {
            // Not guarded: a run is collectives over the candidate's groups, and a rank that
            // left them midway would strand its partners there. Its exception ends this rank
            // (a rank-local error: the program aborts the job, apps/distmuon/main.cpp).
            if (task.run) task.run();
          },
          [&] {
            guarded([&] {
              fault_point("measure-reset");  // docs/reliability.md
              if (task.reset) task.reset();
            });
            agree_or_throw(world, failed.empty(), what, failed);
          });
      // A time that is not finite (a clock or a collective gone wrong) would decide the plan.
      if (failed.empty() && !std::isfinite(s.median_s))
        failed = fmt::format("its time on rank {} is not finite ({} s)", world.rank(), s.median_s);
      agree_or_throw(world, failed.empty(), what, failed);
      if (round >= rounds.warmup)
        samples[(j + static_cast<std::size_t>(round)) % tasks.size()].push_back(s.median_s);
    }
  }
  return samples;
}

std::function<void()> copy_reset(Compute& compute, ResetCopies copies,
                                 std::shared_ptr<const void> hold) {
  return [&compute, copies = std::move(copies), hold = std::move(hold)] {
    for (const auto& [source, work] : copies)
      compute.copy(source, work);
    compute.synchronize();
  };
}

}  // namespace distmuon::detail
