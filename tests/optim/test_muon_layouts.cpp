// Muon on sharded weights, every layout and mode, against the float64 reference of the full
// matrix (blockwise: of each shard). Runs at 1, 2, 4 and 6 ranks; layouts adapt to the world.
//
// Tolerance 1e-5 relative (Frobenius, per shard): the optimizer computes in fp32 (momentum,
// Newton-Schulz with fp32 Gram sums over the group), the reference in float64. fp32 rounding of
// a few small products per NS step stays near 1e-6, as the NS tests measure; distributed sums
// the Gram matrix in another order, which changes only rounding.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "distmuon/error.h"
#include "optim_test_util.h"

namespace distmuon {
namespace {

using test::TestLayout;

constexpr double kTol = 1e-5;

struct Registered {
  ProcessGroups groups;
  int tp_rank, gtp_rank;
  Matrix local;
};

ParamSpec spec_for(const TestLayout& l, Registered& r, const std::string& name) {
  return test::layout_spec(l, r.groups, r.local.view(), name);
}

MuonOptions test_options(TpMode mode) {
  MuonOptions o;
  o.lr = 1.0;  // parameters start at zero: they hold minus the sum of the updates
  o.tp_mode = mode;
  return o;
}

// Three steps on one parameter; after each, this rank's shard equals the reference's.
void check_layout(const TestLayout& l, TpMode mode) {
  const Communicator& world = test::world();
  Registered r{make_process_groups(world, l.tp, l.gtp), 0, 0, Matrix(l.shard_rows(), l.n_tp())};
  r.tp_rank = r.groups.tp.rank();
  r.gtp_rank = r.groups.gtp.rank();
  const MuonOptions o = test_options(mode);
  Muon opt(o, world, cpu_compute());
  opt.add_parameter(spec_for(l, r, "w"));

  test::ReferenceMuon ref(o, l.m, l.n);
  Matrix p_full(l.m, l.n);                   // full-matrix reference
  Matrix p_shard(l.shard_rows(), l.n_tp());  // blockwise reference of this shard
  std::vector<Index> ids;
  for (Index j = 0; j < l.shard_rows(); ++j)
    ids.push_back(l.global_row(r.tp_rank, r.gtp_rank, j));
  for (int step = 0; step < 3; ++step) {
    const Matrix g = test::random_matrix(l.m, l.n, 100 + static_cast<std::uint64_t>(step));
    // Gradients of padding rows are garbage here: the optimizer must ignore them.
    const Matrix g_local = test::shard_for(g.view(), l, r.tp_rank, r.gtp_rank, 7.0f);
    const ConstMatrixView grads[] = {g_local.view()};
    opt.step(grads);

    Matrix expected;
    if (mode == TpMode::kBlockwise) {
      Matrix unused(l.m, l.n);
      const Matrix u = ref.advance(unused, g.view());
      const Matrix u_local = test::shard_for(u.view(), l, r.tp_rank, r.gtp_rank);
      const Matrix upd = test::reference_orthogonalize(
          u_local.view(), ids, l.qkv, o.ns_options(),
          // The block's own shape: its real columns (tp_pad's zero columns excluded).
          [&](Index m, Index) { return muon_scale(o.scale_mode, m, l.tp_cols(r.tp_rank)); });
      ref.apply(p_shard, upd.view());
      expected = Matrix::from(p_shard.view());
    } else {
      test::reference_step(ref, p_full, g.view(), l.qkv);
      expected = test::shard_for(p_full.view(), l, r.tp_rank, r.gtp_rank);
    }
    EXPECT_LE(relative_error(r.local.view(), expected.view()), kTol)
        << l.label << " " << to_string(mode) << " step " << step << " rank " << world.rank();
    EXPECT_TRUE(test::padding_is_zero(r.local.view(), l, r.tp_rank, r.gtp_rank))
        << l.label << " " << to_string(mode);
  }
}

TEST(MuonLayouts, EveryLayoutAndModeMatchesTheReference) {
  for (const TestLayout& l : test::layouts_for(test::world().size())) {
    for (TpMode mode : {TpMode::kBlockwise, TpMode::kDuplicated, TpMode::kDistributed}) {
      check_layout(l, mode);
    }
  }
}

TEST(MuonLayouts, ScaleUsesTheUnpaddedShape) {
  // A tall padded weight (m = 16 G - 3 rows, pad 3): the update must be NS(u) sqrt(m), and is
  // clearly not NS(u) sqrt(m + pad) (a 5% difference at G = 1, 1% at G = 4, against 1e-5).
  const int w = test::world().size();
  const TestLayout l{.label = "pad", .m = 16 * w - 3, .n = 4, .gtp = w, .pad = 3};
  for (TpMode mode : {TpMode::kDuplicated, TpMode::kDistributed}) {
    Registered r{make_process_groups(test::world(), 1, w), 0, 0, Matrix(l.shard_rows(), l.n_tp())};
    r.gtp_rank = r.groups.gtp.rank();
    const MuonOptions o = test_options(mode);
    Muon opt(o, test::world(), cpu_compute());
    opt.add_parameter(spec_for(l, r, "w"));
    const Matrix g = test::random_matrix(l.m, l.n, 5);
    const Matrix g_local = test::shard_for(g.view(), l, 0, r.gtp_rank);
    const ConstMatrixView grads[] = {g_local.view()};
    opt.step(grads);
    test::ReferenceMuon ref(o, l.m, l.n);
    Matrix p(l.m, l.n);
    test::reference_step(ref, p, g.view(), {});
    Matrix padded_scale = Matrix::from(p.view());
    cpu_compute().scale(padded_scale.view(),
                        static_cast<float>(std::sqrt((l.m + l.pad) / double(l.m))));
    EXPECT_LE(relative_error(r.local.view(), test::shard_for(p.view(), l, 0, r.gtp_rank).view()),
              kTol);
    EXPECT_GT(relative_error(r.local.view(),
                             test::shard_for(padded_scale.view(), l, 0, r.gtp_rank).view()),
              1e-3);
  }
}

// Collectives per step and mode, counted on the TP and GTP groups (quintic, 5 steps): which
// group gathers and which distributes, the tie rule of the two-step case, and the bytes.
TEST(MuonLayouts, CollectivesPerMode) {
  const Communicator& world = test::world();
  const int w = world.size();
  constexpr int kSteps = 5;
  struct Case {
    int tp, gtp, tp_dim;
  };
  std::vector<Case> cases;
  if (w > 1) cases.push_back({1, w, kNoPartition});
  for (int t = 2; t < w; ++t)
    if (w % t == 0 && w / t >= 2) cases.push_back({t, w / t, 0}), cases.push_back({t, w / t, 1});
  for (const Case& c : cases) {
    const TestLayout l{
        .label = "count", .m = 24, .n = 12, .tp_dim = c.tp_dim, .tp = c.tp, .gtp = c.gtp};
    for (TpMode mode : {TpMode::kBlockwise, TpMode::kDuplicated, TpMode::kDistributed}) {
      const ProcessGroups pg = make_process_groups(world, c.tp, c.gtp);
      auto tp_stats = std::make_shared<CommStats>(), gtp_stats = std::make_shared<CommStats>();
      ProcessGroups counted{pg.world,
                            counting_communicator(pg.tp, tp_stats),
                            counting_communicator(pg.gtp, gtp_stats),
                            pg.dp,
                            c.tp,
                            c.gtp,
                            1};
      Registered r{counted, pg.tp.rank(), pg.gtp.rank(), Matrix(l.shard_rows(), l.n_tp())};
      Muon opt(test_options(mode), world, cpu_compute());
      opt.add_parameter(spec_for(l, r, "w"));
      const Matrix g =
          test::shard_for(test::random_matrix(l.m, l.n, 9).view(), l, r.tp_rank, r.gtp_rank);
      const ConstMatrixView grads[] = {g.view()};
      opt.step(grads);
      const std::string what =
          fmt::format("tp {} (dim {}) x gtp {} {}", c.tp, c.tp_dim, c.gtp, to_string(mode));
      const std::size_t shard_bytes = 4 * static_cast<std::size_t>(l.shard_rows() * l.n_tp());
      const CommStats& ts = *tp_stats;
      const CommStats& gs = *gtp_stats;
      if (mode == TpMode::kBlockwise) {
        EXPECT_EQ(
            ts.all_gather.calls + ts.all_reduce.calls + gs.all_gather.calls + gs.all_reduce.calls,
            0u)
            << what;
      } else if (mode == TpMode::kDuplicated) {
        EXPECT_EQ(gs.all_gather.calls, 1u) << what;
        EXPECT_EQ(gs.all_gather.bytes, shard_bytes * static_cast<std::size_t>(c.gtp)) << what;
        EXPECT_EQ(ts.all_gather.calls, c.tp > 1 ? 1u : 0u) << what;
        EXPECT_EQ(ts.all_reduce.calls + gs.all_reduce.calls, 0u) << what;
      } else {
        const bool over_gtp = c.gtp >= c.tp;  // a tie distributes over GTP
        const CommStats& dist = over_gtp ? gs : ts;
        const CommStats& gather = over_gtp ? ts : gs;
        const Index gram = !over_gtp && c.tp_dim == 1 ? l.m : l.n;  // rows side only for TP dim 1
        EXPECT_EQ(dist.all_reduce.calls, 1u + kSteps) << what;
        EXPECT_EQ(dist.all_reduce.bytes, 8u + kSteps * 4u * static_cast<std::size_t>(gram * gram))
            << what;
        EXPECT_EQ(dist.all_gather.calls, 0u) << what;
        EXPECT_EQ(gather.all_gather.calls, c.tp > 1 ? 1u : 0u) << what;
        EXPECT_EQ(gather.all_reduce.calls, 0u) << what;
      }
    }
  }
}

TEST(MuonLayouts, ExpertWeightsUseTheirOwnGroups) {
  // Dense weights over TP x GTP of the world; expert weights over expert groups: EP ranks hold
  // different experts (different data), each sharded over its expert GTP group.
  const Communicator& world = test::world();
  const int w = world.size();
  const int dense_tp = w >= 4 ? 2 : 1;
  const int egtp = w >= 2 ? 2 : 1;
  const TestLayout dense{
      .label = "dense", .m = 24, .n = 36, .tp_dim = 1, .tp = dense_tp, .gtp = w / dense_tp};
  const TestLayout expert{.label = "expert", .m = 36, .n = 12, .gtp = egtp};
  for (TpMode mode : {TpMode::kDuplicated, TpMode::kDistributed}) {
    Registered d{make_process_groups(world, dense.tp, dense.gtp), 0, 0,
                 Matrix(dense.shard_rows(), dense.n_tp())};
    d.tp_rank = d.groups.tp.rank();
    d.gtp_rank = d.groups.gtp.rank();
    ProcessGroups eg = make_process_groups(world, 1, egtp);
    Registered e{eg, 0, eg.gtp.rank(), Matrix(expert.shard_rows(), expert.n_tp())};
    const int ep_rank = world.rank() / egtp;  // replica index of the expert groups
    const MuonOptions o = test_options(mode);
    Muon opt(o, world, cpu_compute());
    opt.add_parameter(spec_for(dense, d, "dense"));
    ParamSpec es = spec_for(expert, e, "expert0");
    es.expert = true;
    es.expert_rank = ep_rank;
    opt.add_parameter(es);
    test::ReferenceMuon dref(o, dense.m, dense.n), eref(o, expert.m, expert.n);
    Matrix dp(dense.m, dense.n), ep(expert.m, expert.n);
    for (int step = 0; step < 2; ++step) {
      const Matrix dg =
          test::random_matrix(dense.m, dense.n, 300 + static_cast<std::uint64_t>(step));
      const Matrix eg_full = test::random_matrix(
          expert.m, expert.n,
          400 + 10 * static_cast<std::uint64_t>(ep_rank) + static_cast<std::uint64_t>(step));
      const Matrix dl = test::shard_for(dg.view(), dense, d.tp_rank, d.gtp_rank);
      const Matrix el = test::shard_for(eg_full.view(), expert, 0, e.gtp_rank);
      const ConstMatrixView grads[] = {dl.view(), el.view()};
      opt.step(grads);
      test::reference_step(dref, dp, dg.view(), {});
      test::reference_step(eref, ep, eg_full.view(), {});
      EXPECT_LE(relative_error(d.local.view(),
                               test::shard_for(dp.view(), dense, d.tp_rank, d.gtp_rank).view()),
                kTol)
          << to_string(mode);
      EXPECT_LE(
          relative_error(e.local.view(), test::shard_for(ep.view(), expert, 0, e.gtp_rank).view()),
          kTol)
          << to_string(mode) << " expert rank " << ep_rank;
    }
  }
}

TEST(MuonLayouts, QkvShapesThatDoNotDivideAreRefused) {
  Matrix local(10, 8);
  ParamSpec s;
  s.name = "qkv";
  s.local = local.view();
  s.rows = 10;
  s.cols = 8;
  s.qkv_split = {4, 2, 2};
  Muon opt(test_options(TpMode::kDuplicated), local_communicator(), cpu_compute());
  try {
    opt.add_parameter(s);
    FAIL() << "10 rows are not whole query groups of 8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("query groups"), std::string::npos) << e.what();
  }
  s.qkv_split = {4, 2};
  EXPECT_THROW(opt.add_parameter(s), Error);
}

TEST(MuonLayouts, BadTpPadsAreRefused) {
  const Communicator& world = test::world();
  const int w = world.size();
  auto refused = [&](int tp_dim, Index rows, Index cols, Index tp_pad, Index local_rows,
                     Index local_cols, const std::string& why) {
    Matrix local(local_rows, local_cols);
    ParamSpec s;
    s.name = "w";
    s.local = local.view();
    s.rows = rows;
    s.cols = cols;
    s.tp_partition_dim = tp_dim;
    s.tp_group = world;
    s.tp_pad_length = tp_pad;
    Muon opt(test_options(TpMode::kDuplicated), world, cpu_compute());
    try {
      opt.add_parameter(s);
      FAIL() << "TP pad " << tp_pad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  if (w == 1) {
    refused(0, 6, 4, 1, 6, 4, "without a TP split");  // a TP group of one: nothing to pad
    return;
  }
  refused(1, 5, 3 * w - 1, -1, 5, 3, "negative");
  refused(1, 5, 3 * w - 1, 2, 5, 3, "equal TP shards");  // 3w + 1 columns do not split
  refused(kNoPartition, 6, 4, 1, 6, 4, "without a TP split");
}

}  // namespace
}  // namespace distmuon
