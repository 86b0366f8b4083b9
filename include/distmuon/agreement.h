#pragma once
// Agreement across the ranks of a group: the protocols that keep the ranks of a group running the
// same collectives and turn an error on some ranks into an error on all. The only agreement layer
// of distmuon: every other file agrees through these functions.
//
//  - agree_or_throw: every rank passes a rank-local flag (its own checks passed); when any rank
//    fails, every rank throws CollectiveError naming the failing ranks and the first one's reason.
//  - agree / agree_on: every rank passes a value (or its hash); when the ranks differ, every rank
//    throws CollectiveError naming the operation, the ranks that differ from rank 0 and how.
//  - decide_on_root: one rank decides (runs a function), every rank receives its decision; an
//    exception thrown by the function on the root is thrown, as CollectiveError carrying the
//    root's message, on every rank.
//  - run_on_root: rank 0 acts (writes a file, creates a folder), every rank learns whether it
//    succeeded; a failure on rank 0 is thrown, as CollectiveError, on every rank. For an action
//    whose result the other ranks need, use decide_on_root.
//  - all_gather_strings: every rank's string, in rank order.
//  - pass_step_gate: every rank reaches step N within a deadline, or the ranks that did name the
//    ones that did not (the step deadline: a rank stopped or stuck for good ends the job).
// Every function here is collective: every rank of the group calls it, with the same root.
// The messages travel on the group's communicator (the control plane: hashes and decisions).

#include <concepts>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "distmuon/comm.h"
#include "distmuon/error.h"

namespace distmuon {

// Throws CollectiveError on every rank, scoped to the group (error_scope), when any rank passes
// ok == false: "<what> failed on rank(s) 1,3 of 4: <reason of rank 1>" (": <reason>" only when
// the first failing rank gave one). One all-gather of a flag, and the reason's broadcast when a
// rank failed.
void agree_or_throw(const Communicator& group, bool ok, std::string_view what,
                    std::string_view reason = {});

// True on every rank when every rank passes the same hash and ok == true (ok: this rank's own
// checks passed). Never throws for a mismatch. One all-reduce of three 64-bit integers.
bool all_agree(const Communicator& group, std::uint64_t hash, bool ok = true);

// Throws CollectiveError on every rank when the hashes differ:
// "<what>: rank(s) 1,3 of 4 differ from rank 0: <detail of rank 1>" (detail: what this rank has).
void agree(const Communicator& group, std::uint64_t hash, std::string_view what,
           std::string_view detail = {});

// How this rank's value (mine) differs from rank 0's (root), for the error message. It runs only
// on the ranks whose value differs, so it must be local: no collective (it would wait for ranks
// that never call it). An exception it throws is caught: the message then holds both values and
// that exception's text, and every rank still throws CollectiveError.
using ExplainDifference = std::function<std::string(std::string_view root, std::string_view mine)>;

// An ExplainDifference for JSON texts: the first path at which they differ and both values there.
std::string explain_json_difference(std::string_view root, std::string_view mine);

// agree() on the FNV-1a 64 hash (hash.h) of value. Only when the ranks differ, rank 0's value is
// broadcast and explain(root, mine) on the first differing rank names the difference (default:
// both values, cut to 200 characters each).
void agree_on(const Communicator& group, std::string_view value, std::string_view what,
              const ExplainDifference& explain = {});

// Runs act() on rank 0 of the group only, then agrees on its success (agree_or_throw): when act
// throws, every rank throws CollectiveError "<what> failed on rank(s) 0 of <size>: <message>"
// with the group's scope (error_scope). Nothing else travels: one all-gather of a flag, and the
// message's broadcast when rank 0 failed.
void run_on_root(const Communicator& group, std::string_view what,
                 const std::function<void()>& act);

// Every rank's string (of any length, the empty one included), in rank order, on every rank.
// Two all-gathers: the lengths, then the strings padded to the longest.
std::vector<std::string> all_gather_strings(const Communicator& group, const std::string& mine);

// The step gate (docs/reliability.md, "The step deadline"): every rank of the group calls it at
// the start of the same step; it returns once every rank has reached it. timeout_s <= 0 or a
// group of one: returns at once, nothing sent. MPI blocking collectives have no deadline, so the
// gate is built from point-to-point messages polled against one (CommImpl::post_gate): each rank
// posts its arrival to rank 0; rank 0 waits up to timeout_s seconds for every rank, then answers
// every other rank "go" or the list of ranks that did not arrive. A rank other than 0 waits up to
// 2 x timeout_s for that answer (rank 0 may arrive up to timeout_s after it, then waits
// timeout_s itself), so when rank 0 is the late one the others name it. On a deadline every rank
// that waited throws distmuon::Error (rank-local on purpose: the ranks that did not arrive cannot
// agree; a program ends the job, as the CLI does with MPI_Abort):
//   "rank 1 of 4 did not reach optimizer step 5 within 2 s (the step deadline, step_timeout /
//   DISTMUON_STEP_TIMEOUT): it is stopped or stuck"
// Ranks at different steps throw CollectiveError on every rank naming them. `what` names the
// step ("optimizer step"); `step` is its number, equal on every rank. Cost when every rank
// arrives: size - 1 messages to rank 0 and size - 1 answers, polled as MPI polls (yielding the
// core), then every millisecond while a rank waits for a late one.
// Throws distmuon::Error before sending anything when the communicator has no gate channel.
void pass_step_gate(const Communicator& group, std::int64_t step, double timeout_s,
                    std::string_view what);

// The step deadline in seconds that `option` (a step_timeout option, 0: unset) asks for: the
// option when it is > 0, else DISTMUON_STEP_TIMEOUT when set (a number of seconds >= 0), else 0
// (no deadline). Throws distmuon::Error naming the variable for a value that is not such a number.
double step_timeout_seconds(double option);
// The longest step deadline accepted (a week, in seconds).
inline constexpr double kMaxStepTimeout = 7 * 24 * 3600.0;

namespace detail {

template <class T>
struct IsByteVector : std::false_type {};
template <class U, class A>
struct IsByteVector<std::vector<U, A>> : std::bool_constant<std::is_trivially_copyable_v<U>> {};

// Runs decide() on root only and returns its bytes on every rank. fixed_size > 0: the payload
// always holds that many bytes and travels with the status in one broadcast; 0: a broadcast of
// (status, length), then the payload. When decide throws on root, its message travels instead
// and every rank throws CollectiveError "<what> failed on rank <root> of <size>: <message>".
std::string share_from_root(const Communicator& group, int root, std::string_view what,
                            const std::function<std::string()>& decide, std::size_t fixed_size);

}  // namespace detail

// What decide_on_root shares: a string (text, JSON), a vector of trivially copyable elements, or
// one trivially copyable value (sent as its bytes: every rank runs the same build).
template <class T>
concept Shareable = std::same_as<T, std::string> || detail::IsByteVector<T>::value ||
    (std::is_trivially_copyable_v<T> && !std::is_pointer_v<T>);

// Runs decide() on root only and returns its result on every rank of the group. A string or a
// vector costs two broadcasts (length, payload), a single value one. If decide throws on root,
// every rank throws CollectiveError naming `what`, the root and its message: no rank is left
// waiting.
template <Shareable T, std::invocable F>
requires std::convertible_to<std::invoke_result_t<F>, T> T decide_on_root(const Communicator& group,
                                                                          int root,
                                                                          std::string_view what,
                                                                          F&& decide) {
  constexpr bool single = !std::same_as<T, std::string> && !detail::IsByteVector<T>::value;
  const std::string bytes = detail::share_from_root(
      group, root, what,
      [&]() -> std::string {
        const T v = decide();
        if constexpr (std::same_as<T, std::string>) {
          return v;
        } else if constexpr (single) {
          return std::string(reinterpret_cast<const char*>(&v), sizeof(T));
        } else {
          return std::string(reinterpret_cast<const char*>(v.data()),
                             v.size() * sizeof(typename T::value_type));
        }
      },
      single ? sizeof(T) : 0);
  if constexpr (std::same_as<T, std::string>) {
    return bytes;
  } else if constexpr (single) {
    T v;
    std::memcpy(&v, bytes.data(), sizeof(T));
    return v;
  } else {
    using U = typename T::value_type;
    DISTMUON_ASSERT(bytes.size() % sizeof(U) == 0, "decide_on_root: a partial element");
    T v(bytes.size() / sizeof(U));
    if (!v.empty()) std::memcpy(v.data(), bytes.data(), bytes.size());
    return v;
  }
}

// Agreement over a TP x GTP grid of ranks (a weight's T x G ranks, which no single group holds),
// given this rank's two groups of it: tp (the T ranks with its GTP index) and gtp (the G ranks
// with its TP index); a dimension of one rank is a group of one (local_communicator()). Passes on
// every rank of the grid when every rank passes the same hash and ok == true (ok: this rank's
// own checks passed), else throws CollectiveError on every rank of the grid:
// "<what>: the ranks of a <T> x <G> (TP x GTP) grid disagree[; on this rank: <reason>]", scoped to
// the grid's T x G ranks (which world ranks they are is not known on one rank). Two all_agree
// rounds, over gtp then over tp with the first round's outcome folded into ok, so that a
// difference within any column reaches every rank; a group of one costs nothing.
void agree_on_tp_grid(const Communicator& tp, const Communicator& gtp, std::uint64_t hash, bool ok,
                      std::string_view what, std::string_view reason = {});
// The same over a TP x GTP grid repeated over D replicas (dp: the D ranks at this rank's
// position, one per replica): a third all_agree round over dp, after the grid's two, carries
// every replica's outcome and hash to every position. "... of a T x G x D (TP x GTP x replicas)
// grid disagree ...".
void agree_on_tp_grid(const Communicator& tp, const Communicator& gtp, const Communicator& dp,
                      std::uint64_t hash, bool ok, std::string_view what,
                      std::string_view reason = {});

}  // namespace distmuon
