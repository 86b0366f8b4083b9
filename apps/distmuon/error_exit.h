#pragma once
// How a program ends a rank after an error (the CLI's main(); tests/apps/scoped_error_program.cpp
// checks it at 4 ranks): one line on stderr, then either this rank ends normally or the job is
// aborted, so that no rank is left waiting in a collective (docs/reliability.md, "Failures and
// their scope").

#include <fmt/format.h>

#include <cstdio>
#include <string>

#include "distmuon/comm.h"
#include "distmuon/error.h"

namespace distmuon::cli {

// One write per message, so that the lines of ranks failing at once do not interleave.
inline void print_error(const std::string& message) {
  const std::string line = fmt::format("distmuon: error{}\n", message);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

// An error agreed over the whole world (every rank raised it): said once, by rank 0, and every
// rank returns 1. Agreed over a subgroup only (a TP or GTP group, a group whose place is not
// known): the ranks outside it may be waiting for this group's ranks in a collective, so each
// rank of the group says it (an abort may kill the others before they print) and aborts the job.
inline int end_after_collective_error(const Communicator& world, const CollectiveError& e) {
  const ErrorScope& scope = e.scope();
  if (scope.is_world() && (scope.every_rank || scope.size == world.size())) {
    if (world.rank() == 0) print_error(fmt::format(": {}", e.what()));
    return 1;
  }
  print_error(fmt::format("{} (agreed by {}, not by every rank: the job is aborted): {}",
                          world.size() > 1 ? fmt::format(" on rank {}", world.rank()) : "",
                          scope.describe(), e.what()));
  if (world.size() > 1) world.abort(1);
  return 1;
}

}  // namespace distmuon::cli
