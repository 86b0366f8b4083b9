// make_process_groups: members of the TP, GTP and data-parallel groups for every layout that fits
// the world (TP varies fastest: world_rank = tp_rank + tp * (gtp_rank + gtp * replica)).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <vector>

#include "distmuon/error.h"
#include "distmuon/tp.h"
#include "test_util.h"

namespace distmuon {
namespace {

std::vector<std::int32_t> members(const Communicator& group, int world_rank) {
  return group.all_gather<std::int32_t>(world_rank);
}

TEST(ProcessGroups, MembersForEveryLayout) {
  const Communicator& w = test::world();
  const int n = w.size(), r = w.rank();
  for (int tp = 1; tp <= n; ++tp) {
    for (int gtp = 1; tp * gtp <= n; ++gtp) {
      if (n % (tp * gtp) != 0) continue;
      const ProcessGroups pg = make_process_groups(w, tp, gtp);
      const std::string layout = fmt::format("TP {} x GTP {} on {} ranks", tp, gtp, n);
      EXPECT_EQ(pg.tp_size, tp);
      EXPECT_EQ(pg.gtp_size, gtp);
      EXPECT_EQ(pg.replicas, n / (tp * gtp));
      const int tp_rank = r % tp, gtp_rank = (r / tp) % gtp, replica = r / (tp * gtp);
      std::vector<std::int32_t> want_tp, want_gtp, want_dp;
      for (int i = 0; i < tp; ++i)
        want_tp.push_back(i + tp * (gtp_rank + gtp * replica));
      for (int j = 0; j < gtp; ++j)
        want_gtp.push_back(tp_rank + tp * (j + gtp * replica));
      for (int q = 0; q < n; ++q)
        if (q % tp == tp_rank) want_dp.push_back(q);
      EXPECT_EQ(members(pg.tp, r), want_tp) << layout << ", rank " << r;
      EXPECT_EQ(members(pg.gtp, r), want_gtp) << layout << ", rank " << r;
      EXPECT_EQ(members(pg.dp, r), want_dp) << layout << ", rank " << r;
      EXPECT_EQ(pg.tp.rank(), tp_rank) << layout;
      EXPECT_EQ(pg.gtp.rank(), gtp_rank) << layout;
      EXPECT_EQ(pg.world.size(), n);
    }
  }
}

TEST(ProcessGroups, LayoutThatDoesNotDivideTheWorldIsAnError) {
  const Communicator& w = test::world();
  EXPECT_THROW(make_process_groups(w, w.size() + 1, 1), Error);
  EXPECT_THROW(make_process_groups(w, 1, 0), Error);
  if (w.size() == 4) EXPECT_THROW(make_process_groups(w, 3, 1), Error);
}

}  // namespace
}  // namespace distmuon
