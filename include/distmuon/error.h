#pragma once
// Errors in distmuon:
//  - distmuon::Error: the caller's mistake or a failed external call (MPI, BLAS, file system).
//    The message says what was attempted, with which shapes and on which rank.
//  - distmuon::CollectiveError (an Error): one that the ranks of a group raised together, after
//    agreeing on it (agreement.h: agree_or_throw, agree, ...), with its scope (ErrorScope):
//    which group agreed on it (docs/reliability.md, "Failures and their scope").
//  - DISTMUON_ASSERT: a broken internal invariant (a bug in distmuon). Always checked.

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace distmuon {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The ranks that raised a CollectiveError together: the group whose agreement threw it.
struct ErrorScope {
  // Every rank of the world raised it without communicating (the same check of the same data,
  // e.g. a command line every rank parsed).
  bool every_rank = false;
  int size = 0;            // ranks in the group that agreed (0: not known)
  std::vector<int> ranks;  // their ranks in the world (MPI_COMM_WORLD), when known
  int world_size = 0;      // ranks in that world, when known (0: not known)

  static ErrorScope of_every_rank() {
    ErrorScope scope;
    scope.every_rank = true;
    return scope;
  }
  // The group is the whole world: every rank raised the error, none is left waiting. Not known
  // (a group whose place in the world is not known) counts as a subgroup.
  bool is_world() const { return every_rank || (size > 0 && size == world_size); }
  // "every rank", "the world (4 ranks)", "ranks 1,3 of 4", "a group of 2".
  std::string describe() const;
};

// An error that every rank of a group raised together (see agreement.h), so no
// rank of that group is left waiting. When its scope is the world, a program may end each rank
// normally; when it is a subgroup, the ranks outside it may be waiting for these ranks in a
// collective, and the program must abort the job (the CLI does: apps/distmuon/main.cpp).
class CollectiveError : public Error {
 public:
  CollectiveError(const std::string& what, ErrorScope scope)
      : Error(what), scope_(std::move(scope)) {}
  // A scope not said: treated as a subgroup (is_world() is false).
  explicit CollectiveError(const std::string& what) : Error(what) {}
  const ErrorScope& scope() const { return scope_; }

 private:
  ErrorScope scope_;
};

namespace detail {
[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace distmuon

#define DISTMUON_ASSERT(cond, msg)                                                  \
  do {                                                                              \
    if (!(cond)) ::distmuon::detail::assert_fail(#cond, __FILE__, __LINE__, (msg)); \
  } while (0)
