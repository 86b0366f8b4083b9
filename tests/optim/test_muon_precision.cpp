// MuonOptions::precision through every tensor-parallel mode (duplicated, distributed, owner, auto
// with either NS algorithm, blockwise) at 1, 2 and 4 ranks: the step's update against the float64
// reference of the full matrix (blockwise: of each shard), within the precision's NS tolerance,
// and not the fp32 update (the precision reaches every product).
//
// Tolerances (relative Frobenius error of the weights after one step from zero with lr 1, i.e. of
// the update): those of tests/ns/test_ns_precision.cpp for standard NS, tf32 1e-2 and bf16 8e-2
// (about 20 unit roundoffs; NS ends 2-7 away); Gram NS (auto may pick it) twice that. The
// distributed modes sum fp32 partial Gram matrices in another order before rounding them, a
// difference far below the operands' rounding.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "distmuon/error.h"
#include "optim_test_util.h"

namespace distmuon {
namespace {

using test::TestLayout;

struct Case {
  TpMode mode;
  NsAlgorithm algorithm;
};
constexpr Case kCases[] = {
    {TpMode::kDuplicated, NsAlgorithm::kStandard}, {TpMode::kDistributed, NsAlgorithm::kStandard},
    {TpMode::kDistributed, NsAlgorithm::kGram},    {TpMode::kOwner, NsAlgorithm::kStandard},
    {TpMode::kAuto, NsAlgorithm::kAuto},           {TpMode::kBlockwise, NsAlgorithm::kStandard}};

double tolerance(Precision p, NsAlgorithm algorithm) {
  const double standard = p == Precision::kBf16 ? 8e-2 : p == Precision::kTf32 ? 1e-2 : 1e-5;
  return algorithm == NsAlgorithm::kStandard ? standard : 2 * standard;
}

// The weights after one step from zero (lr 1: minus the scaled update), this rank's shard.
Matrix one_step(const TestLayout& l, const MuonOptions& o, const Matrix& g) {
  const ProcessGroups groups = make_process_groups(test::world(), l.tp, l.gtp);
  Matrix local(l.shard_rows(), l.n_tp());
  Muon opt(o, test::world(), cpu_compute());
  opt.add_parameter(test::layout_spec(l, groups, local.view(), "w"));
  const Matrix g_local = test::shard_for(g.view(), l, groups.tp.rank(), groups.gtp.rank());
  const ConstMatrixView grads[] = {g_local.view()};
  opt.step(grads);
  return local;
}

TEST(MuonPrecision, EveryModeHonoursThePrecision) {
  const int w = test::world().size();
  // Rows sharded over the world (GTP), and columns over it (TP dim 1): both orientations.
  const TestLayout layouts[] = {{.label = "gtp", .m = 24 * w, .n = 40, .gtp = w},
                                {.label = "tp1", .m = 40, .n = 24 * w, .tp_dim = 1, .tp = w}};
  for (const TestLayout& l : layouts) {
    const ProcessGroups groups = make_process_groups(test::world(), l.tp, l.gtp);
    const int tp_rank = groups.tp.rank(), gtp_rank = groups.gtp.rank();
    const Matrix g = test::random_matrix(l.m, l.n, 61);
    for (const Case& c : kCases) {
      MuonOptions o;
      o.lr = 1.0;
      o.tp_mode = c.mode;
      o.ns_algorithm = c.algorithm;
      o.precision = Precision::kFp32;
      const Matrix fp32 = one_step(l, o, g);
      for (const Precision p : {Precision::kTf32, Precision::kBf16}) {
        o.precision = p;
        const Matrix got = one_step(l, o, g);
        // The reference: float64 NS of the full matrix (blockwise: of this shard).
        test::ReferenceMuon ref(o, l.m, l.n);
        Matrix expected;
        if (c.mode == TpMode::kBlockwise) {
          Matrix unused(l.m, l.n), p_shard(l.shard_rows(), l.n_tp());
          const Matrix u = ref.advance(unused, g.view());
          const Matrix u_local = test::shard_for(u.view(), l, tp_rank, gtp_rank);
          std::vector<Index> ids;
          for (Index j = 0; j < l.shard_rows(); ++j)
            ids.push_back(l.global_row(tp_rank, gtp_rank, j));
          const Matrix upd = test::reference_orthogonalize(
              u_local.view(), ids, {}, o.ns_options(),
              [&](Index m, Index n) { return muon_scale(o.scale_mode, m, n); });
          ref.apply(p_shard, upd.view());
          expected = Matrix::from(p_shard.view());
        } else {
          Matrix p_full(l.m, l.n);
          test::reference_step(ref, p_full, g.view(), {});
          expected = test::shard_for(p_full.view(), l, tp_rank, gtp_rank);
        }
        const std::string what =
            fmt::format("{} {} {} {} rank {}", l.label, to_string(c.mode), to_string(c.algorithm),
                        to_string(p), test::world().rank());
        // Gathered over the world: the largest error of any rank decides, on every rank.
        const double err =
            test::world().all_reduce(relative_error(got.view(), expected.view()), ReduceOp::kMax);
        EXPECT_LE(err, tolerance(p, c.algorithm)) << what;
        const double from_fp32 =
            test::world().all_reduce(relative_error(got.view(), fp32.view()), ReduceOp::kMax);
        EXPECT_GT(from_fp32, 1e-5) << what;
      }
    }
  }
}

// The optimizer resolves an unset precision to its backend's default and agrees it; the options
// carry it through JSON ("auto" when unset) and refuse a change once built.
TEST(MuonPrecision, OptionsResolveAgreeAndStayFixed) {
  MuonOptions o;
  EXPECT_FALSE(o.precision.has_value());
  EXPECT_EQ(o.ns_options().precision, Precision::kFp32);
  EXPECT_EQ(o.ns_options(Precision::kBf16).precision, Precision::kBf16);
  o.precision = Precision::kTf32;
  EXPECT_EQ(o.ns_options(Precision::kBf16).precision, Precision::kTf32);
  const nlohmann::json j = o;
  EXPECT_EQ(j.at("precision"), "tf32");
  EXPECT_EQ(j.get<MuonOptions>().precision, Precision::kTf32);
  nlohmann::json bad = j;
  bad["precision"] = "fp16";
  try {
    (void)bad.get<MuonOptions>();
    ADD_FAILURE() << "precision fp16 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("option 'precision': unknown precision 'fp16'"),
              std::string::npos)
        << e.what();
  }
  bad["precision"] = 16;
  EXPECT_THROW((void)bad.get<MuonOptions>(), Error);
  nlohmann::json old = j;
  old.erase("precision");  // options written before precision existed: the backend's default
  EXPECT_FALSE(old.get<MuonOptions>().precision.has_value());

  MuonOptions fixed;
  fixed.tp_mode = TpMode::kDuplicated;
  Muon opt(fixed, test::world(), cpu_compute());
  MuonOptions changed = fixed;
  changed.precision = Precision::kBf16;
  EXPECT_THROW(opt.set_options(changed), Error);
  EXPECT_FALSE(opt.options().precision.has_value());
}

}  // namespace
}  // namespace distmuon
