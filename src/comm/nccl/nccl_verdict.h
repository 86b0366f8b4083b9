#pragma once
// The NCCL communicator's failure verdict (nccl_comm.cpp's failure protocol): from the notices
// the ranks posted before the grace period ended, which ranks to name and whether every rank
// throws the same error. Pure; built in every build, so that it is tested without NCCL.
#include <map>
#include <string>
#include <string_view>

namespace distmuon::nccl_detail {

// A notice's first character: the rank's own error, its deadline passed, or it stopped because
// of a peer's notice. The rest is the rank's own text.
inline constexpr char kOwnError = 'E', kTimedOut = 'T', kStopped = 'S';

struct FailureVerdict {
  std::string message;  // what every later operation of the communicator throws
  std::string thrown;   // what this rank throws now (message, naming the silent ranks too)
  bool agreed = false;  // every rank answered, so every rank throws message (a CollectiveError)
};

// answers: the notices by communicator rank (this rank's own included); size: the communicator's
// ranks. Names the ranks that reported their own error, else those that did not answer (stalled
// or ended), else says that the operation stalled on every rank.
FailureVerdict failure_verdict(std::string_view op, const std::map<int, std::string>& answers,
                               int size, double timeout_s);

}  // namespace distmuon::nccl_detail
