// The step gate and the step deadline (agreement.h: pass_step_gate, step_timeout_seconds).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "distmuon/agreement.h"
#include "distmuon/error.h"

namespace distmuon {
namespace {

using Clock = std::chrono::steady_clock;

// Between two polls of the gate's messages: for the first milliseconds a yield (as OpenMPI's own
// blocking calls poll when oversubscribed: a sleep would add a timer's wake-up to every step),
// then sleeps growing to 1 ms, so that a rank waiting for a stopped one leaves its core alone.
class Backoff {
 public:
  void wait() {
    const auto waited = Clock::now() - start_;
    if (waited < std::chrono::milliseconds(1)) return;  // spin: the answer is usually this close
    if (waited < std::chrono::milliseconds(5)) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(2 * sleep_, std::chrono::microseconds(1000));
  }

 private:
  Clock::time_point start_ = Clock::now();
  std::chrono::microseconds sleep_{50};
};

// A gate message: a kind (A: a rank arrived; G: go; L: the late ranks; D: the ranks at another
// step), the step, and the ranks it names.
struct GateMessage {
  char kind = 0;
  std::int64_t step = 0;
  std::string ranks;  // "1,3" (L) or "1:4,3:4" (D: rank:step)
};

std::string encode(const GateMessage& m) {
  return fmt::format("{} {} {}", m.kind, m.step, m.ranks);
}

GateMessage decode(const std::string& text, int from) {
  GateMessage m;
  char* end = nullptr;
  if (text.size() >= 3 && text[1] == ' ') {
    m.kind = text[0];
    m.step = std::strtoll(text.c_str() + 2, &end, 10);
  }
  if (end == nullptr || *end != ' ' || std::string_view("AGLD").find(m.kind) == std::string::npos)
    throw Error(fmt::format("step gate: an unexpected message from rank {}", from));
  m.ranks = std::string(end + 1);
  return m;
}

std::string late_message(int size, const std::string& ranks, bool several, std::string_view what,
                         std::int64_t step, double timeout_s, double waited_s) {
  return fmt::format(
      "rank{} {} of {} did not reach {} {} within {:g} s (the step deadline: step_timeout, "
      "DISTMUON_STEP_TIMEOUT{}): {} stopped or stuck",
      several ? "s" : "", ranks, size, what, step, timeout_s,
      waited_s > timeout_s ? fmt::format("; this rank waited {:g} s for rank 0", waited_s) : "",
      several ? "they are" : "it is");
}

// Rank 0: waits for every rank's arrival until the deadline, then answers every other rank.
void gather_gate(const Communicator& group, std::int64_t step, double timeout_s,
                 std::string_view what) {
  CommImpl& c = group.impl();
  const int size = group.size();
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  std::vector<char> arrived(static_cast<std::size_t>(size), 0);
  arrived[0] = 1;
  int count = 1;
  std::vector<std::string> differ;
  Backoff backoff;
  for (;;) {
    for (int q = 1; q < size; ++q) {
      if (arrived[static_cast<std::size_t>(q)]) continue;
      if (const auto text = c.poll_gate(q)) {
        const GateMessage m = decode(*text, q);
        if (m.kind != 'A')
          throw Error(fmt::format("step gate: an unexpected message from rank {}", q));
        arrived[static_cast<std::size_t>(q)] = 1;
        ++count;
        if (m.step != step) differ.push_back(fmt::format("{}:{}", q, m.step));
      }
    }
    if (count == size || Clock::now() >= deadline) break;
    backoff.wait();
  }
  std::vector<int> late;
  for (int q = 1; q < size; ++q)
    if (!arrived[static_cast<std::size_t>(q)]) late.push_back(q);
  GateMessage answer{'G', step, {}};
  if (!late.empty())
    answer = {'L', step, fmt::format("{}", fmt::join(late, ","))};
  else if (!differ.empty())
    answer = {'D', step, fmt::format("{}", fmt::join(differ, ","))};
  const std::string text = encode(answer);
  for (int q = 1; q < size; ++q)  // the late ranks too: they read it if they ever arrive
    c.post_gate(q, text);
  if (answer.kind == 'L') {
    throw Error(late_message(size, answer.ranks, late.size() > 1, what, step, timeout_s, 0));
  }
  if (answer.kind == 'D') {
    throw CollectiveError(fmt::format("{} {}: the ranks are at different steps (rank:step {})",
                                      what, step, answer.ranks),
                          group.error_scope());
  }
}

// Any other rank: posts its arrival, waits for rank 0's answer.
void wait_at_gate(const Communicator& group, std::int64_t step, double timeout_s,
                  std::string_view what) {
  CommImpl& c = group.impl();
  c.post_gate(0, encode({'A', step, {}}));
  const auto start = Clock::now();
  const double wait_s = 2 * timeout_s;  // rank 0 may arrive timeout_s late, then waits timeout_s
  const auto deadline = start + std::chrono::duration<double>(wait_s);
  Backoff backoff;
  for (;;) {
    if (const auto text = c.poll_gate(0)) {
      const GateMessage m = decode(*text, 0);
      if (m.kind == 'G' && m.step == step) return;
      // L and D name rank 0's step (this rank's may be another: D).
      if (m.kind == 'L') {
        throw Error(late_message(group.size(), m.ranks, m.ranks.find(',') != std::string::npos,
                                 what, m.step, timeout_s, 0));
      }
      if (m.kind == 'D') {
        throw CollectiveError(fmt::format("{} {}: the ranks are at different steps (rank:step {})",
                                          what, m.step, m.ranks),
                              group.error_scope());
      }
      throw Error(fmt::format("step gate: rank 0 answered for {} {}, this rank is at {} {}", what,
                              m.step, what, step));
    }
    if (Clock::now() >= deadline) {
      throw Error(late_message(group.size(), "0", false, what, step, timeout_s, wait_s));
    }
    backoff.wait();
  }
}

}  // namespace

void pass_step_gate(const Communicator& group, std::int64_t step, double timeout_s,
                    std::string_view what) {
  if (!(timeout_s > 0) || group.size() == 1) return;
  if (!group.impl().has_gate()) group.impl().post_gate(0, {});  // throws: names the backend
  if (group.rank() == 0) {
    gather_gate(group, step, timeout_s, what);
  } else {
    wait_at_gate(group, step, timeout_s, what);
  }
}

double step_timeout_seconds(double option) {
  if (option > 0) return option;
  const char* env = std::getenv("DISTMUON_STEP_TIMEOUT");
  if (env == nullptr || *env == '\0') return 0;
  char* end = nullptr;
  const double v = std::strtod(env, &end);
  if (end == env || *end != '\0' || !std::isfinite(v) || v < 0 || v > kMaxStepTimeout) {
    throw Error(
        fmt::format("DISTMUON_STEP_TIMEOUT='{}': expected a number of seconds from 0 (no step "
                    "deadline) to {:g}",
                    env, kMaxStepTimeout));
  }
  return v;
}

}  // namespace distmuon
