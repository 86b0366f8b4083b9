// The NCCL communicator at 2 and 4 ranks on the stand-in NCCL (nccl_standin.cpp, loaded through
// distmuon's NCCL loader: DISTMUON_NCCL_LIBRARY), over host memory: every collective against the
// values the host communicator's contract gives, bf16 and fp16 on the wire, ncclCommSplit, and
// the opaque backend with an NCCL data plane in every tensor-parallel mode and both NS algorithms
// (owner mode and replicated weights' homes through the optimizer) bit-equal to the same backend
// with the MPI data plane (tolerance 0: the stand-in adds in the order OpenMPI's recursive doubling
// does at 2 and 4 ranks; docs/gpu.md). The fault cases run as whole jobs (nccl_standin_fault.cpp,
// check_nccl_fault.cmake).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "comm/nccl/nccl_comm.h"
#include "distmuon/compute.h"
#include "distmuon/muon.h"
#include "distmuon/newton_schulz.h"
#include "distmuon/tp.h"
#include "test_util.h"

namespace distmuon {
namespace {

Communicator nccl_over(const Communicator& host) {
  return host.with_data(make_nccl_comm(host.impl_ptr(), host_nccl_device()));
}

std::uint16_t bf16_of(float f) {  // exact for the small integers used here
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<std::uint16_t>(u >> 16);
}
float of_bf16(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(NcclStandin, CollectivesMatchTheirContract) {
  const Communicator& world = test::world();
  const Communicator c = nccl_over(world);
  CommImpl& d = c.data().impl();
  EXPECT_EQ(d.backend(), "nccl");
  const int r = world.rank(), p = world.size();
  const auto n = static_cast<std::size_t>(p);

  std::vector<float> sum(6);
  for (std::size_t i = 0; i < sum.size(); ++i)
    sum[i] = static_cast<float>(100 * r + static_cast<int>(i));
  d.all_reduce(sum.data(), sum.size(), DType::kF32, ReduceOp::kSum);
  for (std::size_t i = 0; i < sum.size(); ++i)
    EXPECT_EQ(sum[i], static_cast<float>(100 * p * (p - 1) / 2 + p * static_cast<int>(i)));

  std::int64_t biggest = r;
  d.all_reduce(&biggest, 1, DType::kI64, ReduceOp::kMax);
  EXPECT_EQ(biggest, p - 1);

  const std::vector<float> mine = {static_cast<float>(r), static_cast<float>(-r)};
  std::vector<float> gathered(2 * n);
  d.all_gather(mine.data(), gathered.data(), 2, DType::kF32);
  for (int q = 0; q < p; ++q) {
    EXPECT_EQ(gathered[2 * q], static_cast<float>(q));
    EXPECT_EQ(gathered[2 * q + 1], static_cast<float>(-q));
  }

  std::vector<float> all(3 * n), part(3);
  std::iota(all.begin(), all.end(), static_cast<float>(r));
  d.reduce_scatter(all.data(), part.data(), 3, DType::kF32, ReduceOp::kSum);
  for (int i = 0; i < 3; ++i)  // sum over q of (q + 3r + i)
    EXPECT_EQ(part[i], static_cast<float>(p * (p - 1) / 2 + p * (3 * r + i)));

  std::vector<std::int32_t> b = {r, r + 1};
  d.broadcast(b.data(), 2, DType::kI32, p - 1);
  EXPECT_EQ(b, (std::vector<std::int32_t>{p - 1, p}));

  // all_to_all_v: rank r sends (r + q) % 3 elements to q (zero included), valued 1000 r + q.
  std::vector<std::size_t> sc(n), sd(n), rc(n), rd(n);
  std::size_t st = 0, rt = 0;
  for (int q = 0; q < p; ++q) {
    sc[q] = static_cast<std::size_t>((r + q) % 3);
    rc[q] = static_cast<std::size_t>((q + r) % 3);
    sd[q] = st;
    rd[q] = rt;
    st += sc[q];
    rt += rc[q];
  }
  std::vector<float> send(st), recv(rt, -1.0f);
  for (int q = 0; q < p; ++q)
    for (std::size_t k = 0; k < sc[q]; ++k)
      send[sd[q] + k] = static_cast<float>(1000 * r + q);
  d.all_to_all_v(send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(), DType::kF32);
  for (int q = 0; q < p; ++q)
    for (std::size_t k = 0; k < rc[q]; ++k)
      EXPECT_EQ(recv[rd[q] + k], static_cast<float>(1000 * q + r));
  d.barrier();
}

// bf16 and fp16 on the wire: sums of small integers, exact in both.
TEST(NcclStandin, SixteenBitFloatsOnTheWire) {
  const Communicator& world = test::world();
  CommImpl& d = nccl_over(world).data().impl();
  const int r = world.rank(), p = world.size();
  std::vector<std::uint16_t> bf = {bf16_of(static_cast<float>(r)), bf16_of(2.0f)};
  d.all_reduce(bf.data(), 2, DType::kBf16, ReduceOp::kSum);
  EXPECT_EQ(of_bf16(bf[0]), static_cast<float>(p * (p - 1) / 2));
  EXPECT_EQ(of_bf16(bf[1]), static_cast<float>(2 * p));
  _Float16 h[2] = {static_cast<_Float16>(r), static_cast<_Float16>(0.5f)};
  d.all_reduce(h, 2, DType::kF16, ReduceOp::kSum);
  EXPECT_EQ(static_cast<float>(h[0]), static_cast<float>(p * (p - 1) / 2));
  EXPECT_EQ(static_cast<float>(h[1]), 0.5f * static_cast<float>(p));
  // The MPI backend moves them but refuses to reduce them.
  EXPECT_THROW(world.impl().all_reduce(bf.data(), 2, DType::kBf16, ReduceOp::kSum), Error);
}

// ncclCommSplit: odd and even ranks, ordered by key (reversed rank).
TEST(NcclStandin, SplitMakesSubgroups) {
  const Communicator& world = test::world();
  const Communicator c = nccl_over(world);
  const int r = world.rank();
  const auto sub = c.data().impl().split(r % 2, -r);
  const int members = (world.size() + 1 - r % 2) / 2;
  ASSERT_EQ(sub->size(), members);
  std::int32_t v = r;
  sub->all_reduce(&v, 1, DType::kI32, ReduceOp::kSum);
  int want = 0;
  for (int q = r % 2; q < world.size(); q += 2)
    want += q;
  EXPECT_EQ(v, want);
  // Ordered by key: the highest world rank of the color is rank 0.
  std::int32_t top = r;
  sub->broadcast(&top, 1, DType::kI32, 0);
  EXPECT_EQ(top, world.size() - 1 - ((world.size() - 1 - r % 2) % 2));
}

// Every mode and algorithm: the opaque backend with the NCCL data plane against the same backend
// with the MPI data plane, on the world and (at 4 ranks) its halves.
TEST(NcclStandin, ModesAndAlgorithmsBitEqualToMpi) {
  const Communicator& world = test::world();
  std::vector<Communicator> groups = {world};
  if (world.size() == 4) groups.push_back(world.split(world.rank() / 2, world.rank()));
  ASSERT_EQ(setenv("DISTMUON_OPAQUE_DATA_PLANE", "nccl", 1), 0);
  const std::unique_ptr<Compute> over_nccl = make_opaque_compute();
  ASSERT_EQ(unsetenv("DISTMUON_OPAQUE_DATA_PLANE"), 0);
  const std::unique_ptr<Compute> over_mpi = make_opaque_compute();
  for (const Communicator& group : groups) {
    EXPECT_EQ(over_nccl->data_communicator(group).data().backend(), "opaque+nccl");
    for (int dim : {0, 1}) {
      const Matrix full = test::random_matrix(40, 24, 29);
      const Index rows = dim == 0 ? 40 / group.size() : 40,
                  cols = dim == 1 ? 24 / group.size() : 24;
      Matrix shard(rows, cols);
      for (Index i = 0; i < rows; ++i)
        for (Index j = 0; j < cols; ++j)
          shard(i, j) = full(i + (dim == 0 ? rows * group.rank() : 0),
                             j + (dim == 1 ? cols * group.rank() : 0));
      for (const TpMode mode : {TpMode::kBlockwise, TpMode::kDuplicated, TpMode::kDistributed}) {
        for (const NsAlgorithm algorithm : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
          NsOptions o;
          o.algorithm = algorithm;
          DeviceMatrix a = to_device(*over_mpi, shard.view());
          newton_schulz_tp(a.view(), dim, group, mode, o, *over_mpi);
          DeviceMatrix b = to_device(*over_nccl, shard.view());
          newton_schulz_tp(b.view(), dim, group, mode, o, *over_nccl);
          const Matrix ha = to_host(*over_mpi, a.view()), hb = to_host(*over_nccl, b.view());
          EXPECT_EQ(std::memcmp(ha.data(), hb.data(), sizeof(float) * ha.size()), 0)
              << "G=" << group.size() << " dim " << dim << " " << to_string(mode) << " "
              << to_string(algorithm);
        }
      }
    }
  }
}

// Owner mode and replicated weights on one home: the optimizer over the opaque backend with the
// NCCL data plane against the same optimizer with the MPI data plane, three steps of a weight
// split by rows over the world, one split by columns and one replicated over the world (its
// home's result broadcast): the owners' gathers and scatters (all-to-all) and the homes'
// broadcasts run on the stand-in. Tolerance 0, as above.
std::vector<Matrix> owner_steps(Compute& compute) {
  const Communicator& world = test::world();
  const int p = world.size(), r = world.rank();
  MuonOptions o;
  o.tp_mode = TpMode::kOwner;
  o.replica_mode = ReplicaMode::kHome;
  Muon opt(o, world, compute);
  struct Weight {
    Index rows, cols;
    int dim;  // split by rows (0), columns (1), or replicated (-1)
  };
  const Weight weights[] = {{8 * p, 12, 0}, {16, 4 * p, 1}, {20, 10, -1}};
  std::vector<DeviceMatrix> local;
  std::vector<Matrix> full;
  auto shard = [&](const Matrix& m, int dim) {
    if (dim < 0) return m;
    const Index rows = dim == 0 ? m.rows() / p : m.rows(),
                cols = dim == 1 ? m.cols() / p : m.cols();
    Matrix s(rows, cols);
    for (Index i = 0; i < rows; ++i)
      for (Index j = 0; j < cols; ++j)
        s(i, j) = m(i + (dim == 0 ? rows * r : 0), j + (dim == 1 ? cols * r : 0));
    return s;
  };
  for (std::size_t k = 0; k < std::size(weights); ++k) {
    const Weight& w = weights[k];
    local.push_back(
        to_device(compute, shard(test::random_matrix(w.rows, w.cols, 40 + k), w.dim).view()));
    ParamSpec s;
    s.name = fmt::format("w{}", k);
    s.local = local.back().view();
    s.rows = w.rows;
    s.cols = w.cols;
    if (w.dim >= 0) {
      s.tp_partition_dim = w.dim;
      s.tp_group = world;
    } else {
      s.dp_group = world;
    }
    opt.add_parameter(s);
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<DeviceMatrix> grads;
    std::vector<ConstMatrixView> views;
    for (std::size_t k = 0; k < std::size(weights); ++k) {
      const Weight& w = weights[k];
      const Matrix g = test::random_matrix(w.rows, w.cols, 100 * (step + 1) + k);
      grads.push_back(to_device(compute, shard(g, w.dim).view()));
      views.push_back(grads.back().view());
    }
    opt.step(views);
  }
  std::vector<Matrix> out;
  for (const DeviceMatrix& w : local)
    out.push_back(to_host(compute, w.view()));
  return out;
}

TEST(NcclStandin, OwnerAndReplicaHomesBitEqualToMpi) {
  ASSERT_EQ(setenv("DISTMUON_OPAQUE_DATA_PLANE", "nccl", 1), 0);
  const std::unique_ptr<Compute> over_nccl = make_opaque_compute();
  ASSERT_EQ(unsetenv("DISTMUON_OPAQUE_DATA_PLANE"), 0);
  const std::unique_ptr<Compute> over_mpi = make_opaque_compute();
  const std::vector<Matrix> a = owner_steps(*over_mpi), b = owner_steps(*over_nccl);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t k = 0; k < a.size(); ++k) {
    ASSERT_EQ(a[k].size(), b[k].size());
    EXPECT_EQ(std::memcmp(a[k].data(), b[k].data(), sizeof(float) * a[k].size()), 0)
        << "weight " << k;
  }
}

}  // namespace
}  // namespace distmuon

namespace distmuon {
namespace {

// DISTMUON_NCCL_TIMEOUT: a positive number of seconds, else an error naming the variable.
TEST(NcclStandin, TheDeadlineComesFromTheEnvironment) {
  const char* old = std::getenv("DISTMUON_NCCL_TIMEOUT");
  const std::string saved = old != nullptr ? old : "";
  ASSERT_EQ(unsetenv("DISTMUON_NCCL_TIMEOUT"), 0);
  EXPECT_EQ(nccl_timeout_seconds(), 600.0);
  ASSERT_EQ(setenv("DISTMUON_NCCL_TIMEOUT", "2.5", 1), 0);
  EXPECT_EQ(nccl_timeout_seconds(), 2.5);
  for (const char* bad : {"0", "-3", "ten", "5s", "inf"}) {
    ASSERT_EQ(setenv("DISTMUON_NCCL_TIMEOUT", bad, 1), 0);
    try {
      nccl_timeout_seconds();
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("DISTMUON_NCCL_TIMEOUT"), std::string::npos) << bad;
    }
  }
  if (old != nullptr) {
    setenv("DISTMUON_NCCL_TIMEOUT", saved.c_str(), 1);
  } else {
    unsetenv("DISTMUON_NCCL_TIMEOUT");
  }
}

}  // namespace
}  // namespace distmuon
