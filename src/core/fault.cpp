// DISTMUON_FAULT: fault injection at named points (format in fault.h).
#include "core/fault.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "distmuon/error.h"

namespace distmuon::detail {
namespace {

constexpr const char* kPoints[] = {
    "optim-step", "checkpoint-between-files", "collective", "file-write", "measure-reset", "nccl",
    "bf16-hold"};
constexpr const char* kActions[] = {"throw", "exit", "kill", "oom", "nan", "stall", "stop"};

struct FaultSpec {
  int rank = 0;
  std::string point;
  std::string action = "throw";
  long nth = 1;
};

int env_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    if (const char* v = std::getenv(var)) return std::atoi(v);
  }
  return 0;
}

bool one_of(const std::string& s, const auto& names) {
  for (const char* n : names)
    if (s == n) return true;
  return false;
}

// RANK:POINT[:ACTION[:N]]; nullopt for an empty text.
std::optional<FaultSpec> parse_fault(const std::string& s) {
  if (s.empty()) return std::nullopt;
  const auto bad = [&](const std::string& why) {
    return Error(fmt::format(
        "DISTMUON_FAULT='{}': {} (expected RANK:POINT[:throw|exit|kill|oom|nan|stall|stop[:N]])", s,
        why));
  };
  std::vector<std::string> parts;
  for (std::size_t start = 0;;) {
    const std::size_t colon = s.find(':', start);
    parts.push_back(s.substr(start, colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  if (parts.size() < 2 || parts.size() > 4) throw bad("wrong number of fields");
  FaultSpec f;
  char* end = nullptr;
  f.rank = static_cast<int>(std::strtol(parts[0].c_str(), &end, 10));
  if (parts[0].empty() || *end != '\0' || f.rank < 0) throw bad("RANK is not a rank");
  f.point = parts[1];
  if (!one_of(f.point, kPoints)) {
    throw bad(fmt::format("unknown POINT ({})", fmt::join(kPoints, ", ")));
  }
  if (parts.size() > 2) f.action = parts[2];
  if (!one_of(f.action, kActions)) throw bad("unknown ACTION");
  if (f.action == "nan" && f.point != "collective") throw bad("nan applies to collective only");
  if (parts.size() > 3) {
    f.nth = std::strtol(parts[3].c_str(), &end, 10);
    if (parts[3].empty() || *end != '\0' || f.nth < 1) throw bad("N is not a positive count");
  }
  return f;
}

// The armed fault (this rank's only) and the record of points reached.
struct State {
  std::mutex mutex;
  std::optional<FaultSpec> spec;
  long reached = 0;  // times spec->point was reached since it was armed
  bool recording = false;
  std::vector<std::string> sites;

  void arm(std::optional<FaultSpec> f) {
    spec = f && f->rank == env_rank() ? std::move(f) : std::nullopt;
    reached = 0;
  }
};

std::atomic<bool> g_watching{false};

State& state() {
  static State* s = [] {
    auto* st = new State;  // never destroyed: points may be reached during static destruction
    const char* env = std::getenv("DISTMUON_FAULT");
    st->arm(parse_fault(env ? env : ""));
    g_watching = st->spec.has_value();
    return st;
  }();
  return *s;
}

}  // namespace

bool fault_watching() {
  static const bool initialised = (state(), true);  // reads the variable once
  (void)initialised;
  return g_watching.load(std::memory_order_relaxed);
}

bool fault_point(const char* point, std::string_view site) {
  if (!fault_watching()) return false;
  State& s = state();
  std::string action;
  {
    const std::lock_guard lock(s.mutex);
    if (s.recording) s.sites.push_back(fmt::format("{}: {}", point, site));
    if (!s.spec || s.spec->point != point || ++s.reached != s.spec->nth) return false;
    action = s.spec->action;
  }
  const int rank = env_rank();
  std::fprintf(stderr, "distmuon: injected fault '%s' (%s) on rank %d\n", point, action.c_str(),
               rank);
  std::fflush(stderr);
  if (action == "nan") return true;
  if (action == "exit") std::_Exit(kFaultExitCode);
  if (action == "kill") std::raise(SIGKILL);
  if (action == "oom") throw std::bad_alloc();
  if (action == "stop") {
    std::raise(SIGSTOP);  // stays stopped until SIGCONT (then goes on) or the launcher's SIGKILL
    return false;
  }
  if (action == "stall") {
    for (;;)
      std::this_thread::sleep_for(std::chrono::hours(1));
  }
  throw Error(fmt::format("injected fault '{}' on rank {} (DISTMUON_FAULT)", point, rank));
}

void arm_fault(const std::string& spec) {
  State& s = state();
  const std::lock_guard lock(s.mutex);
  s.arm(parse_fault(spec));
  g_watching = s.spec.has_value() || s.recording;
}

void disarm_fault() {
  State& s = state();
  const std::lock_guard lock(s.mutex);
  s.arm(std::nullopt);
  g_watching = s.recording;
}

void record_fault_sites(bool on) {
  State& s = state();
  const std::lock_guard lock(s.mutex);
  s.recording = on;
  if (on) s.sites.clear();
  g_watching = s.spec.has_value() || s.recording;
}

std::vector<std::string> recorded_fault_sites() {
  State& s = state();
  const std::lock_guard lock(s.mutex);
  return s.sites;
}

}  // namespace distmuon::detail
