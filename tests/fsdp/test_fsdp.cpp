// Row sharding over the ranks of the test world: shards, all-gather, reduce-scatter of the mean.
// Runs at 1, 2 and 4 ranks. All comparisons are exact (== 0 error) except the reduce-scatter
// mean, whose float sum over ranks may be ordered differently from the reference's: 1e-6 relative.
#include <gtest/gtest.h>

#include "distmuon/error.h"
#include "distmuon/fsdp.h"
#include "test_util.h"

namespace distmuon {
namespace {

using test::random_matrix;
using test::world;

struct Shape {
  Index rows, cols;
};
// Divisible by 1, 2, 4; padding within one shard; padding spanning two shards (5 rows over 4:
// shard_rows 2, pad 3); fewer rows than ranks.
const Shape kShapes[] = {{16, 6}, {7, 5}, {5, 3}, {1, 4}, {9, 1}};

TEST(RowSharding, LayoutArithmetic) {
  const RowSharding s = RowSharding::make(5, 3, 4);
  EXPECT_EQ(s.shard_rows, 2);
  EXPECT_EQ(s.pad_length, 3);
  EXPECT_EQ(s.real_rows(0), 2);
  EXPECT_EQ(s.real_rows(1), 2);
  EXPECT_EQ(s.real_rows(2), 1);
  EXPECT_EQ(s.real_rows(3), 0);
  const RowSharding e = RowSharding::make(8, 2, 4);
  EXPECT_EQ(e.pad_length, 0);
  EXPECT_EQ(e.first_row(3), 6);
  EXPECT_THROW(RowSharding::make(4, 4, 0), Error);
}

TEST(RowSharding, ShardsAreRowsOfTheFullMatrixWithZeroPadding) {
  const Matrix full = random_matrix(5, 3, 1);
  const RowSharding s = RowSharding::make(5, 3, 4);
  std::vector<Matrix> shards;
  for (int r = 0; r < 4; ++r)
    shards.push_back(row_shard(full, s, r));
  for (Index i = 0; i < 8; ++i)
    for (Index j = 0; j < 3; ++j)
      EXPECT_EQ(shards[static_cast<std::size_t>(i / 2)](i % 2, j), i < 5 ? full(i, j) : 0.0f);
}

TEST(RowSharding, AllGatherOfShardsIsTheFullMatrix) {
  const Communicator& comm = world();
  ShardingWorkspace ws;
  for (const Shape& sh : kShapes) {
    const Matrix full = random_matrix(sh.rows, sh.cols, 11);  // the same on every rank
    const RowSharding s = RowSharding::make(sh.rows, sh.cols, comm.size());
    const Matrix shard = row_shard(full, s, comm.rank());
    Matrix gathered(sh.rows, sh.cols);
    all_gather_rows(shard, s, comm, gathered, ws, cpu_compute());
    EXPECT_EQ(relative_error(gathered.view(), full.view()), 0.0) << shape_str(sh.rows, sh.cols);
  }
}

TEST(RowSharding, ReduceScatterIsTheMeanOfTheRanksGradients) {
  const Communicator& comm = world();
  ShardingWorkspace ws;
  for (const Shape& sh : kShapes) {
    const RowSharding s = RowSharding::make(sh.rows, sh.cols, comm.size());
    // Rank r's "gradient" is random_matrix(seed 100 + r); every rank can build all of them.
    Matrix mean(sh.rows, sh.cols);
    for (int r = 0; r < comm.size(); ++r) {
      const Matrix g = random_matrix(sh.rows, sh.cols, 100 + static_cast<std::uint64_t>(r));
      for (Index i = 0; i < mean.size(); ++i)
        mean.data()[i] += g.data()[i] / static_cast<float>(comm.size());
    }
    const Matrix mine =
        random_matrix(sh.rows, sh.cols, 100 + static_cast<std::uint64_t>(comm.rank()));
    Matrix shard(s.shard_rows, s.cols);
    shard.data()[0] = 123.0f;  // overwritten, not accumulated
    reduce_scatter_rows_mean(mine, s, comm, shard, ws, cpu_compute());
    const Matrix want = row_shard(mean, s, comm.rank());
    EXPECT_LE(relative_error(shard.view(), want.view()), 1e-6) << shape_str(sh.rows, sh.cols);
    for (Index i = s.real_rows(comm.rank()); i < s.shard_rows; ++i)
      for (Index j = 0; j < s.cols; ++j)
        EXPECT_EQ(shard(i, j), 0.0f) << "padding row " << i;
  }
}

TEST(RowSharding, AllReduceMean) {
  const Communicator& comm = world();
  Matrix m(3, 4);
  for (Index i = 0; i < m.size(); ++i)
    m.data()[i] = static_cast<float>(comm.rank() + i);
  all_reduce_mean(m, comm, cpu_compute());
  const float mean_rank = static_cast<float>(comm.size() - 1) / 2.0f;
  for (Index i = 0; i < m.size(); ++i)
    EXPECT_FLOAT_EQ(m.data()[i], mean_rank + static_cast<float>(i));
}

TEST(RowSharding, ShapeMismatchOnOneRankThrowsOnAllRanks) {
  const Communicator& comm = world();
  const RowSharding s = RowSharding::make(8, 4, comm.size());
  ShardingWorkspace ws;
  // The last rank passes a shard with one column too many: every rank must throw, none hang.
  const bool bad = comm.rank() == comm.size() - 1;
  Matrix shard(s.shard_rows, bad ? 5 : 4);
  Matrix full(8, 4);
  EXPECT_THROW(all_gather_rows(shard, s, comm, full, ws, cpu_compute()), CollectiveError);
  EXPECT_THROW(reduce_scatter_rows_mean(full, s, comm, shard, ws, cpu_compute()), CollectiveError);
  // A sharding made for another group size is refused the same way.
  const RowSharding other = RowSharding::make(8, 4, comm.size() + 1);
  Matrix other_shard(other.shard_rows, 4);
  EXPECT_THROW(all_gather_rows(other_shard, other, comm, full, ws, cpu_compute()), CollectiveError);
}

}  // namespace
}  // namespace distmuon
