#pragma once
// Errors of a command's setup, raised so that main() ends each rank normally instead of aborting
// the job.
//
//  - resolve_on_every_rank: a pure function of the command line (every rank of an mpirun job
//    parses the same one), so a mistake in it is found by every rank at the same point, before
//    any collective; its errors are raised as CollectiveError without any communication.
//  - check_on_every_rank: a check whose outcome may differ between ranks (this rank's memory, a
//    file this rank reads); every rank runs it and an agreement (agree_or_throw) turns a failure
//    on any rank into CollectiveError on every rank, with the first failing rank's reason.

#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "distmuon/agreement.h"
#include "distmuon/comm.h"
#include "distmuon/error.h"

namespace distmuon::cli {

template <typename F>
auto resolve_on_every_rank(F&& resolve) {
  try {
    return std::forward<F>(resolve)();
  } catch (const CollectiveError&) {
    throw;
  } catch (const Error& e) {
    throw CollectiveError(e.what(), ErrorScope::of_every_rank());
  }
}

// Collective: every rank of world calls it. Returns check()'s result on every rank, or throws
// CollectiveError "<what> failed on rank(s) ... : <reason>" on every rank when it threw on any.
template <typename F>
auto check_on_every_rank(const Communicator& world, const std::string& what, F&& check) {
  using T = std::invoke_result_t<F>;
  std::string why;
  if constexpr (std::is_void_v<T>) {
    try {
      std::forward<F>(check)();
    } catch (const std::exception& e) {
      why = e.what();
    }
    agree_or_throw(world, why.empty(), what, why);
  } else {
    std::optional<T> out;
    try {
      out.emplace(std::forward<F>(check)());
    } catch (const std::exception& e) {
      why = e.what();
    }
    agree_or_throw(world, why.empty(), what, why);
    return std::move(*out);
  }
}

}  // namespace distmuon::cli
