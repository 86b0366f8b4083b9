#include "distmuon/agreement.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>

#include "distmuon/hash.h"

namespace distmuon {
namespace {

std::string clip(std::string_view s) {
  constexpr std::size_t kMax = 200;
  return s.size() <= kMax ? std::string(s) : fmt::format("{}...", s.substr(0, kMax));
}

// Called on every rank once all_agree said the hashes differ: names the ranks whose hash differs
// from rank 0's, with the first one's detail, and throws on every rank.
[[noreturn]] void throw_difference(const Communicator& group, std::uint64_t hash,
                                   std::string_view what, std::string_view detail) {
  const auto all = group.all_gather<std::int64_t>(std::bit_cast<std::int64_t>(hash));
  std::vector<int> differ;
  for (int r = 1; r < group.size(); ++r)
    if (all[static_cast<std::size_t>(r)] != all[0]) differ.push_back(r);
  DISTMUON_ASSERT(!differ.empty(), "throw_difference without a differing hash");
  const std::string mine = differ.front() == group.rank() ? std::string(detail) : std::string();
  const std::string first = group.broadcast_string(mine, differ.front());
  throw CollectiveError(
      fmt::format("{}: rank(s) {} of {} differ from rank 0{}{}", what, fmt::join(differ, ","),
                  group.size(), first.empty() ? "" : ": ", first),
      group.error_scope());
}

}  // namespace

void agree_or_throw(const Communicator& group, bool ok, std::string_view what,
                    std::string_view reason) {
  const std::int32_t mine = ok ? 0 : 1;
  const std::vector<std::int32_t> flags = group.all_gather(mine);
  std::vector<int> failed;
  for (int r = 0; r < group.size(); ++r)
    if (flags[static_cast<std::size_t>(r)] != 0) failed.push_back(r);
  if (failed.empty()) return;
  const std::string first_reason = group.broadcast_string(std::string(reason), failed.front());
  throw CollectiveError(
      fmt::format("{} failed on rank(s) {} of {}{}{}", what, fmt::join(failed, ","), group.size(),
                  first_reason.empty() ? "" : ": ", first_reason),
      group.error_scope());
}

bool all_agree(const Communicator& group, std::uint64_t hash, bool ok) {
  // max(h), max(~h) = ~min(h) (~ reverses the order of signed integers), any failure.
  const auto h = std::bit_cast<std::int64_t>(hash);
  std::int64_t v[3] = {h, ~h, ok ? 0 : 1};
  group.all_reduce(std::span<std::int64_t>(v), ReduceOp::kMax);
  return v[0] == ~v[1] && v[2] == 0;
}

void agree(const Communicator& group, std::uint64_t hash, std::string_view what,
           std::string_view detail) {
  if (all_agree(group, hash)) return;
  throw_difference(group, hash, what, detail);
}

void agree_on(const Communicator& group, std::string_view value, std::string_view what,
              const ExplainDifference& explain) {
  const std::uint64_t hash = fnv1a64(value.data(), value.size());
  if (all_agree(group, hash)) return;
  const std::string root = group.broadcast_string(std::string(value), 0);
  // Only the ranks whose value differs explain it, and every rank goes on to throw_difference's
  // collectives: an explanation that throws must not leave this rank out of them, so its failure
  // becomes part of the detail.
  std::string detail;
  if (value != root) {
    const std::string both =
        fmt::format("rank 0 has '{}', rank {} has '{}'", clip(root), group.rank(), clip(value));
    if (!explain) {
      detail = both;
    } else {
      try {
        detail = explain(root, value);
      } catch (const std::exception& e) {
        detail = fmt::format("{} (explaining the difference failed: {})", both, e.what());
      } catch (...) {
        detail = fmt::format("{} (explaining the difference failed)", both);
      }
    }
  }
  throw_difference(group, hash, what, detail);
}

std::string explain_json_difference(std::string_view root_text, std::string_view mine_text) {
  const auto root = nlohmann::json::parse(root_text, nullptr, false);
  const auto mine = nlohmann::json::parse(mine_text, nullptr, false);
  if (root.is_discarded() || mine.is_discarded())
    return fmt::format("this rank has {:.200}, rank 0 {:.200}", mine_text, root_text);
  const auto patch = nlohmann::json::diff(root, mine);
  if (patch.empty()) return "the same values, hashed differently";
  const auto path = nlohmann::json::json_pointer(patch[0].at("path").get<std::string>());
  auto at = [&](const nlohmann::json& j) {
    return j.contains(path) ? j.at(path).dump() : std::string("nothing");
  };
  return fmt::format("first difference at {}: rank 0 has {}, this rank has {}", path.to_string(),
                     at(root), at(mine));
}

void run_on_root(const Communicator& group, std::string_view what,
                 const std::function<void()>& act) {
  std::string failure;
  if (group.rank() == 0) {
    try {
      act();
    } catch (const std::exception& e) {
      failure = e.what();
      if (failure.empty()) failure = "an exception without a message";
    } catch (...) {
      failure = "unknown exception";
    }
  }
  // A failure without a message still fails: the flag, not the text, decides.
  agree_or_throw(group, failure.empty(), what, failure);
}

std::vector<std::string> all_gather_strings(const Communicator& group, const std::string& mine) {
  const auto sizes = group.all_gather<std::int64_t>(static_cast<std::int64_t>(mine.size()));
  const auto width = static_cast<std::size_t>(*std::max_element(sizes.begin(), sizes.end()));
  std::vector<char> send(width, '\0'), recv(width * sizes.size());
  std::copy(mine.begin(), mine.end(), send.begin());
  if (width > 0) group.all_gather<char>(send, recv);
  std::vector<std::string> out;
  out.reserve(sizes.size());
  for (std::size_t r = 0; r < sizes.size(); ++r)
    out.emplace_back(recv.data() + r * width, static_cast<std::size_t>(sizes[r]));
  return out;
}

namespace detail {

std::string share_from_root(const Communicator& group, int root, std::string_view what,
                            const std::function<std::string()>& decide, std::size_t fixed_size) {
  if (root < 0 || root >= group.size()) {
    throw Error(
        fmt::format("{}: root {} is not a rank of the group of {}", what, root, group.size()));
  }
  std::string payload;
  bool failed = false;
  if (group.rank() == root) {
    try {
      payload = decide();
      DISTMUON_ASSERT(fixed_size == 0 || payload.size() == fixed_size,
                      "decide_on_root: a value of the wrong size");
    } catch (const std::exception& e) {
      failed = true;
      payload = e.what();
    } catch (...) {
      failed = true;
      payload = "unknown exception";
    }
  }
  if (fixed_size > 0) {
    // One message: a status byte, then the value (or nothing useful when the root failed).
    std::string msg(fixed_size + 1, '\0');
    if (group.rank() == root) {
      msg[0] = failed ? 1 : 0;
      if (!failed) std::copy(payload.begin(), payload.end(), msg.begin() + 1);
    }
    group.broadcast(std::span<char>(msg), root);
    failed = msg[0] != 0;
    payload = failed ? group.broadcast_string(payload, root) : msg.substr(1);
  } else {
    std::int64_t head[2] = {failed ? 1 : 0, static_cast<std::int64_t>(payload.size())};
    group.broadcast(std::span<std::int64_t>(head), root);
    failed = head[0] != 0;
    payload.resize(static_cast<std::size_t>(head[1]));
    if (!payload.empty()) group.broadcast(std::span<char>(payload), root);
  }
  if (failed) {
    throw CollectiveError(
        fmt::format("{} failed on rank {} of {}: {}", what, root, group.size(), payload),
        group.error_scope());
  }
  return payload;
}

}  // namespace detail

void agree_on_tp_grid(const Communicator& tp, const Communicator& gtp, std::uint64_t hash, bool ok,
                      std::string_view what, std::string_view reason) {
  agree_on_tp_grid(tp, gtp, local_communicator(), hash, ok, what, reason);
}

void agree_on_tp_grid(const Communicator& tp, const Communicator& gtp, const Communicator& dp,
                      std::uint64_t hash, bool ok, std::string_view what, std::string_view reason) {
  const int t = tp.size(), g = gtp.size(), d = dp.size();
  bool agreed = ok;
  if (g > 1) agreed = all_agree(gtp, hash, agreed);
  if (t > 1) agreed = all_agree(tp, hash, agreed);
  if (d > 1) agreed = all_agree(dp, hash, agreed);
  if (agreed) return;
  ErrorScope scope = (g > 1 ? gtp : t > 1 ? tp : dp).error_scope();
  scope.size = t * g * d;
  scope.ranks.clear();
  const std::string grid = d > 1 ? fmt::format("{} x {} x {} (TP x GTP x replicas)", t, g, d)
                                 : fmt::format("{} x {} (TP x GTP)", t, g);
  throw CollectiveError(fmt::format("{}: the ranks of a {} grid disagree{}{}", what, grid,
                                    reason.empty() ? "" : "; on this rank: ", reason),
                        std::move(scope));
}

}  // namespace distmuon
