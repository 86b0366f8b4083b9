// The fault matrix (docs/reliability.md, "Fault matrix"): every MPI collective of five scenarios
// at 4 ranks (one optimizer step with plan estimate and with plan measure over a TP 2 x GTP 2
// grid, two steps of weights replicated over the world on their homes, a checkpoint save and
// load, the training loop with its checkpoints) made to fail on each rank in turn.
//  - nan: the collective's result on that rank becomes NaN (every floating-point collective, on
//    every rank). Run within one 4-rank job, case after case: every rank must end the scenario
//    with the same error agreed over the world, a failed step must leave the weights as they
//    were, the checkpoint folder must hold a complete checkpoint of the run (or none) that
//    resumes to the clean run's state bit for bit; or, when the NaN is harmless, the result
//    must be the clean run's.
//  - throw, exit: the rank throws instead of entering the collective, or ends at once (no
//    unwinding, no MPI_Finalize). Each is its own 4-rank job, at the first call of each distinct
//    site (operation, type and group size), thrown on two ranks and exited on a third per site,
//    in turn: the job must end within 30 s, non-zero, the failing rank named, and leave the
//    checkpoint folder whole.
// A case that runs past 30 s aborts the job, naming the case (a hang).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "core/fault.h"
#include "distmuon/agreement.h"
#include "distmuon/error.h"
#include "fault_scenarios.h"
#include "test_util.h"

namespace distmuon::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kRanks = 4;
constexpr int kCaseLimitSeconds = 30;

// Ends the job when a case runs past kCaseLimitSeconds: a rank waits forever somewhere.
class Watchdog {
 public:
  explicit Watchdog(int rank) : rank_(rank), thread_([this] { watch(); }) {}
  ~Watchdog() {
    {
      const std::lock_guard lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void start(std::string name) {
    const std::lock_guard lock(mutex_);
    name_ = std::move(name);
    started_ = std::chrono::steady_clock::now();
  }
  void stop() {
    const std::lock_guard lock(mutex_);
    name_.clear();
  }

 private:
  void watch() {
    std::unique_lock lock(mutex_);
    while (!done_) {
      wake_.wait_for(lock, std::chrono::seconds(1));
      if (!name_.empty() &&
          std::chrono::steady_clock::now() - started_ > std::chrono::seconds(kCaseLimitSeconds)) {
        std::cerr << fmt::format("HANG: rank {}: the case '{}' ran past {} s\n", rank_, name_,
                                 kCaseLimitSeconds)
                  << std::flush;
        std::_Exit(3);  // mpirun then ends the job
      }
    }
  }
  const int rank_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::string name_;
  std::chrono::steady_clock::time_point started_;
  std::thread thread_;
};

// "ok", or how the scenario failed on this rank: "world: <message>" (a CollectiveError agreed
// over the world), "subgroup: ..." or "local: ..." (this rank's own).
std::string run_scenario(const Scenario& s, const Communicator& world, const fs::path& dir,
                         ScenarioRecord& record, std::vector<float>& state) {
  try {
    state = s.run(world, dir, record);
    return "ok";
  } catch (const CollectiveError& e) {
    return fmt::format("{}: {}", e.scope().is_world() ? "world" : "subgroup", e.what());
  } catch (const std::exception& e) {
    return fmt::format("local: {}", e.what());
  }
}

// An empty folder every rank sees. Collective.
fs::path fresh_dir(const Communicator& world, const fs::path& dir) {
  if (world.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  world.barrier();
  return dir;
}

fs::path shared_root(const Communicator& world, const std::string& name) {
  const std::string mine =
      (fs::temp_directory_path() / fmt::format("distmuon_{}_{}", name, ::getpid())).string();
  return world.broadcast_string(mine, 0);
}

// The collective sites (their labels, in order) a clean run of s reaches on this rank.
std::vector<std::string> record_sites(const Scenario& s, const Communicator& world,
                                      const fs::path& dir, ScenarioRecord& record,
                                      std::vector<float>& state) {
  detail::record_fault_sites(true);
  const std::string outcome = run_scenario(s, world, dir, record, state);
  std::vector<std::string> sites;
  for (const std::string& site : detail::recorded_fault_sites())
    if (site.starts_with("collective: ")) sites.push_back(site.substr(12));
  detail::record_fault_sites(false);
  EXPECT_EQ(outcome, "ok") << s.name;
  return sites;
}

bool floating_point_site(const std::string& label) {
  for (const char* t : {" x f32 ", " x f64 ", " x bf16 ", " x f16 "})
    if (label.find(t) != std::string::npos) return true;
  return false;
}

// Same within 1e-4 relative (Frobenius): plan=measure may pick another mode than a clean run,
// and the modes agree to fp32 rounding (test_muon_layouts: 1e-5 per step).
bool same_state(const std::vector<float>& a, const std::vector<float>& b, bool exact) {
  if (a.size() != b.size()) return false;
  if (exact) return a == b;
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return false;
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return diff <= 1e-8 * norm;
}

// Whether the checkpoint folder after a failed run is one the clean run saved (or none), no
// staging folder is left, and resuming from it gives the clean run's state at its step. Every
// rank returns the same answer (what is wrong, or "").
std::string judge_folder(const Scenario& s, const Communicator& world, const fs::path& dir,
                         const ScenarioRecord& record, const ScenarioRecord& clean) {
  std::string wrong;
  const fs::path latest = s.latest(dir);
  const std::uint64_t digest = latest.empty() ? 0 : checkpoint_digest(latest);
  const ScenarioRecord::Saved* at = nullptr;
  for (const auto& saved : clean.saved)
    if (saved.digest == digest) at = &saved;
  if (digest != 0 && at == nullptr) wrong = "the checkpoint folder is none the clean run saved";
  if (at && !record.saved.empty() && at->step < record.saved.back().step)
    wrong = fmt::format("the folder went back to step {}", at->step);
  if (digest == 0 && !record.saved.empty()) wrong = "a saved checkpoint disappeared";
  if (staging_left(dir)) wrong = "a staging folder was left behind";
  if (world.all_reduce<std::int32_t>(wrong.empty() ? 0 : 1, ReduceOp::kMax) != 0) {
    return wrong.empty() ? "another rank's folder check failed" : wrong;
  }
  if (at == nullptr) return "";
  std::vector<float> resumed;
  try {
    resumed = s.resume_state(world, dir);
  } catch (const std::exception& e) {
    return fmt::format("resuming from the folder failed: {}", e.what());
  }
  const bool same = resumed == at->state;
  if (world.all_reduce<std::int32_t>(same ? 0 : 1, ReduceOp::kMax) != 0)
    return fmt::format("resuming from step {} does not give the clean run's state", at->step);
  return "";
}

struct Tally {
  int sites = 0;          // collective sites per rank, summed over the ranks
  int float_sites = 0;    // of which floating-point (the nan cases)
  int agreed_errors = 0;  // nan cases ended by one error on every rank
  int harmless = 0;       // nan cases whose result is the clean run's
};

// nan at every floating-point collective of every scenario on every rank, in this one job.
TEST(FaultMatrix, NanAtEveryFloatingPointCollective) {
  const Communicator& world = test::world();
  if (world.size() != kRanks) GTEST_SKIP() << "the matrix runs at " << kRanks << " ranks";
  const fs::path root = shared_root(world, "fault_matrix");
  Watchdog watchdog(world.rank());
  std::vector<std::string> failures;
  json table = json::array();
  for (const Scenario& s : fault_scenarios()) {
    ScenarioRecord clean;
    std::vector<float> clean_state;
    const std::vector<std::string> mine =
        record_sites(s, world, fresh_dir(world, root / s.name), clean, clean_state);
    std::vector<std::vector<std::string>> sites;  // per rank
    for (const std::string& text : all_gather_strings(world, json(mine).dump()))
      sites.push_back(json::parse(text).get<std::vector<std::string>>());
    Tally tally;
    for (int r = 0; r < kRanks; ++r) {
      const auto& at = sites[static_cast<std::size_t>(r)];
      tally.sites += static_cast<int>(at.size());
      for (std::size_t n = 0; n < at.size(); ++n) {
        if (!floating_point_site(at[n])) continue;
        ++tally.float_sites;
        const std::string name =
            fmt::format("{}: rank {} collective {} ({})", s.name, r, n + 1, at[n]);
        const fs::path dir = fresh_dir(world, root / s.name);
        ScenarioRecord record;
        std::vector<float> state;
        detail::arm_fault(fmt::format("{}:collective:nan:{}", r, n + 1));
        watchdog.start(name);
        const std::string outcome = run_scenario(s, world, dir, record, state);
        watchdog.stop();
        detail::disarm_fault();
        const std::vector<std::string> outcomes = all_gather_strings(world, outcome);
        std::string wrong;
        if (std::all_of(outcomes.begin(), outcomes.end(),
                        [](const std::string& o) { return o == "ok"; })) {
          const bool same = same_state(state, clean_state, s.exact);
          if (world.all_reduce<std::int32_t>(same ? 0 : 1, ReduceOp::kMax) != 0)
            wrong = "no error, and the result differs from the clean run's";
          ++tally.harmless;
        } else if (std::any_of(outcomes.begin(), outcomes.end(),
                               [&](const std::string& o) { return o != outcomes[0]; }) ||
                   !outcomes[0].starts_with("world: ")) {
          wrong = fmt::format("the ranks ended differently: {}", fmt::join(outcomes, " | "));
        } else {
          ++tally.agreed_errors;
          if (world.all_reduce<std::int32_t>(record.failed_step_left_weights ? 0 : 1,
                                             ReduceOp::kMax) != 0)
            wrong = "a failed step changed the weights";
          if (wrong.empty() && s.resume_state) wrong = judge_folder(s, world, dir, record, clean);
        }
        if (!wrong.empty()) failures.push_back(fmt::format("{}: {}", name, wrong));
      }
    }
    table.push_back({{"scenario", s.name},
                     {"sites", tally.sites},
                     {"nan_cases", tally.float_sites},
                     {"agreed_errors", tally.agreed_errors},
                     {"harmless", tally.harmless}});
  }
  if (world.rank() == 0) {
    std::cout << "fault matrix (nan): " << table.dump() << std::endl;
    if (const char* out = std::getenv("DISTMUON_FAULT_MATRIX_TABLE")) std::ofstream(out) << table;
    fs::remove_all(root);
  }
  EXPECT_TRUE(failures.empty()) << fmt::format("{}", fmt::join(failures, "\n"));
}

// ---- throw and exit: one 4-rank job per case, launched by FaultMatrixLaunch (1 rank) ----

const char* env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// One job of the launched matrix (skipped unless DISTMUON_FAULT_MATRIX_CASE names a scenario).
// Without DISTMUON_FAULT_MATRIX_SPEC: the clean run, which writes its sites and its saved
// checkpoints' digests to DIR/../sites.json. With it: the fault armed, and the run ended as the
// CLI ends one (apps/distmuon/main.cpp): an error agreed over the world ends every rank with
// status 1, any other aborts the job.
TEST(FaultMatrixCase, Run) {
  const std::string name = env_or_empty("DISTMUON_FAULT_MATRIX_CASE");
  if (name.empty()) GTEST_SKIP() << "launched by FaultMatrixLaunch";
  const Communicator& world = test::world();
  const fs::path dir = env_or_empty("DISTMUON_FAULT_MATRIX_DIR");
  const std::string spec = env_or_empty("DISTMUON_FAULT_MATRIX_SPEC");
  const Scenario& s = fault_scenario(name);
  ScenarioRecord record;
  std::vector<float> state;
  if (spec.empty()) {
    const std::vector<std::string> sites = record_sites(s, world, dir, record, state);
    const std::vector<std::string> all = all_gather_strings(world, json(sites).dump());
    if (world.rank() == 0) {
      json out = {{"sites", json::array()}, {"saved", json::array()}};
      for (const std::string& text : all)
        out["sites"].push_back(json::parse(text));
      for (const auto& saved : record.saved)
        out["saved"].push_back(saved.digest);
      std::ofstream(dir.parent_path() / "sites.json") << out.dump();
    }
    return;
  }
  detail::arm_fault(spec);
  try {
    s.run(world, dir, record);
  } catch (const CollectiveError& e) {
    if (e.scope().is_world()) {
      if (world.rank() == 0) std::cerr << "distmuon: error: " << e.what() << std::endl;
      GTEST_FAIL() << "ended by an agreed error";
    }
    std::cerr << fmt::format("distmuon: error on rank {}: {}", world.rank(), e.what()) << std::endl;
    world.abort(1);
  } catch (const std::exception& e) {
    std::cerr << fmt::format("distmuon: error on rank {}: {}", world.rank(), e.what()) << std::endl;
    world.abort(1);
  }
  ADD_FAILURE() << "the fault " << spec << " did not end the run";
}

// A site without its element count: "all_reduce x i64 over 4 ranks".
std::string site_key(const std::string& label) {
  return std::regex_replace(label, std::regex(" [0-9]+ x "), " x ");
}

test::CommandRun launch(const std::string& scenario, const fs::path& dir, const std::string& spec) {
  const std::string cmd = fmt::format(
      "DISTMUON_FAULT_MATRIX_CASE={} DISTMUON_FAULT_MATRIX_DIR='{}' DISTMUON_FAULT_MATRIX_SPEC={} "
      "timeout -k 5 {} {} -np {} --oversubscribe --bind-to none -x DISTMUON_FAULT_MATRIX_CASE "
      "-x DISTMUON_FAULT_MATRIX_DIR -x DISTMUON_FAULT_MATRIX_SPEC --mca odls_base_sigkill_timeout "
      "0 {} --gtest_filter=FaultMatrixCase.Run",
      scenario, dir.string(), spec, kCaseLimitSeconds, DISTMUON_MPIEXEC, kRanks,
      fs::read_symlink("/proc/self/exe").string());
  return run_command(cmd, dir.parent_path() / "output.txt");
}

// throw and exit at the first collective of each distinct site of each scenario, on each rank.
TEST(FaultMatrixLaunch, ThrowAndExitAtEveryDistinctSiteEndTheJob) {
  if (test::world().size() != 1) GTEST_SKIP() << "launches its own 4-rank jobs";
  if (!std::string(env_or_empty("DISTMUON_FAULT_MATRIX_CASE")).empty()) GTEST_SKIP();
  const fs::path root =
      fs::temp_directory_path() / fmt::format("distmuon_fault_launch_{}", ::getpid());
  std::vector<std::string> failures;
  json table = json::array();
  for (const Scenario& s : fault_scenarios()) {
    const fs::path work = root / s.name / "work";
    fs::remove_all(root / s.name);
    fs::create_directories(work);
    const CommandRun clean = launch(s.name, work, "");
    ASSERT_EQ(clean.exit_code, 0) << clean.output;
    const json sites = json::parse(read_text(root / s.name / "sites.json"));
    const auto saved = sites.at("saved").get<std::vector<std::uint64_t>>();
    std::map<std::string, int> cases;  // per kind
    // The distinct sites of the scenario in order of first appearance: each rank's list, keyed
    // without the element count (an all-reduce of 3 or of 5 integers over one group is one site).
    std::vector<std::pair<std::string, std::vector<long>>> distinct;  // key -> first N per rank
    for (int r = 0; r < kRanks; ++r) {
      const auto at = sites.at("sites").at(r).get<std::vector<std::string>>();
      for (std::size_t n = 0; n < at.size(); ++n) {
        const std::string key = site_key(at[n]);
        auto it = std::find_if(distinct.begin(), distinct.end(),
                               [&](const auto& d) { return d.first == key; });
        if (it == distinct.end()) {
          distinct.emplace_back(key, std::vector<long>(kRanks, 0));
          it = distinct.end() - 1;
        }
        if (it->second[static_cast<std::size_t>(r)] == 0)
          it->second[static_cast<std::size_t>(r)] = static_cast<long>(n + 1);
      }
    }
    for (std::size_t d = 0; d < distinct.size(); ++d) {
      for (int r = 0; r < kRanks; ++r) {
        const long n = distinct[d].second[static_cast<std::size_t>(r)];
        if (n == 0) continue;  // this rank never reaches the site
        // Per site three ranks in turn: throw on ranks d and d + 1, exit on rank d + 2 (mod 4),
        // so every rank throws and exits across a scenario's sites; mpirun ends the job alike
        // whichever rank exits (nan, in one job, covers every collective on every rank).
        const int turn = (r - static_cast<int>(d % kRanks) + kRanks) % kRanks;
        for (const char* kind : {"throw", "exit"}) {
          if ((std::string(kind) == "throw") != (turn < 2) || turn == 3) continue;
          ++cases[kind];
          fs::remove_all(work);
          fs::create_directories(work);
          const std::string spec = fmt::format("{}:collective:{}:{}", r, kind, n);
          const CommandRun run = launch(s.name, work, spec);
          const std::string name = fmt::format("{} {} ({})", s.name, spec, distinct[d].first);
          std::vector<std::string> wrong;
          if (run.exit_code == 0) wrong.push_back("exit status 0");
          if (run.exit_code == 124 || run.exit_code == 137 || run.seconds >= kCaseLimitSeconds)
            wrong.push_back(fmt::format("a rank hung ({:.1f} s)", run.seconds));
          const std::string injected =
              fmt::format("injected fault 'collective' ({}) on rank {}", kind, r);
          if (run.output.find(injected) == std::string::npos)
            wrong.push_back("the fault did not fire");
          const std::regex named(
              std::string(kind) == "throw"
                  ? fmt::format(
                        R"(distmuon: error( on rank {0})?: .*on rank {0} \(DISTMUON_FAULT\))", r)
                  : fmt::format(R"(process rank {0}\b|Process name: \[\[[0-9]+,[0-9]+\],{0}\])",
                                r));
          if (!std::regex_search(run.output, named)) wrong.push_back("the failing rank not named");
          const fs::path latest = s.latest ? s.latest(work) : fs::path();
          const std::uint64_t digest = latest.empty() ? 0 : checkpoint_digest(latest);
          if (digest != 0 && std::find(saved.begin(), saved.end(), digest) == saved.end())
            wrong.push_back("the checkpoint folder is none the clean run saved");
          if (!wrong.empty())
            failures.push_back(fmt::format("{}: {}\n{}", name, fmt::join(wrong, "; "), run.output));
        }
      }
    }
    table.push_back({{"scenario", s.name},
                     {"distinct_sites", distinct.size()},
                     {"throw_cases", cases["throw"]},
                     {"exit_cases", cases["exit"]}});
  }
  std::cout << "fault matrix (throw, exit): " << table.dump() << std::endl;
  fs::remove_all(root);
  EXPECT_TRUE(failures.empty()) << fmt::format("{}", fmt::join(failures, "\n\n"));
}

}  // namespace
}  // namespace distmuon::test
