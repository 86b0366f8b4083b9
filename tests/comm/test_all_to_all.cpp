// all_to_all_v on the test's world (MPI under mpirun, else local): uneven and zero counts, a rank
// that sends nothing, several element types, the counting decorator's record, and count lists
// that do not describe the buffers. Every expected value is computed from the ranks.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "distmuon/comm.h"
#include "distmuon/error.h"
#include "test_util.h"

namespace distmuon {
namespace {

using test::world;
using CountFn = std::function<std::size_t(int from, int to)>;

// The value element i of the chunk rank `from` sends rank `to` carries: exact in every type.
template <typename T>
T value(int from, int to, std::size_t i) {
  return static_cast<T>(1000 * from + 100 * to + static_cast<int>(i));
}

// Runs one exchange on c where rank `from` sends count(from, to) elements to rank `to`, and
// checks every received element.
template <typename T>
void exchange(const Communicator& c, const CountFn& count) {
  const int g = c.size(), me = c.rank();
  std::vector<std::size_t> send_counts(static_cast<std::size_t>(g)),
      recv_counts(static_cast<std::size_t>(g));
  std::vector<T> send;
  for (int to = 0; to < g; ++to) {
    send_counts[static_cast<std::size_t>(to)] = count(me, to);
    for (std::size_t i = 0; i < count(me, to); ++i)
      send.push_back(value<T>(me, to, i));
  }
  for (int from = 0; from < g; ++from)
    recv_counts[static_cast<std::size_t>(from)] = count(from, me);
  const std::size_t total = std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0});
  std::vector<T> recv(total, static_cast<T>(-1));
  c.all_to_all_v<T>(send, send_counts, recv, recv_counts);
  std::size_t at = 0;
  for (int from = 0; from < g; ++from) {
    for (std::size_t i = 0; i < count(from, me); ++i, ++at)
      ASSERT_EQ(recv[at], value<T>(from, me, i)) << "from " << from << " element " << i;
  }
}

// Uneven, all non-zero: rank r sends r + 2 d + 1 elements to rank d.
std::size_t uneven(int from, int to) {
  return static_cast<std::size_t>(from + 2 * to + 1);
}
// Some zero counts (every third pair) including a rank's chunk to itself on some ranks.
std::size_t with_zeros(int from, int to) {
  return static_cast<std::size_t>((from + 2 * to) % 3);
}
// Rank 0 sends nothing at all (and receives from everyone else), the others send 2 to each rank.
std::size_t silent_root(int from, int) {
  return from == 0 ? 0 : 2;
}

TEST(AllToAllV, UnevenCountsEveryType) {
  exchange<float>(world(), uneven);
  exchange<double>(world(), uneven);
  exchange<std::int32_t>(world(), uneven);
  exchange<std::int64_t>(world(), uneven);
}

TEST(AllToAllV, ZeroCounts) {
  exchange<float>(world(), with_zeros);
  // Nothing at all anywhere: empty buffers on every rank.
  exchange<float>(world(), [](int, int) { return std::size_t{0}; });
}

TEST(AllToAllV, ARankThatSendsNothing) {
  exchange<double>(world(), silent_root);
  // And the reverse: every rank sends only to rank 0 (the others receive nothing).
  exchange<double>(world(), [](int, int to) { return to == 0 ? std::size_t{3} : 0; });
}

TEST(AllToAllV, OnSubgroups) {
  // Halves of the world (at 4 ranks: {0, 1}, {2, 3}; else the rank alone or the pair).
  const Communicator& w = world();
  const Communicator half = w.split(w.rank() / 2, w.rank());
  exchange<float>(half, uneven);
  exchange<float>(half, with_zeros);
}

// The counting decorator records one call and the elements this rank sends (its own chunk
// included) times the element size, as the cost model counts an all-to-all.
TEST(AllToAllV, CountingRecordsCallsAndBytesSent) {
  auto stats = std::make_shared<CommStats>();
  const Communicator counted = counting_communicator(world(), stats);
  const int g = world().size(), me = world().rank();
  exchange<double>(counted, uneven);
  exchange<float>(counted, silent_root);
  std::size_t expected = 0;
  for (int to = 0; to < g; ++to)
    expected += uneven(me, to) * sizeof(double) + silent_root(me, to) * sizeof(float);
  EXPECT_EQ(stats->all_to_all.calls, 2u);
  EXPECT_EQ(stats->all_to_all.bytes, expected);
  EXPECT_EQ(stats->all_gather.calls + stats->all_reduce.calls + stats->broadcast.calls, 0u);
}

// Count lists that do not describe the buffers are rejected on the rank that passes them, before
// any communication, with the rank in the message. Every rank passes the same kind of mistake
// here, so every rank throws and none waits.
TEST(AllToAllV, MismatchedCountListsThrowNamingTheRank) {
  const Communicator& w = world();
  const auto g = static_cast<std::size_t>(w.size());
  const std::string rank_text = "rank " + std::to_string(w.rank()) + " of " + std::to_string(g);
  auto expect_error = [&](auto&& call, const std::string& what) {
    try {
      call();
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("all_to_all_v"), std::string::npos) << msg;
      EXPECT_NE(msg.find(rank_text), std::string::npos) << msg;
    }
  };
  std::vector<float> send(2 * g, 1.0f), recv(2 * g);
  const std::vector<std::size_t> twos(g, 2);
  // A list with the wrong number of entries.
  std::vector<std::size_t> too_many(g + 1, 0);
  too_many[0] = 2 * g;
  expect_error([&] { w.all_to_all_v<float>(send, too_many, recv, twos); }, "send list size");
  expect_error([&] { w.all_to_all_v<float>(send, twos, recv, too_many); }, "receive list size");
  // Counts that do not sum to the buffer.
  std::vector<std::size_t> one_more = twos;
  one_more[0] = 3;
  expect_error([&] { w.all_to_all_v<float>(send, one_more, recv, twos); }, "send sum");
  expect_error([&] { w.all_to_all_v<float>(send, twos, recv, one_more); }, "receive sum");
  // The communicator is still usable afterwards.
  exchange<float>(w, uneven);
}

// The local backend checks the one pairing it can see: what a rank sends itself must be what it
// expects from itself.
TEST(AllToAllV, LocalSelfExchangeMustMatch) {
  const Communicator local = local_communicator();
  exchange<std::int64_t>(local, uneven);
  std::vector<float> send(3, 2.0f), recv(2);
  const std::vector<std::size_t> three = {3}, two = {2};
  EXPECT_THROW(local.all_to_all_v<float>(send, three, recv, two), Error);
}

}  // namespace
}  // namespace distmuon
