// How a step's communication time is measured (docs/gpu.md, "Statistics"):
//  - timed_communicator with a device timer (Compute::stream_timer) marks each data-plane
//    collective as one interval of the timer and adds nothing to the host clock for it; the
//    control plane, and barriers on either plane (they wait on the host), stay on the host clock;
//  - a Muon step on the opaque backend, whose timer is the one a device backend's contract
//    describes, reports communication time between 0 and the step's total, non-zero where ranks
//    exchange data; the opaque backend's normalisation slot is counted and kept.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/muon.h"
#include "distmuon/tp.h"
#include "optim/timed_comm.h"
#include "test_util.h"

namespace distmuon {
namespace {

// A timer that counts its calls; each interval is worth one second.
class CountingTimer final : public StreamTimer {
 public:
  void start() override { ++starts; }
  void stop() override { ++stops; }
  double seconds() override { return static_cast<double>(std::exchange(stops, 0)); }
  void clear() noexcept override { stops = 0; }
  int starts = 0, stops = 0;
};

TEST(StepCommTime, DataPlaneCollectivesAreDeviceIntervals) {
  const Communicator& world = test::world();
  auto opaque = make_opaque_compute();
  CountingTimer timer;
  auto host = std::make_shared<double>(0.0);
  const Communicator timed =
      detail::timed_communicator(opaque->data_communicator(world), host, &timer);
  DeviceMatrix buf(*opaque, 1, 4), all(*opaque, 1, 4 * world.size());
  timed.data().all_reduce(std::span<float>(buf.view().data, 4));
  timed.data().all_gather(std::span<const float>(buf.view().data, 4),
                          std::span<float>(all.view().data, all.size()));
  EXPECT_EQ(timer.starts, 2);
  EXPECT_EQ(timer.stops, 2);
  EXPECT_EQ(*host, 0.0) << "data-plane collectives are not on the host clock";
  timed.data().barrier();  // waits on the host
  timed.all_reduce(1.0);   // the control plane
  EXPECT_EQ(timer.starts, 2);
  EXPECT_GT(*host, 0.0);
  EXPECT_EQ(timer.seconds(), 2.0);
  // Without a timer (cpu), the data plane is on the host clock.
  auto host2 = std::make_shared<double>(0.0);
  const Communicator plain = detail::timed_communicator(opaque->data_communicator(world), host2);
  plain.data().all_reduce(std::span<float>(buf.view().data, 4));
  EXPECT_GT(*host2, 0.0);
  EXPECT_EQ(timer.starts, 2);
}

TEST(StepCommTime, OpaqueMuonStepIsTimedAndCounted) {
  const Communicator& world = test::world();
  auto opaque = make_opaque_compute();
  MuonOptions o;
  o.tp_mode = TpMode::kDistributed;
  Muon opt(o, world, *opaque);
  // A weight split by rows over the world (GTP), so that the ranks exchange data each step.
  const ProcessGroups pg = make_process_groups(world, 1, world.size());
  constexpr Index m = 96, n = 40;
  const Index rows = m / world.size();
  DeviceMatrix w = to_device(*opaque, test::random_matrix(rows, n, 7 + world.rank()).view());
  DeviceMatrix g(*opaque, rows, n);
  ParamSpec s;
  s.name = "w";
  s.local = w.view();
  s.rows = m;
  s.cols = n;
  s.gtp_sharded = true;
  s.gtp_group = pg.gtp;
  opt.add_parameter(s);
  std::size_t after_first = 0;
  for (int step = 0; step < 3; ++step) {
    opaque->copy_from_host(test::random_matrix(rows, n, 20 + step + world.rank()).view(), g.view());
    const std::vector<ConstMatrixView> grads{g.view()};
    opt.step(grads);
    const MuonStepStats st = opt.last_step_stats();
    EXPECT_LE(st.comm_s, st.total_s) << "step " << step;
    if (world.size() > 1) {
      EXPECT_GT(st.comm_s, 0.0) << "step " << step;
    } else {
      EXPECT_GE(st.comm_s, 0.0);
    }
    if (step == 0) after_first = opaque->memory_stats().allocations;
  }
  EXPECT_EQ(opaque->memory_stats().allocations, after_first) << "steps after the first allocate";
}

TEST(StepCommTime, OpaqueNormalisationSlotIsCountedAndKept) {
  auto opaque = make_opaque_compute();
  DeviceMatrix x = to_device(*opaque, test::random_matrix(5, 3, 9).view());
  const MemoryStats before = opaque->memory_stats();
  opaque->normalize(x.view(), 1e-7, true, nullptr);
  EXPECT_EQ(opaque->memory_stats().allocations, before.allocations + 1);
  EXPECT_EQ(opaque->memory_stats().live_bytes, before.live_bytes + sizeof(double));
  opaque->normalize(x.view(), 1e-7, true, nullptr);
  EXPECT_EQ(opaque->memory_stats().allocations, before.allocations + 1);
}

}  // namespace
}  // namespace distmuon
