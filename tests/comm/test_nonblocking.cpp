// Non-blocking all_to_all_v (Communicator::start_all_to_all_v) on the test's world (MPI under
// mpirun, else local): two exchanges in flight at once deliver what the blocking one does, through
// the counting decorator too; and the emulated link: a collective lasts at least its latency plus
// its bytes at the bandwidth, while a started one's time runs during the caller's own work.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "distmuon/agreement.h"
#include "distmuon/comm.h"
#include "distmuon/error.h"
#include "test_util.h"

namespace distmuon {
namespace {

using test::world;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Rank `me` sends k + 1 floats to rank k, valued 100 me + k + tag.
struct Buffers {
  std::vector<float> send, recv;
  std::vector<std::size_t> send_counts, recv_counts;
  Buffers(const Communicator& c, float tag) {
    const int g = c.size(), me = c.rank();
    for (int k = 0; k < g; ++k) {
      send_counts.push_back(static_cast<std::size_t>(k) + 1);
      recv_counts.push_back(static_cast<std::size_t>(me) + 1);
      for (int i = 0; i <= k; ++i)
        send.push_back(static_cast<float>(100 * me + k) + tag);
    }
    recv.assign(static_cast<std::size_t>(g) * (static_cast<std::size_t>(me) + 1), -1.0f);
  }
  void check(const Communicator& c, float tag) const {
    const int me = c.rank();
    for (int from = 0; from < c.size(); ++from)
      for (int i = 0; i <= me; ++i)
        EXPECT_EQ(recv[static_cast<std::size_t>(from * (me + 1) + i)],
                  static_cast<float>(100 * from + me) + tag);
  }
};

TEST(NonBlocking, TwoExchangesInFlightDeliverWhatTheBlockingOneDoes) {
  auto stats = std::make_shared<CommStats>();
  for (const Communicator& c : {world(), counting_communicator(world(), stats)}) {
    Buffers a(c, 0.25f), b(c, 0.5f);
    auto ra = c.start_all_to_all_v<float>(a.send, a.send_counts, a.recv, a.recv_counts);
    auto rb = c.start_all_to_all_v<float>(b.send, b.send_counts, b.recv, b.recv_counts);
    rb->wait();
    ra->wait();
    a.check(c, 0.25f);
    b.check(c, 0.5f);
  }
  EXPECT_EQ(stats->all_to_all.calls, 2u);
  EXPECT_EQ(
      stats->all_to_all.bytes,
      2 * sizeof(float) * static_cast<std::size_t>(world().size() * (world().size() + 1) / 2));
}

TEST(EmulatedLink, CollectivesLastTheirLatencyAndBandwidthAndStartedOnesOverlap) {
  if (world().size() < 2) GTEST_SKIP() << "a group of one has no link";
  const double latency = 0.02;
  const Communicator link = emulated_link_communicator(world(), {latency, 1e9});
  auto t0 = Clock::now();
  link.barrier();
  EXPECT_GE(since(t0), latency);
  // A blocking exchange, then 30 ms of work: at least both.
  Buffers a(link, 0), b(link, 1);
  t0 = Clock::now();
  link.all_to_all_v<float>(a.send, a.send_counts, a.recv, a.recv_counts);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const double serial = since(t0);
  a.check(link, 0);
  EXPECT_GE(serial, latency + 0.03);
  // Started, then the same work, then waited: the link's time ran during the work.
  t0 = Clock::now();
  auto r = link.start_all_to_all_v<float>(b.send, b.send_counts, b.recv, b.recv_counts);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  r->wait();
  const double overlapped = since(t0);
  b.check(link, 1);
  EXPECT_GE(overlapped, 0.03);
  EXPECT_THROW(emulated_link_communicator(world(), {-1.0, 0}), Error);
}

// The decorators pass the side channels through: the step gate reaches every rank through a
// counting and an emulated-link communicator (before, the timing decorator dropped the gate and
// the notices, and each decorator forwarded them by hand).
TEST(Decorators, TheStepGateAndTheNoticesReachTheCommunicatorUnderneath) {
  auto stats = std::make_shared<CommStats>();
  const Communicator counted = counting_communicator(world(), stats);
  const Communicator link = emulated_link_communicator(counted, {0.0, 0.0});
  EXPECT_EQ(link.impl().has_gate(), world().impl().has_gate());
  if (!world().impl().has_gate()) GTEST_SKIP() << "this backend has no gate channel";
  for (std::int64_t step = 1; step <= 3; ++step)
    EXPECT_NO_THROW(pass_step_gate(link, step, 10.0, "decorated step"));
  EXPECT_EQ(stats->all_reduce.calls + stats->all_gather.calls, 0U)
      << "the gate uses its own channel, not the counted collectives";
  // A notice posted by the last rank through the decorators arrives at every other rank.
  const int last = world().size() - 1;
  if (world().rank() == last) link.impl().post_notice("decorated notice");
  if (world().rank() != last) {
    std::optional<std::pair<int, std::string>> notice;
    const auto t0 = Clock::now();
    while (!notice && since(t0) < 10.0)
      notice = link.impl().poll_notice();
    ASSERT_TRUE(notice.has_value()) << "no notice within 10 s";
    EXPECT_EQ(notice->first, last);
    EXPECT_EQ(notice->second, "decorated notice");
  }
  world().barrier();
}

}  // namespace
}  // namespace distmuon
