// The agreement protocols (agreement.h) at 1, 2 and 4 ranks: equal values pass, differing values
// throw CollectiveError on every rank naming the operation and the differing ranks, and a decision
// that throws on the root throws on every rank instead of leaving the others waiting. Each test
// ends with a collective, so a rank left behind would show as a hang (the ctest timeout).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "distmuon/agreement.h"
#include "distmuon/error.h"
#include "test_util.h"

namespace distmuon {
namespace {

using test::world;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Agreement, EqualValuesPass) {
  const Communicator& w = world();
  EXPECT_TRUE(all_agree(w, 42));
  EXPECT_NO_THROW(agree(w, 0xfedcba9876543210ULL, "equal hashes"));
  EXPECT_NO_THROW(agree_on(w, "the same text on every rank", "equal text"));
  EXPECT_NO_THROW(agree_on(w, "", "empty text"));
  EXPECT_EQ(w.all_reduce<std::int32_t>(1), w.size());
}

TEST(Agreement, OneFailingRankIsSeenByAll) {
  const Communicator& w = world();
  EXPECT_EQ(all_agree(w, 7, w.rank() != w.size() - 1), false);
  // Hashes whose signed values straddle zero: min and max are both needed to see them differ.
  if (w.size() > 1) EXPECT_FALSE(all_agree(w, w.rank() == 0 ? ~0ULL : 1ULL));
}

TEST(Agreement, DifferingHashesThrowOnEveryRankNamingTheRanks) {
  const Communicator& w = world();
  if (w.size() == 1) GTEST_SKIP() << "needs two ranks";
  const int odd = w.size() - 1;  // the last rank differs
  try {
    agree(w, w.rank() == odd ? 2 : 1, "loading the plan", w.rank() == odd ? "plan B" : "plan A");
    ADD_FAILURE() << "no throw on rank " << w.rank();
  } catch (const CollectiveError& e) {
    const std::string m = e.what();
    EXPECT_TRUE(contains(m, "loading the plan")) << m;
    EXPECT_TRUE(contains(m, "rank(s) " + std::to_string(odd) + " of")) << m;
    EXPECT_TRUE(contains(m, "plan B")) << m;  // the differing rank's detail, on every rank
  }
  EXPECT_EQ(w.all_reduce<std::int32_t>(1), w.size());
}

TEST(Agreement, DifferingValuesAreExplainedAgainstRankZero) {
  const Communicator& w = world();
  if (w.size() == 1) GTEST_SKIP() << "needs two ranks";
  const std::string mine = w.rank() == 1 ? "lr=0.03" : "lr=0.02";
  try {
    agree_on(w, mine, "options", [&](std::string_view root, std::string_view me) {
      return fmt::format("rank 0 has {}, rank {} has {}", root, w.rank(), me);
    });
    ADD_FAILURE() << "no throw on rank " << w.rank();
  } catch (const CollectiveError& e) {
    EXPECT_TRUE(contains(e.what(), "options: rank(s) 1 of")) << e.what();
    EXPECT_TRUE(contains(e.what(), "rank 0 has lr=0.02, rank 1 has lr=0.03")) << e.what();
  }
  // Without an explanation: both values.
  try {
    agree_on(w, mine, "options");
    ADD_FAILURE() << "no throw on rank " << w.rank();
  } catch (const CollectiveError& e) {
    EXPECT_TRUE(contains(e.what(), "'lr=0.02'") && contains(e.what(), "'lr=0.03'")) << e.what();
  }
  EXPECT_EQ(w.all_reduce<std::int32_t>(1), w.size());
}

// The explanation runs only on the ranks that differ, before the collectives that name them: one
// that throws there (a bug, a parse error) must not leave rank 0 waiting in them. Every rank
// throws CollectiveError with both values and the explanation's failure.
TEST(Agreement, AnExplanationThatThrowsStillEndsEveryRank) {
  const Communicator& w = world();
  if (w.size() == 1) GTEST_SKIP() << "needs two ranks";
  const std::string mine = w.rank() == 0 ? "lr=0.02" : fmt::format("lr=0.0{}", 2 + w.rank());
  for (const bool standard : {true, false}) {
    try {
      agree_on(w, mine, "options", [&](std::string_view, std::string_view) -> std::string {
        if (standard) throw Error("cannot explain this");
        throw 7;  // not a std::exception
      });
      ADD_FAILURE() << "no throw on rank " << w.rank();
    } catch (const CollectiveError& e) {
      EXPECT_TRUE(contains(e.what(), "options: rank(s) 1")) << e.what();
      EXPECT_TRUE(contains(e.what(), "rank 0 has 'lr=0.02', rank 1 has 'lr=0.03'")) << e.what();
      EXPECT_TRUE(contains(e.what(), standard
                                         ? "(explaining the difference failed: cannot explain this)"
                                         : "(explaining the difference failed)"))
          << e.what();
    }
  }
  EXPECT_EQ(w.all_reduce<std::int32_t>(1), w.size());
}

TEST(Agreement, DecideOnRootSharesTheRootsValue) {
  const Communicator& w = world();
  const int root = w.size() - 1;
  int runs = 0;
  // A single value: the root's, whatever the others would have decided.
  const auto code = decide_on_root<std::int64_t>(w, root, "code", [&] {
    ++runs;
    return std::int64_t{100 + w.rank()};
  });
  EXPECT_EQ(code, 100 + root);
  // A vector (empty too) and a JSON string.
  const auto codes = decide_on_root<std::vector<std::int64_t>>(w, root, "codes", [&] {
    ++runs;
    return std::vector<std::int64_t>{w.rank(), -1, 1LL << 40};
  });
  EXPECT_EQ(codes, (std::vector<std::int64_t>{root, -1, 1LL << 40}));
  EXPECT_TRUE((decide_on_root<std::vector<double>>(w, 0, "none", [] {
                 return std::vector<double>{};
               }).empty()));
  const std::string text = decide_on_root<std::string>(w, 0, "plan", [&] {
    return nlohmann::json{{"rank", w.rank()}, {"mode", "owner"}}.dump();
  });
  EXPECT_EQ(nlohmann::json::parse(text), (nlohmann::json{{"rank", 0}, {"mode", "owner"}}));
  EXPECT_EQ(runs, w.rank() == root ? 2 : 0);  // decide runs on the root only
}

TEST(Agreement, DecideThrowingOnRootThrowsOnEveryRank) {
  const Communicator& w = world();
  const int root = w.size() - 1;
  for (const bool single : {true, false}) {
    try {
      if (single) {
        decide_on_root<std::int64_t>(w, root, "resolving the mode", []() -> std::int64_t {
          throw Error("no such profile 'h900'");
        });
      } else {
        decide_on_root<std::string>(w, root, "resolving the mode",
                                    []() -> std::string { throw Error("no such profile 'h900'"); });
      }
      ADD_FAILURE() << "no throw on rank " << w.rank();
    } catch (const CollectiveError& e) {
      EXPECT_TRUE(contains(e.what(), "resolving the mode failed on rank " + std::to_string(root)))
          << e.what();
      EXPECT_TRUE(contains(e.what(), "no such profile 'h900'")) << e.what();
    }
  }
  EXPECT_THROW(decide_on_root<int>(w, w.size(), "bad root", [] { return 1; }), Error);
  EXPECT_EQ(w.all_reduce<std::int32_t>(1), w.size());
}

TEST(Agreement, RunOnRootRunsOnRankZeroOnly) {
  const Communicator& w = world();
  int runs = 0;
  EXPECT_NO_THROW(run_on_root(w, "creating the folder", [&] { ++runs; }));
  EXPECT_EQ(runs, w.rank() == 0 ? 1 : 0);
  EXPECT_EQ(w.all_reduce<std::int32_t>(runs), 1);
}

TEST(Agreement, RunOnRootFailureThrowsOnEveryRankWithTheGroupsScope) {
  const Communicator& w = world();
  try {
    run_on_root(w, "creating the folder", [] { throw Error("cannot create '/nope': denied"); });
    ADD_FAILURE() << "no throw on rank " << w.rank();
  } catch (const CollectiveError& e) {
    EXPECT_TRUE(contains(e.what(), fmt::format("creating the folder failed on rank(s) 0 of {}: "
                                               "cannot create '/nope': denied",
                                               w.size())))
        << e.what();
    EXPECT_TRUE(e.scope().is_world()) << e.scope().describe();
    EXPECT_EQ(e.scope().size, w.size());
  }
  // An exception without a message, or of no std::exception type, still fails every rank.
  EXPECT_THROW(run_on_root(w, "empty", [] { throw Error(""); }), CollectiveError);
  EXPECT_THROW(run_on_root(w, "not an exception", [] { throw 7; }), CollectiveError);
  EXPECT_EQ(w.all_reduce<std::int32_t>(1), w.size());
}

TEST(Agreement, RunOnRootOfASubgroupNamesItsRanks) {
  const Communicator& w = world();
  if (w.size() == 1) GTEST_SKIP() << "needs two ranks";
  // Odd and even ranks: rank 0 of the odd group is world rank 1, and it fails.
  const Communicator sub = w.split(w.rank() % 2, w.rank());
  const bool odd = w.rank() % 2 == 1;
  std::vector<int> members;
  for (int r = w.rank() % 2; r < w.size(); r += 2)
    members.push_back(r);
  try {
    run_on_root(sub, "writing the group's file", [&] {
      if (odd) throw Error("disk full");
    });
    EXPECT_FALSE(odd) << "no throw on rank " << w.rank();
  } catch (const CollectiveError& e) {
    EXPECT_TRUE(odd) << e.what();
    EXPECT_TRUE(contains(e.what(), fmt::format("writing the group's file failed on rank(s) 0 of "
                                               "{}: disk full",
                                               sub.size())))
        << e.what();
    EXPECT_EQ(e.scope().ranks, members);
    EXPECT_EQ(e.scope().is_world(), sub.size() == w.size());
  }
  EXPECT_EQ(w.all_reduce<std::int32_t>(1), w.size());
}

TEST(Agreement, AllGatherStringsReturnsEveryRanksStringInRankOrder) {
  const Communicator& w = world();
  // Different lengths, the empty string (rank 1) and an embedded NUL.
  std::string mine = w.rank() == 1 ? std::string() : std::string(3 * w.rank() + 1, 'a' + w.rank());
  if (w.rank() == 2) mine += std::string("\0z", 2);
  const std::vector<std::string> all = all_gather_strings(w, mine);
  ASSERT_EQ(all.size(), static_cast<std::size_t>(w.size()));
  for (int r = 0; r < w.size(); ++r) {
    std::string want = r == 1 ? std::string() : std::string(3 * r + 1, 'a' + r);
    if (r == 2) want += std::string("\0z", 2);
    EXPECT_EQ(all[static_cast<std::size_t>(r)], want) << "rank " << r;
  }
  EXPECT_EQ(all_gather_strings(w, ""), std::vector<std::string>(w.size()));
}

// A T x G grid of the world (T = 2 when it has an even size > 1): tp = the ranks with the same
// g = rank / T, gtp = the ranks with the same t = rank % T. A difference on one rank (its hash,
// or its own check with a reason) ends every rank of the grid, whichever row and column it is in.
TEST(Agreement, TpGridAgreementReachesEveryRankOfTheGrid) {
  const Communicator& w = world();
  const int T = w.size() % 2 == 0 ? 2 : 1, G = w.size() / T;
  const Communicator tp = T > 1 ? w.split(w.rank() / T, w.rank()) : local_communicator();
  const Communicator gtp = G > 1 ? w.split(w.rank() % T, w.rank()) : local_communicator();
  EXPECT_NO_THROW(agree_on_tp_grid(tp, gtp, 42, true, "equal"));
  const int odd = w.size() - 1;
  for (const bool by_hash : {true, false}) {
    if (by_hash && w.size() == 1) continue;  // one rank's hash agrees with itself
    try {
      agree_on_tp_grid(tp, gtp, by_hash && w.rank() == odd ? 7 : 42, by_hash || w.rank() != odd,
                       "the bucket", w.rank() == odd ? "my own check failed" : "");
      ADD_FAILURE() << "no throw on rank " << w.rank();
    } catch (const CollectiveError& e) {
      const std::string m = e.what();
      EXPECT_TRUE(contains(m, fmt::format("the bucket: the ranks of a {} x {} (TP x GTP) grid "
                                          "disagree",
                                          T, G)))
          << m;
      EXPECT_EQ(contains(m, "on this rank: my own check failed"), w.rank() == odd) << m;
      EXPECT_EQ(e.scope().size, w.size());
    }
  }
  EXPECT_EQ(w.all_reduce<std::int32_t>(1), w.size());
}

}  // namespace
}  // namespace distmuon
