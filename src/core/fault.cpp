// DISTMUON_FAULT: fault injection at named points (format in fault.h).
#include "core/fault.h"

#include <fmt/format.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "distmuon/error.h"

namespace distmuon::detail {
namespace {

constexpr const char* kPoints[] = {"optim-step", "checkpoint-between-files", "collective",
                                   "file-write", "measure-reset"};

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

// RANK:POINT[:ACTION[:N]]; nullopt without the variable.
std::optional<FaultSpec> parse_fault(const char* text) {
  if (text == nullptr || *text == '\0') return std::nullopt;
  const std::string s(text);
  const auto bad = [&](const std::string& why) {
    return Error(fmt::format(
        "DISTMUON_FAULT='{}': {} (expected RANK:POINT[:throw|exit|kill|oom[:N]])", s, why));
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
  bool known = false;
  for (const char* p : kPoints)
    known = known || f.point == p;
  if (!known)
    throw bad(
        "unknown POINT (optim-step, checkpoint-between-files, collective, file-write, "
        "measure-reset)");
  if (parts.size() > 2) f.action = parts[2];
  if (f.action != "throw" && f.action != "exit" && f.action != "kill" && f.action != "oom")
    throw bad("unknown ACTION");
  if (parts.size() > 3) {
    f.nth = std::strtol(parts[3].c_str(), &end, 10);
    if (parts[3].empty() || *end != '\0' || f.nth < 1) throw bad("N is not a positive count");
  }
  return f;
}

}  // namespace

void fault_point(const char* point) {
  static const std::optional<FaultSpec> spec = [] {
    std::optional<FaultSpec> f = parse_fault(std::getenv("DISTMUON_FAULT"));
    if (f && f->rank != env_rank()) f.reset();
    return f;
  }();
  static std::atomic<long> reached{0};
  if (!spec || spec->point != point) return;
  if (reached.fetch_add(1) + 1 != spec->nth) return;
  const int rank = env_rank();
  std::fprintf(stderr, "distmuon: injected fault '%s' (%s) on rank %d\n", point,
               spec->action.c_str(), rank);
  std::fflush(stderr);
  if (spec->action == "exit") std::_Exit(kFaultExitCode);
  if (spec->action == "kill") std::raise(SIGKILL);
  if (spec->action == "oom") throw std::bad_alloc();
  throw Error(fmt::format("injected fault '{}' on rank {} (DISTMUON_FAULT)", point, rank));
}

}  // namespace distmuon::detail
