#pragma once
// Every rank of an mpirun job parses the same command line, so a mistake in it is found by every
// rank at the same point, before any collective: such errors are raised as CollectiveError, and
// main() ends each rank normally instead of aborting the job.

#include <utility>

#include "distmuon/error.h"

namespace distmuon::cli {

template <typename F>
auto resolve_on_every_rank(F&& resolve) {
  try {
    return std::forward<F>(resolve)();
  } catch (const CollectiveError&) {
    throw;
  } catch (const Error& e) {
    throw CollectiveError(e.what());
  }
}

}  // namespace distmuon::cli
