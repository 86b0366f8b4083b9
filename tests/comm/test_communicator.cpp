// Communicator collectives on the test's world (MPI under mpirun, else local), the local backend,
// the counting decorator and error handling. Every expected value is computed from the ranks.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "distmuon/agreement.h"
#include "distmuon/comm.h"
#include "distmuon/error.h"
#include "test_util.h"

namespace distmuon {
namespace {

using test::world;

TEST(Communicator, AllGatherOfChunksAndScalars) {
  const Communicator& w = world();
  const int g = w.size();
  constexpr std::size_t kCount = 3;
  std::vector<float> send(kCount);
  for (std::size_t i = 0; i < kCount; ++i)
    send[i] = static_cast<float>(10 * w.rank() + static_cast<int>(i));
  std::vector<float> recv(kCount * static_cast<std::size_t>(g), -1.0f);
  w.all_gather<float>(send, recv);
  for (int r = 0; r < g; ++r)
    for (std::size_t i = 0; i < kCount; ++i)
      EXPECT_EQ(recv[static_cast<std::size_t>(r) * kCount + i],
                static_cast<float>(10 * r + static_cast<int>(i)));

  const std::vector<std::int64_t> ranks = w.all_gather<std::int64_t>(100 + w.rank());
  ASSERT_EQ(ranks.size(), static_cast<std::size_t>(g));
  for (int r = 0; r < g; ++r)
    EXPECT_EQ(ranks[static_cast<std::size_t>(r)], 100 + r);
}

TEST(Communicator, AllGatherChecksBufferSizes) {
  const Communicator& w = world();
  std::vector<double> send(2), recv(2 * static_cast<std::size_t>(w.size()) + 1);
  // Checked before any communication, identically on every rank: no rank is left waiting.
  EXPECT_THROW(w.all_gather<double>(send, recv), Error);
}

template <typename T>
void check_all_reduce(const Communicator& w) {
  const int g = w.size();
  // Small integers (and halves) are exact in every type, so the sums are exact.
  std::vector<T> buf = {static_cast<T>(w.rank() + 1), static_cast<T>(-2 * w.rank()),
                        static_cast<T>(7)};
  w.all_reduce<T>(buf, ReduceOp::kSum);
  EXPECT_EQ(buf[0], static_cast<T>(g * (g + 1) / 2));
  EXPECT_EQ(buf[1], static_cast<T>(-g * (g - 1)));
  EXPECT_EQ(buf[2], static_cast<T>(7 * g));
  EXPECT_EQ(w.all_reduce<T>(static_cast<T>(w.rank() * 3), ReduceOp::kMax),
            static_cast<T>((g - 1) * 3));
  EXPECT_EQ(w.all_reduce<T>(static_cast<T>(5 - w.rank()), ReduceOp::kMin),
            static_cast<T>(5 - (g - 1)));
}

TEST(Communicator, AllReduceSumMaxMinForEachType) {
  check_all_reduce<float>(world());
  check_all_reduce<double>(world());
  check_all_reduce<std::int32_t>(world());
  check_all_reduce<std::int64_t>(world());
}

TEST(Communicator, ReduceScatter) {
  const Communicator& w = world();
  const int g = w.size();
  constexpr std::size_t kCount = 4;
  std::vector<double> send(kCount * static_cast<std::size_t>(g));
  for (std::size_t j = 0; j < send.size(); ++j)
    send[j] = 1000.0 * w.rank() + static_cast<double>(j);
  std::vector<double> recv(kCount, -1.0);
  w.reduce_scatter<double>(send, recv);
  const double rank_sum = 1000.0 * g * (g - 1) / 2;
  for (std::size_t i = 0; i < kCount; ++i) {
    EXPECT_EQ(recv[i],
              rank_sum + g * static_cast<double>(static_cast<std::size_t>(w.rank()) * kCount + i));
  }
}

TEST(Communicator, BroadcastFromEveryRoot) {
  const Communicator& w = world();
  for (int root = 0; root < w.size(); ++root) {
    std::vector<std::int32_t> buf = {w.rank(), 2 * w.rank() + 1};
    w.broadcast<std::int32_t>(buf, root);
    EXPECT_EQ(buf[0], root);
    EXPECT_EQ(buf[1], 2 * root + 1);
  }
}

TEST(Communicator, BroadcastString) {
  const Communicator& w = world();
  const int root = w.size() - 1;
  const std::string long_text(10000, 'x');
  const std::string mine = w.rank() == root ? long_text + "end" : "other";
  EXPECT_EQ(w.broadcast_string(mine, root), long_text + "end");
  EXPECT_EQ(w.broadcast_string(w.rank() == 0 ? "" : "not empty", 0), "");
}

TEST(Communicator, BroadcastToABadRootIsAnErrorOnEveryRank) {
  const Communicator& w = world();
  std::vector<float> buf(2);
  for (int root : {-1, w.size()}) {
    try {
      w.broadcast<float>(buf, root);
      ADD_FAILURE() << "broadcast to root " << root << " did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(root)), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(w.broadcast_string("x", w.size()), Error);
  // The communicator is still usable afterwards.
  EXPECT_EQ(w.all_reduce<std::int32_t>(1), w.size());
}

TEST(Communicator, SplitByColorOrdersByKey) {
  const Communicator& w = world();
  const int g = w.size();
  // Colors: even and odd world ranks; keys reversed, so the highest world rank becomes rank 0.
  const int color = w.rank() % 2;
  const Communicator sub = w.split(color, -w.rank());
  std::vector<int> members;
  for (int r = g - 1; r >= 0; --r)
    if (r % 2 == color) members.push_back(r);
  ASSERT_EQ(sub.size(), static_cast<int>(members.size()));
  const auto gathered = sub.all_gather<std::int32_t>(w.rank());
  for (std::size_t i = 0; i < members.size(); ++i)
    EXPECT_EQ(gathered[i], members[i]);
  EXPECT_EQ(members[static_cast<std::size_t>(sub.rank())], w.rank());
  // Collectives stay inside the sub-communicator.
  EXPECT_EQ(sub.all_reduce<std::int32_t>(w.rank()),
            std::accumulate(members.begin(), members.end(), 0));
  EXPECT_EQ(sub.backend(), w.backend());
}

TEST(Communicator, AgreeOrThrowRaisesOnEveryRank) {
  const Communicator& w = world();
  EXPECT_NO_THROW(agree_or_throw(w, true, "nothing"));

  const int bad = w.size() - 1;
  try {
    agree_or_throw(w, w.rank() != bad, "loading weights", w.rank() == bad ? "disk on fire" : "");
    ADD_FAILURE() << "agree_or_throw did not throw";
  } catch (const CollectiveError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("loading weights"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank(s) " + std::to_string(bad)), std::string::npos) << msg;
    EXPECT_NE(msg.find("disk on fire"), std::string::npos) << msg;
  }
  // Several failing ranks: all are listed, with the first one's reason.
  try {
    agree_or_throw(w, false, "step", "reason of rank " + std::to_string(w.rank()));
    ADD_FAILURE() << "agree_or_throw did not throw";
  } catch (const CollectiveError& e) {
    const std::string msg = e.what();
    std::vector<int> all(static_cast<std::size_t>(w.size()));
    std::iota(all.begin(), all.end(), 0);
    EXPECT_NE(msg.find(fmt::format("rank(s) {} of {}", fmt::join(all, ","), w.size())),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("reason of rank 0"), std::string::npos) << msg;
  }
}

TEST(Communicator, BarrierReturns) {
  world().barrier();
}

TEST(LocalCommunicator, CollectivesAreCopiesOrNoOps) {
  const Communicator c = local_communicator();
  EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.backend(), "local");
  std::vector<float> send = {1.5f, -2.0f}, recv(2);
  c.all_gather<float>(send, recv);
  EXPECT_EQ(recv, send);
  EXPECT_EQ(c.all_reduce(3.25), 3.25);
  std::vector<double> rs(2);
  c.reduce_scatter<double>(std::vector<double>{4.0, 5.0}, rs);
  EXPECT_EQ(rs, (std::vector<double>{4.0, 5.0}));
  EXPECT_EQ(c.broadcast_string("abc", 0), "abc");
  EXPECT_THROW(c.broadcast_string("abc", 1), Error);
  EXPECT_EQ(c.split(5, 0).size(), 1);
  EXPECT_THROW(agree_or_throw(c, false, "local step", "why"), CollectiveError);
}

TEST(CountingCommunicator, CountsCallsAndPayloadBytes) {
  auto stats = std::make_shared<CommStats>();
  const Communicator c = counting_communicator(world(), stats);
  const auto g = static_cast<std::size_t>(c.size());
  EXPECT_EQ(c.size(), world().size());
  EXPECT_EQ(c.rank(), world().rank());

  std::vector<float> send(5), recv(5 * g);
  c.all_gather<float>(send, recv);
  std::vector<double> buf(7);
  c.all_reduce<double>(buf);
  c.all_reduce<double>(buf);
  std::vector<std::int32_t> rs_send(3 * g), rs_recv(3);
  c.reduce_scatter<std::int32_t>(rs_send, rs_recv);
  c.broadcast<float>(send, 0);
  c.barrier();
  EXPECT_EQ(stats->all_gather.calls, 1u);
  EXPECT_EQ(stats->all_gather.bytes, 5 * g * 4);
  EXPECT_EQ(stats->all_reduce.calls, 2u);
  EXPECT_EQ(stats->all_reduce.bytes, 2 * 7 * 8u);
  EXPECT_EQ(stats->reduce_scatter.calls, 1u);
  EXPECT_EQ(stats->reduce_scatter.bytes, 3 * g * 4);
  EXPECT_EQ(stats->broadcast.calls, 1u);
  EXPECT_EQ(stats->broadcast.bytes, 5 * 4u);
  EXPECT_EQ(stats->barrier.calls, 1u);

  // Sub-communicators of a counting communicator count into the same stats.
  stats->reset();
  const Communicator sub = c.split(0, c.rank());
  EXPECT_EQ(sub.all_reduce(1.0), static_cast<double>(g));
  EXPECT_EQ(stats->all_reduce.calls, 1u);
  EXPECT_EQ(stats->all_reduce.bytes, 8u);
}

}  // namespace
}  // namespace distmuon
