// The NCCL communicator's failure verdict (nccl_verdict.h).
#include "comm/nccl/nccl_verdict.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <vector>

namespace distmuon::nccl_detail {

FailureVerdict failure_verdict(std::string_view op, const std::map<int, std::string>& answers,
                               int size, double timeout_s) {
  std::vector<int> errors, missing;
  std::string first_error;
  for (int q = 0; q < size; ++q) {
    const auto it = answers.find(q);
    if (it == answers.end()) {
      missing.push_back(q);
    } else if (!it->second.empty() && it->second[0] == kOwnError) {
      if (errors.empty()) first_error = it->second.substr(1);
      errors.push_back(q);
    }
  }
  const auto ranks = [](const std::vector<int>& r) {
    return fmt::format("rank{} {}", r.size() > 1 ? "s" : "", fmt::join(r, ", "));
  };
  const std::string where = fmt::format("NCCL communicator of {} ranks", size);
  FailureVerdict v;
  if (!errors.empty()) {
    v.message = fmt::format(
        "nccl: {} failed on {} of the {}: {}; the communicator was aborted on "
        "every rank",
        op, ranks(errors), where, first_error);
  } else if (!missing.empty()) {
    v.message = fmt::format(
        "nccl: {} did not complete within {} s (DISTMUON_NCCL_TIMEOUT): {} of the {} did not "
        "answer (stalled or ended); the communicator was aborted",
        op, timeout_s, ranks(missing), where);
  } else {  // every rank answered, none with an error of its own: all of them waited
    v.message = fmt::format(
        "nccl: {} did not complete within {} s (DISTMUON_NCCL_TIMEOUT) on any rank of the {}, and "
        "no rank reported an error of its own (the operation stalled on every rank); the "
        "communicator was aborted",
        op, timeout_s, where);
  }
  v.agreed = missing.empty();
  v.thrown = !errors.empty() && !missing.empty()
                 ? fmt::format("{} ({} did not answer)", v.message, ranks(missing))
                 : v.message;
  return v;
}

}  // namespace distmuon::nccl_detail
