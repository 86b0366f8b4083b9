#pragma once
// The scenarios of the fault matrix (test_fault_matrix.cpp, docs/reliability.md "Fault matrix"):
// the collective work a run does, at 4 ranks, each as one function that every rank calls. Each
// returns this rank's final state as floats (weights, optimizer state, losses) and records what
// it saved, so that a run with a fault can be judged against a clean run of the same scenario.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "distmuon/comm.h"

namespace distmuon::test {

// What a scenario left behind besides its result.
struct ScenarioRecord {
  // After each complete save: the step, the checkpoint folder's digest (checkpoint_digest) and
  // the state that resuming from it must reproduce (resume_state).
  struct Saved {
    int step = 0;
    std::uint64_t digest = 0;
    std::vector<float> state;
  };
  std::vector<Saved> saved;
  // Set by a step that failed: whether the weights were left as they were before it.
  bool failed_step_left_weights = true;
};

struct Scenario {
  std::string name;
  // Runs the scenario in dir (a folder every rank sees, empty at the start). Collective.
  std::function<std::vector<float>(const Communicator& world, const std::filesystem::path& dir,
                                   ScenarioRecord& record)>
      run;
  // Whether two clean runs give bit-identical results (false: plan=measure picks by timing,
  // and its candidates agree to rounding only).
  bool exact = true;
  // The state a resume from the scenario's checkpoints in dir gives (the same kind of floats as
  // ScenarioRecord::Saved::state); empty for a scenario that saves nothing. Collective.
  std::function<std::vector<float>(const Communicator& world, const std::filesystem::path& dir)>
      resume_state;
  // The newest complete checkpoint folder in dir (empty: none).
  std::function<std::filesystem::path(const std::filesystem::path& dir)> latest;
};

// "step-estimate", "step-measure" (one optimizer step over a TP 2 x GTP 2 grid, tp_mode auto),
// "checkpoint" (two steps, a save after each into one folder, a load), "train" (the training
// loop, run_training: two steps, a checkpoint after each into its step folder, the validation
// loss, the log; then a resume).
const std::vector<Scenario>& fault_scenarios();
const Scenario& fault_scenario(const std::string& name);

// Whether dir or a folder in it holds a staging folder (".NAME.partial") left behind.
bool staging_left(const std::filesystem::path& dir);

// FNV-1a 64 over the files of a checkpoint folder (relative names and bytes, in name order;
// trainer.json without its run id, which differs between runs); 0 when it does not exist.
std::uint64_t checkpoint_digest(const std::filesystem::path& dir);

}  // namespace distmuon::test
