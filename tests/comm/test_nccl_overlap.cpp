// Started exchanges on the NCCL data plane (nccl_comm.h, start_all_to_all_v) over the stand-in
// NCCL, at 2 and 4 ranks:
// - a start returns before its exchange completes: the peers enter theirs only after rank 0's
//   start returned (a message on the host communicator's point-to-point channel), and the
//   stand-in still holds rank 0's exchange then;
// - owner mode's pipeline (src/tp/owner_ns.h: every stage of a chunk one started exchange, in
//   flight while another chunk's NS runs), with homes spanning the replicas at 4 ranks, over the
//   opaque backend's NCCL data plane is bit-equal to the same pipeline over its MPI data plane
//   (tolerance 0: the exchanges only copy, every home runs the same NS on the same bits), with
//   every start counted and those whose exchange was still in flight when the start returned
//   counted too (the stand-in delays each operation by 5 ms, as a slow link would, so that a
//   started exchange is still in flight when its start returns; a start that waited for its
//   exchange leaves nothing in flight and counts none).
#include <dlfcn.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/forwarding_comm.h"
#include "comm/nccl/nccl_comm.h"
#include "distmuon/compute.h"
#include "distmuon/layout.h"
#include "distmuon/tp.h"
#include "test_layout.h"
#include "test_util.h"
#include "tp/owner_ns.h"
#include "tp/sharded_ns.h"

namespace distmuon {
namespace {

// The stand-in's count of operations queued or running in this process (nccl_standin.cpp), from
// the library distmuon's NCCL loader opened (after a first NCCL operation).
int standin_pending() {
  const char* path = std::getenv("DISTMUON_NCCL_LIBRARY");
  void* lib = path != nullptr ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : nullptr;
  if (lib == nullptr) throw Error("the stand-in NCCL is not loaded");
  const auto pending = reinterpret_cast<int (*)()>(dlsym(lib, "distmuon_standin_pending"));
  dlclose(lib);  // still loaded: distmuon's loader keeps it
  if (pending == nullptr) throw Error("the stand-in NCCL has no distmuon_standin_pending");
  return pending();
}

TEST(NcclOverlap, StartReturnsBeforeTheExchangeCompletes) {
  const Communicator& world = test::world();
  ASSERT_TRUE(world.impl().has_gate());
  const Communicator c = world.with_data(make_nccl_comm(world.impl_ptr(), host_nccl_device()));
  CommImpl& d = c.data().impl();
  std::int32_t one = 1;
  d.all_reduce(&one, 1, DType::kI32, ReduceOp::kSum);  // connects it (collectively, over world)
  const int r = world.rank(), p = world.size();
  const auto n = static_cast<std::size_t>(p);
  // Three elements to every rank, itself included, valued 100 r + 10 q + k.
  std::vector<std::size_t> counts(n, 3), displs(n);
  std::vector<float> send(3 * n), recv(3 * n, -1.0f);
  for (int q = 0; q < p; ++q) {
    displs[q] = 3 * static_cast<std::size_t>(q);
    for (int k = 0; k < 3; ++k)
      send[displs[q] + k] = static_cast<float>(100 * r + 10 * q + k);
  }
  auto start = [&] {
    return d.start_all_to_all_v(send.data(), counts.data(), displs.data(), recv.data(),
                                counts.data(), displs.data(), DType::kF32);
  };
  std::unique_ptr<CommRequest> request;
  if (r == 0) {
    request = start();
    EXPECT_GT(standin_pending(), 0) << "rank 0's exchange completed before its peers started";
    for (int q = 1; q < p; ++q)
      world.impl().post_gate(q, "started");
  } else {
    // A start on rank 0 that waited for the exchange would never send this (bounded here).
    std::optional<std::string> note;
    const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!(note = world.impl().poll_gate(0)) && std::chrono::steady_clock::now() < limit)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(note.value_or("nothing within 10 s"), "started");
    request = start();
  }
  request->wait();
  for (int q = 0; q < p; ++q)
    for (int k = 0; k < 3; ++k)
      EXPECT_EQ(recv[displs[q] + k], static_cast<float>(100 * q + 10 * r + k)) << q << " " << k;
  d.barrier();
}

// Counts the data plane's starts, and those after which the stand-in still held an operation.
struct Starts {
  int started = 0, in_flight = 0;
};
class CountStarts final : public detail::ForwardingComm {
 public:
  CountStarts(std::shared_ptr<CommImpl> inner, std::shared_ptr<Starts> starts, bool probe)
      : ForwardingComm(std::move(inner)), starts_(std::move(starts)), probe_(probe) {}
  std::unique_ptr<CommRequest> start_all_to_all_v(const void* send, const std::size_t* send_counts,
                                                  const std::size_t* send_displs, void* recv,
                                                  const std::size_t* recv_counts,
                                                  const std::size_t* recv_displs,
                                                  DType t) override {
    auto request = ForwardingComm::start_all_to_all_v(send, send_counts, send_displs, recv,
                                                      recv_counts, recv_displs, t);
    ++starts_->started;
    if (probe_ && standin_pending() > 0) ++starts_->in_flight;
    return request;
  }
  std::shared_ptr<CommImpl> split(int color, int key) override {
    return std::make_shared<CountStarts>(inner_split(color, key), starts_, probe_);
  }

 private:
  std::shared_ptr<Starts> starts_;
  bool probe_;
};

using test::GridSize;
using test::TestLayout;

// Weights of different sizes (LPT's order is not the index order) split along both TP
// dimensions, every split even. full: the same values on every replica.
std::vector<TestLayout> layouts_for(const GridSize& g) {
  const Index T = g.T, G = g.G;
  std::vector<TestLayout> out = {{.m = 16 * T * G, .n = 24, .tp_dim = 0},
                                 {.m = 8 * G, .n = 12 * T, .tp_dim = 1},
                                 {.m = 24 * T * G, .n = 8, .tp_dim = 0},
                                 {.m = 4 * G, .n = 20 * T, .tp_dim = 1},
                                 {.m = 12 * T * G, .n = 16, .tp_dim = 0}};
  for (TestLayout& l : out) {
    l.tp = g.T;
    l.gtp = g.G;
  }
  return out;
}

// OwnerOrthogonalizer over `compute`'s data plane (4 chunks), as the optimizer runs it: a first
// run on other values, then the run returned, its buffers kept from the first.
std::vector<Matrix> owner_pipeline(const GridSize& g, Compute& compute,
                                   const std::shared_ptr<Starts>& starts, bool probe) {
  const auto [pg, replicas] = test::grid_groups(g);
  auto plane = [&](const Communicator& host) {
    const Communicator c = compute.data_communicator(host);
    return c.with_data(std::make_shared<CountStarts>(c.data().impl_ptr(), starts, probe));
  };
  const Communicator tp = plane(pg.tp), gtp = plane(pg.gtp), dp = plane(replicas);
  const std::vector<TestLayout> ls = layouts_for(g);
  std::vector<ShardLayout> layouts;
  std::vector<DeviceMatrix> first, second;
  for (std::size_t k = 0; k < ls.size(); ++k) {
    const TestLayout& l = ls[k];
    layouts.push_back(test::shard_layout(l, pg, &dp));
    const Matrix a = test::random_matrix(l.m, l.n, 90 + k),
                 b = test::random_matrix(l.m, l.n, 50 + k);
    first.push_back(
        to_device(compute, test::shard_for(a.view(), l, pg.tp.rank(), pg.gtp.rank()).view()));
    second.push_back(
        to_device(compute, test::shard_for(b.view(), l, pg.tp.rank(), pg.gtp.rank()).view()));
  }
  NsOptions ns;
  detail::OwnerOrthogonalizer orth(detail::ns_flops_cost(ns), 4);
  detail::NsWorkspaces workspaces;
  const detail::ScaleFn scale = [](Index m, Index n) {
    return muon_scale(ScaleMode::kSpectral, m, n);
  };
  for (std::vector<DeviceMatrix>* run : {&first, &second}) {
    std::vector<detail::OwnerOrthogonalizer::Weight> weights;
    for (std::size_t k = 0; k < ls.size(); ++k) {
      weights.push_back({(*run)[k].view(), &layouts[k], &tp, &gtp,
                         k % 2 == 0 ? NsAlgorithm::kStandard : NsAlgorithm::kGram,
                         g.D > 1 ? &dp : nullptr});
    }
    orth.run(weights, ns, scale, compute, &workspaces);
  }
  std::vector<Matrix> out;
  for (const DeviceMatrix& m : second)
    out.push_back(to_host(compute, m.view()));
  return out;
}

TEST(NcclOverlap, OwnerPipelineBitEqualToMpiWithExchangesInFlight) {
  std::vector<GridSize> grids = test::world_grids();
  if (test::world().size() == 4)
    grids.push_back({1, 1, 4});  // replicated weights: the homes' results to every replica
  ASSERT_EQ(setenv("DISTMUON_STANDIN_DELAY_US", "5000", 1), 0);
  struct Unset {
    ~Unset() { unsetenv("DISTMUON_STANDIN_DELAY_US"); }
  } unset_delay;  // also when an assertion returns early
  ASSERT_EQ(setenv("DISTMUON_OPAQUE_DATA_PLANE", "nccl", 1), 0);
  const std::unique_ptr<Compute> over_nccl = make_opaque_compute();
  ASSERT_EQ(unsetenv("DISTMUON_OPAQUE_DATA_PLANE"), 0);
  const std::unique_ptr<Compute> over_mpi = make_opaque_compute();
  for (const GridSize& g : grids) {
    SCOPED_TRACE(fmt::format("grid T {} x G {} x D {}", g.T, g.G, g.D));
    auto mpi_starts = std::make_shared<Starts>(), nccl_starts = std::make_shared<Starts>();
    const std::vector<Matrix> a = owner_pipeline(g, *over_mpi, mpi_starts, false);
    const std::vector<Matrix> b = owner_pipeline(g, *over_nccl, nccl_starts, true);
    test::expect_same_bits(b, a, "the NCCL data plane", "weight", "differs from the MPI one");
    // Every stage of every chunk started on both planes, the same number of times.
    EXPECT_GT(nccl_starts->started, 0);
    EXPECT_EQ(nccl_starts->started, mpi_starts->started);
    // At least one exchange per rank still in flight when its start returned (with a 5 ms delay
    // per operation nearly all are; a rank descheduled for 5 ms right after a start misses one).
    EXPECT_GT(nccl_starts->in_flight, 0) << nccl_starts->started << " starts";
    if (test::world().rank() == 0) {
      std::printf("grid %dx%dx%d: %d starts, %d in flight when they returned\n", g.T, g.G, g.D,
                  nccl_starts->started, nccl_starts->in_flight);
    }
  }
}

}  // namespace
}  // namespace distmuon
