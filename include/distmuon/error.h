#pragma once
// Errors in distmuon:
//  - distmuon::Error: the caller's mistake or a failed external call (MPI, BLAS, file system).
//    The message says what was attempted, with which shapes and on which rank.
//  - distmuon::CollectiveError (an Error): one that every rank of a group raised together, after
//    agreeing on it (agreement.h, Communicator::agree_or_throw).
//  - DISTMUON_ASSERT: a broken internal invariant (a bug in distmuon). Always checked.

#include <stdexcept>
#include <string>

namespace distmuon {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An error that every rank of a group raised together (see Communicator::agree_or_throw), so no
// rank is left waiting: a program may end each rank normally instead of aborting the job.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace distmuon

#define DISTMUON_ASSERT(cond, msg)                                                  \
  do {                                                                              \
    if (!(cond)) ::distmuon::detail::assert_fail(#cond, __FILE__, __LINE__, (msg)); \
  } while (0)
