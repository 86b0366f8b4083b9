// The NCCL communicator's failure verdict (src/comm/nccl/nccl_verdict.h): whom the error names,
// and whether every rank throws the same one. Pure; no NCCL needed.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <string>

#include "comm/nccl/nccl_verdict.h"

namespace distmuon::nccl_detail {
namespace {

using Answers = std::map<int, std::string>;

TEST(NcclVerdict, RanksWithTheirOwnErrorAreNamedFirst) {
  const Answers answers{{0, std::string(1, kStopped) + "rank 0 stopped"},
                        {1, std::string(1, kOwnError) + "unhandled cuda error on rank 1"},
                        {2, std::string(1, kTimedOut) + "rank 2 timed out"},
                        {3, std::string(1, kOwnError) + "remote error on rank 3"}};
  const FailureVerdict v = failure_verdict("all_reduce", answers, 4, 3.0);
  EXPECT_TRUE(v.agreed);
  EXPECT_EQ(v.thrown, v.message);
  EXPECT_NE(v.message.find("all_reduce failed on ranks 1, 3 of the NCCL communicator of 4 ranks: "
                           "unhandled cuda error on rank 1"),
            std::string::npos)
      << v.message;
}

TEST(NcclVerdict, SilentRanksAreNamedWhenNoRankReportedItsOwnError) {
  const Answers answers{{0, std::string(1, kTimedOut) + "t"}, {2, std::string(1, kTimedOut) + "t"}};
  const FailureVerdict v = failure_verdict("all_to_all_v", answers, 4, 3.0);
  EXPECT_FALSE(v.agreed);  // the silent ranks cannot be told
  EXPECT_NE(v.message.find("within 3 s (DISTMUON_NCCL_TIMEOUT): ranks 1, 3 of the NCCL "
                           "communicator of 4 ranks did not answer"),
            std::string::npos)
      << v.message;
}

TEST(NcclVerdict, AnErrorWithSilentRanksNamesBoth) {
  const Answers answers{{0, std::string(1, kOwnError) + "bad"}, {1, std::string(1, kTimedOut)}};
  const FailureVerdict v = failure_verdict("broadcast", answers, 3, 3.0);
  EXPECT_FALSE(v.agreed);
  EXPECT_NE(v.message.find("broadcast failed on rank 0 of the NCCL communicator of 3 ranks: bad"),
            std::string::npos)
      << v.message;
  EXPECT_EQ(v.message.find("did not answer"), std::string::npos) << v.message;
  EXPECT_NE(v.thrown.find("(rank 2 did not answer)"), std::string::npos) << v.thrown;
}

// Every rank's deadline passed and every rank answered: nobody to blame, and the error says so
// (it named an empty list of ranks before).
TEST(NcclVerdict, AStallOnEveryRankNamesNoRank) {
  const Answers answers{{0, std::string(1, kTimedOut)}, {1, std::string(1, kTimedOut)}};
  const FailureVerdict v = failure_verdict("ncclCommInitRankConfig", answers, 2, 3.0);
  EXPECT_TRUE(v.agreed);
  EXPECT_NE(v.message.find("on any rank of the NCCL communicator of 2 ranks, and no rank reported "
                           "an error of its own"),
            std::string::npos)
      << v.message;
  EXPECT_FALSE(std::regex_search(v.message, std::regex("ranks? [0-9]"))) << v.message;
}

}  // namespace
}  // namespace distmuon::nccl_detail
