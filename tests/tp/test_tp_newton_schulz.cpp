// newton_schulz_tp against the single-process NS of the full matrix, on groups of 1, 2 and 4 ranks.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "distmuon/compute.h"
#include "distmuon/error.h"
#include "distmuon/tp.h"
#include "test_util.h"
#include "tp_test_util.h"

namespace distmuon {
namespace {

using test::my_shard;
using test::ns_options;
using test::random_matrix;
using test::tp_groups;

struct Shape {
  Index m, n;
};
// Tall and wide, both divisible by 4 along each dimension.
const Shape kShapes[] = {{64, 40}, {40, 64}};

bool bit_equal(const Matrix& a, const Matrix& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) return false;
  for (Index i = 0; i < a.size(); ++i)
    if (a.data()[i] != b.data()[i]) return false;
  return true;
}

std::string label(const Communicator& g, const Shape& sh, int dim, const std::string& set,
                  bool syrk) {
  return fmt::format("G={} {} dim {} {} syrk={}", g.size(), shape_str(sh.m, sh.n), dim, set, syrk);
}

// Duplicated gathers exactly the full matrix and runs the same single-process NS on it, so the
// result is the same bits (one BLAS thread per rank, the same kernels on the same data).
TEST(TpNewtonSchulz, DuplicatedIsBitForBitTheFullNsSliced) {
  for (const Communicator& group : tp_groups()) {
    for (const Shape& sh : kShapes) {
      for (int dim : {0, 1}) {
        for (bool syrk : {true, false}) {
          const NsOptions o = ns_options("quintic", syrk);
          const Matrix full = random_matrix(sh.m, sh.n, 17);
          const Matrix expected =
              my_shard(newton_schulz(full.view(), o, cpu_compute()).view(), dim, group);
          Matrix shard = my_shard(full.view(), dim, group);
          newton_schulz_tp(shard.view(), dim, group, TpMode::kDuplicated, o, cpu_compute());
          EXPECT_TRUE(bit_equal(shard, expected)) << label(group, sh, dim, "quintic", syrk);
        }
      }
    }
  }
}

// Distributed sums each Gram matrix over the group (partial products added in another order
// than one BLAS call over the full matrix) and, for a wide matrix split by rows or a tall one
// split by columns, iterates on the larger Gram matrix; both change fp32 rounding (~1e-7 per
// operation), which the NS polynomials amplify over the steps. 1e-5 relative (Frobenius) is the
// issue's bound; these sizes showed at most 3e-6 (then with aol, since refused by the schedule
// check, 40x64 split by rows, Gram 64x64).
TEST(TpNewtonSchulz, DistributedMatchesTheFullNsWithin1e5) {
  for (const Communicator& group : tp_groups()) {
    for (const Shape& sh : kShapes) {
      for (int dim : {0, 1}) {
        for (const std::string set : {"quintic", "polar_express", "cubic5", "simple"}) {
          for (bool syrk : {true, false}) {
            const NsOptions o = ns_options(set, syrk);
            const Matrix full = random_matrix(sh.m, sh.n, 23);
            const Matrix expected =
                my_shard(newton_schulz(full.view(), o, cpu_compute()).view(), dim, group);
            Matrix shard = my_shard(full.view(), dim, group);
            newton_schulz_tp(shard.view(), dim, group, TpMode::kDistributed, o, cpu_compute());
            // Compare the whole matrix: the largest error of any rank's shard decides.
            const double err =
                group.all_reduce(relative_error(shard.view(), expected.view()), ReduceOp::kMax);
            EXPECT_LE(err, 1e-5) << label(group, sh, dim, set, syrk);
          }
        }
      }
    }
  }
}

TEST(TpNewtonSchulz, BlockwiseIsNsOfEachShard) {
  for (const Communicator& group : tp_groups()) {
    for (int dim : {0, 1}) {
      const NsOptions o = ns_options("quintic", true);
      const Matrix full = random_matrix(64, 40, 5);
      Matrix shard = my_shard(full.view(), dim, group);
      const Matrix expected = newton_schulz(shard.view(), o, cpu_compute());
      newton_schulz_tp(shard.view(), dim, group, TpMode::kBlockwise, o, cpu_compute());
      EXPECT_TRUE(bit_equal(shard, expected)) << "G=" << group.size() << " dim " << dim;
    }
  }
}

// The distributed mode must divide by the norm of the whole matrix, not of the shard. The simple
// set at 4 steps is far from converged (sigma 0.01 -> 0.68, 0.3 -> 1.2), so its result depends on
// the scale of its input: one shard holds a row 50x larger, and a shard's own norm would change
// the result by far more than the 1e-5 (fp32 rounding of the distributed sums, as above) allowed.
// (The schedule check refuses the identity schedule (1, 0, 0) that would return X / ||X||_F.)
TEST(TpNewtonSchulz, DistributedNormalisesByTheGlobalNorm) {
  NsOptions o;
  o.coefficients = coefficient_set("simple");
  o.steps = 4;
  for (const Communicator& group : tp_groups()) {
    for (int dim : {0, 1}) {
      Matrix full = random_matrix(32, 24, 8);
      // Make the shards' norms very different, so a local norm would be far off.
      for (Index j = 0; j < full.cols(); ++j)
        full(0, j) *= 50.0f;
      const Matrix expected =
          my_shard(newton_schulz(full.view(), o, cpu_compute()).view(), dim, group);
      Matrix shard = my_shard(full.view(), dim, group);
      newton_schulz_tp(shard.view(), dim, group, TpMode::kDistributed, o, cpu_compute());
      EXPECT_LE(relative_error(shard.view(), expected.view()), 1e-5)
          << "G=" << group.size() << " dim " << dim;
    }
  }
}

TEST(TpNewtonSchulz, GroupOfOneIsTheLocalPath) {
  const Communicator self = test::world().split(test::world().rank(), 0);
  ASSERT_EQ(self.size(), 1);
  auto stats = std::make_shared<CommStats>();
  const Communicator counted = counting_communicator(self, stats);
  const NsOptions o = ns_options("quintic", true);
  const Matrix g = random_matrix(24, 40, 3);
  const Matrix expected = newton_schulz(g.view(), o, cpu_compute());
  for (TpMode mode : {TpMode::kBlockwise, TpMode::kDuplicated, TpMode::kDistributed}) {
    for (int dim : {0, 1}) {
      Matrix x = Matrix::from(g.view());
      newton_schulz_tp(x.view(), dim, counted, mode, o, cpu_compute());
      EXPECT_TRUE(bit_equal(x, expected)) << to_string(mode) << " dim " << dim;
    }
  }
  EXPECT_EQ(stats->all_gather.calls + stats->all_reduce.calls + stats->broadcast.calls, 0u);
}

TEST(TpNewtonSchulz, NoPartitionIsTheLocalNsWithoutCommunication) {
  auto stats = std::make_shared<CommStats>();
  const Communicator counted = counting_communicator(test::world(), stats);
  const NsOptions o = ns_options("quintic", false);
  const Matrix g = random_matrix(20, 36, 4);
  const Matrix expected = newton_schulz(g.view(), o, cpu_compute());
  for (TpMode mode : {TpMode::kBlockwise, TpMode::kDuplicated, TpMode::kDistributed}) {
    Matrix x = Matrix::from(g.view());
    newton_schulz_tp(x.view(), kNoPartition, counted, mode, o, cpu_compute());
    EXPECT_TRUE(bit_equal(x, expected)) << to_string(mode);
  }
  EXPECT_EQ(stats->all_gather.calls + stats->all_reduce.calls, 0u);
}

TEST(TpNewtonSchulz, MismatchedShardsFailOnEveryRank) {
  const Communicator& w = test::world();
  if (w.size() == 1) GTEST_SKIP() << "needs more than one rank";
  const NsOptions o = ns_options("quintic", true);
  for (TpMode mode : {TpMode::kDuplicated, TpMode::kDistributed}) {
    // Rank 0 holds one row more than the others: a shape no rank has seen before.
    Matrix shard = random_matrix(w.rank() == 0 ? 9 : 8, 16 + static_cast<int>(mode), 1);
    try {
      newton_schulz_tp(shard.view(), 0, w, mode, o, cpu_compute());
      ADD_FAILURE() << to_string(mode) << ": no error on rank " << w.rank();
    } catch (const CollectiveError& e) {
      EXPECT_NE(std::string(e.what()).find("shards differ"), std::string::npos) << e.what();
    }
  }
  // The group still works afterwards, and equal shards pass.
  Matrix shard = random_matrix(8, 12, 2);
  EXPECT_NO_THROW(newton_schulz_tp(shard.view(), 0, w, TpMode::kDistributed, o, cpu_compute()));
}

// A shape verified earlier on one rank and a new one on the others: the check runs on every call,
// so every rank throws instead of rank 0 skipping it and the others waiting (a hang).
TEST(TpNewtonSchulz, AShapeVerifiedOnSomeRanksOnlyStillFailsOnEveryRank) {
  const Communicator& w = test::world();
  if (w.size() == 1) GTEST_SKIP() << "needs more than one rank";
  const NsOptions o = ns_options("quintic", true);
  for (TpMode mode : {TpMode::kDuplicated, TpMode::kDistributed}) {
    Matrix verified = random_matrix(4, 8, 3);
    newton_schulz_tp(verified.view(), 0, w, mode, o, cpu_compute());  // every rank: 4x8 verified
    Matrix shard = random_matrix(w.rank() == 0 ? 4 : 6, 8, 4);
    try {
      newton_schulz_tp(shard.view(), 0, w, mode, o, cpu_compute());
      ADD_FAILURE() << to_string(mode) << ": no error on rank " << w.rank();
    } catch (const CollectiveError& e) {
      EXPECT_NE(std::string(e.what()).find("shards differ"), std::string::npos) << e.what();
    }
  }
}

TEST(TpNewtonSchulz, InvalidArgumentsAreErrors) {
  Matrix x = random_matrix(8, 8, 1);
  EXPECT_THROW(
      newton_schulz_tp(x.view(), 0, test::world(), TpMode::kAuto, NsOptions{}, cpu_compute()),
      Error);
  EXPECT_THROW(newton_schulz_tp(x.view(), 2, test::world(), TpMode::kDistributed, NsOptions{},
                                cpu_compute()),
               Error);
  EXPECT_THROW(parse_tp_mode("fast"), Error);
  EXPECT_EQ(parse_tp_mode("distributed"), TpMode::kDistributed);
  EXPECT_EQ(parse_partition_dim("none"), kNoPartition);
  EXPECT_THROW(parse_partition_dim("2"), Error);
}

// The opaque backend (memory the host cannot address) in every mode, both NS algorithms and both
// partition dims: bit-equal to the CPU backend (the same arithmetic: tolerance 0); and
// all_gather_shards returns the full matrix in the backend's memory.
TEST(TpNewtonSchulz, OpaqueBackendIsBitEqualToCpu) {
  Compute& opaque = compute_backend("opaque");
  for (const Communicator& group : tp_groups()) {
    for (int dim : {0, 1}) {
      const Matrix full = random_matrix(40, 24, 23);
      for (const TpMode mode : {TpMode::kBlockwise, TpMode::kDuplicated, TpMode::kDistributed}) {
        for (const NsAlgorithm algorithm : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
          NsOptions o = ns_options("quintic", true);
          o.algorithm = algorithm;
          Matrix cpu = my_shard(full.view(), dim, group);
          newton_schulz_tp(cpu.view(), dim, group, mode, o, cpu_compute());
          DeviceMatrix x = to_device(opaque, my_shard(full.view(), dim, group).view());
          newton_schulz_tp(x.view(), dim, group, mode, o, opaque);
          EXPECT_TRUE(bit_equal(to_host(opaque, x.view()), cpu))
              << label(group, {40, 24}, dim, "quintic", true) << " " << to_string(mode) << " "
              << to_string(algorithm);
        }
      }
      const DeviceMatrix shard = to_device(opaque, my_shard(full.view(), dim, group).view());
      const Communicator data = opaque.data_communicator(group);
      const DeviceMatrix gathered = all_gather_shards(shard.view(), dim, data, opaque);
      EXPECT_TRUE(bit_equal(to_host(opaque, gathered.view()), full)) << "dim " << dim;
    }
  }
}

// A NaN in the shard of the group's rank 0: on both backends the iteration runs on NaN and the
// result is checked after it (compute.h, normalize); every rank of the group throws (blockwise too:
// the ranks agree on the outcome, so none is left waiting in the caller's next collective).
TEST(TpNewtonSchulz, NonFiniteShardThrowsOnTheSameRanksOnEveryBackend) {
  for (const Communicator& group : tp_groups()) {
    for (const TpMode mode : {TpMode::kBlockwise, TpMode::kDuplicated, TpMode::kDistributed}) {
      for (const NsAlgorithm algorithm : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
        NsOptions o = ns_options("quintic", true);
        o.algorithm = algorithm;
        Matrix shard = my_shard(random_matrix(40, 24, 31).view(), 0, group);
        if (group.rank() == 0) shard(1, 2) = std::numeric_limits<float>::quiet_NaN();
        const bool expect = true;
        for (const char* backend : {"cpu", "opaque"}) {
          Compute& compute = compute_backend(backend);
          DeviceMatrix x = to_device(compute, shard.view());
          bool threw = false;
          try {
            newton_schulz_tp(x.view(), 0, group, mode, o, compute);
          } catch (const Error&) {
            threw = true;
          }
          EXPECT_EQ(threw, expect)
              << label(group, {40, 24}, 0, "quintic", true) << " " << to_string(mode) << " "
              << to_string(algorithm) << " " << backend;
        }
      }
    }
  }
}

TEST(Sharding, ShardAndUnshardRoundTrip) {
  const Matrix full = random_matrix(12, 20, 6);
  for (int dim : {0, 1}) {
    for (int parts : {1, 2, 4}) {
      std::vector<Matrix> shards;
      for (int i = 0; i < parts; ++i)
        shards.push_back(shard_of(full.view(), dim, parts, i));
      EXPECT_EQ(shards[0].rows(), dim == 0 ? 12 / parts : 12);
      EXPECT_EQ(shards[0].cols(), dim == 1 ? 20 / parts : 20);
      EXPECT_TRUE(bit_equal(unshard(shards, dim), full)) << "dim " << dim << " parts " << parts;
    }
  }
  EXPECT_EQ(shard_of(full.view(), 1, 4, 3)(2, 0), full(2, 15));
  EXPECT_THROW(shard_of(full.view(), 0, 5, 0), Error);
  EXPECT_THROW(shard_of(full.view(), 1, 2, 2), Error);
  EXPECT_THROW(shard_of(full.view(), 2, 2, 0), Error);
}

}  // namespace
}  // namespace distmuon
