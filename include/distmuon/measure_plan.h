#pragma once
// tp_mode=auto by measurement (FFTW's planner in "measure" mode): instead of trusting the cost
// model's estimate, time the model's leading candidates of every distinct key on the real machine,
// with the real dispatcher on the real communicators, and keep the fastest. The results are kept
// as wisdom (wisdom.h), so that a later run on the same host reuses them without timing.
//
// For each distinct key: the per-weight candidates (duplicated or distributed, each with the
// algorithms the key allows) whose estimate is within `within` of the best estimate, at most
// `top` of them. For each bucket of weights that share their groups (owner mode runs them
// together): owner mode with the cheaper algorithm per weight by the model, and the all-standard
// and all-Gram variants when the model puts them within `within` of it (at most 2 owner runs).
//
// Timing follows bench.h: warm-up rounds, then timed rounds; every candidate runs once per round,
// the order rotating from round to round; a run's time is the slowest rank's; the median counts.
// A bucket then takes owner mode when its fastest owner run beats the sum of its weights' fastest
// per-weight candidates, else each weight's fastest. The predicted time of a measured choice is
// its measured median.
//
// Collective over the world: every rank passes the same keys and buckets (checked) and takes part
// in every timed run; world rank 0 chooses the candidates (from its profile and the wisdom file),
// decides from the timings (identical on every rank: maxima over ranks) and shares the decision,
// so the plan is the same on every rank.

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "distmuon/auto_mode.h"
#include "distmuon/comm.h"
#include "distmuon/cost_model.h"
#include "distmuon/plan_mode.h"

namespace distmuon {

struct MeasurePlanOptions {
  int warmup = 1;         // untimed rounds
  int reps = 5;           // timed rounds (the median counts)
  int top = 3;            // per-weight candidates timed per key, at most
  double within = 3.0;    // ... whose estimate is at most this factor of the best estimate
  std::string wisdom;     // wisdom file (read before, written after); empty: none
  void validate() const;  // throws distmuon::Error naming the field
};

// A timed candidate: run it (collective over the weight's groups), and restore its input
// before each run (untimed; it returns with its copies complete, the backend synchronised, so
// that the run's clock sees none of their work).
struct MeasureTask {
  std::function<void()> run, reset;
};

// What the planner times, supplied by the optimizer (or the model benchmark).
class MeasureTarget {
 public:
  virtual ~MeasureTarget() = default;
  // One NS run of weight `weight` in a per-weight candidate.
  virtual MeasureTask weight_task(std::size_t weight, const AutoChoice& choice) = 0;
  // One owner-mode run of bucket `bucket`, algorithms per weight of the bucket (bucket order).
  virtual MeasureTask owner_task(std::size_t bucket, std::span<const NsAlgorithm> algorithms) = 0;
  // About how many bytes the tasks of these weights allocate in all (a weight's tasks share its
  // scratch copies), checked against the memory available before any task is built.
  virtual double scratch_bytes(std::span<const std::size_t> weights) const = 0;
  // The compute backend the tasks run on (Compute::name()): part of the wisdom's context. A
  // task's run returns only when its work is complete (the backend synchronised).
  virtual std::string device() const = 0;
};

// A measured per-weight candidate of a key, and a measured owner run of a bucket.
struct MeasuredCandidate {
  AutoChoice choice;
  double seconds = 0;  // median of the timed runs, slowest rank
};
struct MeasuredOwner {
  std::vector<NsAlgorithm> algorithms;  // per weight of the bucket
  double seconds = 0;
};

struct MeasuredPlan {
  std::vector<AutoChoice> choices;  // per weight
  // Per weight: the measured times of its key's candidates (timed now or read from wisdom),
  // fastest first.
  std::vector<std::vector<MeasuredCandidate>> candidates;
  // Per bucket: the measured owner runs (fastest first; empty when owner was not a candidate),
  // whether owner was chosen, and the predicted (measured) time of the bucket's plan.
  std::vector<std::vector<MeasuredOwner>> owner;
  std::vector<bool> chose_owner;
  std::vector<double> bucket_seconds;
  std::size_t timed_runs = 0;   // runs timed on this rank (warm-up included); 0: all from wisdom
  std::size_t wisdom_hits = 0;  // keys and buckets whose times came from the wisdom file
};

// Plans keys (one per weight) grouped in buckets (indices into keys; every weight in exactly one
// bucket, the keys of a bucket sharing their groups) by measuring, as described above. resolver
// gives the profile and cost model that rank the candidates. Invalid options, keys or buckets,
// a wisdom file that cannot be read or written, keys that differ between ranks, scratch that
// does not fit in memory (check_memory_fits), or a task that fails to build or throws in a timed
// run on any rank throw on every rank (a run that throws between its collectives is caught and
// agreed on after it; one that leaves its collectives half done cannot be).
MeasuredPlan plan_by_measuring(const Communicator& world, std::span<const AutoKey> keys,
                               std::span<const std::vector<std::size_t>> buckets,
                               MeasureTarget& target, const AutoModeResolver& resolver,
                               const MeasurePlanOptions& options);

}  // namespace distmuon
