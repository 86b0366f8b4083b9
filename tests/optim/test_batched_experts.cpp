// Batched parameters (ParamSpec::batch: a 3-D [E, m, n] expert weight as one parameter) against
// the same matrices registered as E parameters: the same bits in every mode (tolerance 0: each
// slice runs exactly the operations its own parameter runs, the batched products of the cpu and
// opaque backends multiplying each matrix as its own product does), the batched entry used (one
// call per NS product for the whole batch, counted on the opaque backend), experts spread over
// owners and homes by LPT, checkpoints round-tripped, and bad specs refused on every rank.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "distmuon/compute.h"
#include "distmuon/error.h"
#include "distmuon/muon.h"
#include "distmuon/tp.h"
#include "optim_test_util.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using test::TestLayout;

// A batch of E matrices of one layout.
struct Experts {
  TestLayout layout;
  Index count = 1;
  bool expert = false;  // ParamSpec::expert (MuonOptions::expert_tp_mode applies)
};

// The expert batches of a run on groups: a TP-row batch, a TP-column batch with GTP padding,
// an unsharded batch (local NS in every mode).
std::vector<Experts> experts_for(const ProcessGroups& g) {
  const int T = g.tp_size, G = g.gtp_size;
  std::vector<Experts> out;
  out.push_back({{.m = 64, .n = 128, .tp_dim = T > 1 ? 0 : kNoPartition, .tp = T, .gtp = G}, 8});
  out.push_back(
      {{.m = 128, .n = 64, .tp_dim = T > 1 ? 1 : kNoPartition, .tp = T, .gtp = G, .pad = 2 * G},
       8});
  out.push_back({{.m = 32, .n = 48}, 4});
  return out;
}

struct StepResult {
  std::vector<Matrix> slices;  // this rank's shard of every matrix, in order, after the steps
  std::vector<ParamInfo> info;
  Compute::ProductCalls calls;  // the backend's product calls during the last step
};

// steps Muon steps of the expert batches, registered as one parameter per batch (batched) or one
// per matrix; the same weights and gradients either way (matrix k of batch e from fixed seeds).
StepResult run(const std::vector<Experts>& experts, bool batched, const MuonOptions& o,
               const ProcessGroups& groups, Compute& compute, int steps = 2,
               const std::optional<Communicator>& dp = std::nullopt) {
  const int t = groups.tp.rank(), g = groups.gtp.rank();
  auto shard = [&](const TestLayout& l, std::uint64_t seed) {
    return test::shard_for(test::random_matrix(l.m, l.n, seed).view(), l, l.tp > 1 ? t : 0,
                           l.gtp > 1 ? g : 0);
  };
  // Each batch's shards stacked by rows (host), then in the backend's memory.
  auto stacked = [&](const Experts& e, std::size_t which, std::uint64_t seed0) {
    const Index r = e.layout.shard_rows(), c = e.layout.n_tp();
    Matrix all(e.count * r, c);
    for (Index k = 0; k < e.count; ++k) {
      const Matrix s = shard(e.layout, seed0 + 100 * which + static_cast<std::uint64_t>(k));
      for (Index i = 0; i < r; ++i)
        std::memcpy(all.view().row_block(k * r + i, 1).data, s.view().row_block(i, 1).data,
                    sizeof(float) * static_cast<std::size_t>(c));
    }
    return all;
  };
  Muon muon(o, test::world(), compute);
  std::vector<DeviceMatrix> weights;
  for (std::size_t e = 0; e < experts.size(); ++e)
    weights.push_back(to_device(compute, stacked(experts[e], e, 1).view()));
  for (std::size_t e = 0; e < experts.size(); ++e) {
    const Experts& x = experts[e];
    const Index r = x.layout.shard_rows();
    const std::string name = "experts" + std::to_string(e);
    if (batched) {
      ParamSpec s = test::layout_spec(x.layout, groups, weights[e].view(), name);
      s.batch = x.count;
      s.expert = x.expert;
      s.dp_group = dp;
      muon.add_parameter(s);
      continue;
    }
    for (Index k = 0; k < x.count; ++k) {
      ParamSpec s = test::layout_spec(x.layout, groups, weights[e].view().row_block(k * r, r),
                                      name + "." + std::to_string(k));
      s.expert = x.expert;
      s.dp_group = dp;
      muon.add_parameter(s);
    }
  }
  StepResult out;
  for (int step = 0; step < steps; ++step) {
    std::vector<DeviceMatrix> grads;
    std::vector<ConstMatrixView> views;
    for (std::size_t e = 0; e < experts.size(); ++e) {
      grads.push_back(to_device(compute, stacked(experts[e], e, 1000 * (step + 1)).view()));
      const Index r = experts[e].layout.shard_rows();
      if (batched) {
        views.push_back(grads.back().view());
      } else {
        for (Index k = 0; k < experts[e].count; ++k)
          views.push_back(grads.back().view().row_block(k * r, r));
      }
    }
    const Compute::ProductCalls before = compute.product_calls();
    muon.step(views);
    const Compute::ProductCalls after = compute.product_calls();
    out.calls = {after.gemm - before.gemm, after.syrk - before.syrk,
                 after.batched_calls - before.batched_calls,
                 after.batched_matrices - before.batched_matrices};
  }
  for (std::size_t e = 0; e < experts.size(); ++e) {
    const Matrix host = to_host(compute, weights[e].view());
    const Index r = experts[e].layout.shard_rows();
    for (Index k = 0; k < experts[e].count; ++k) {
      Matrix s(r, host.cols());
      std::memcpy(s.data(), host.view().row_block(k * r, r).data,
                  sizeof(float) * static_cast<std::size_t>(s.size()));
      out.slices.push_back(std::move(s));
    }
  }
  out.info = muon.parameters();
  return out;
}

void expect_same_bits(const StepResult& a, const StepResult& b, const std::string& what) {
  test::expect_same_bits(a.slices, b.slices, what, "matrix",
                         "differs between the batched and separate parameters");
}

MuonOptions options(TpMode mode) {
  MuonOptions o;
  o.tp_mode = mode;
  o.weight_decay = 0.01;
  return o;
}

TEST(BatchedExperts, EveryModeEqualsSeparateParameters) {
  const ProcessGroups groups = test::tp_gtp_world();
  const auto experts = experts_for(groups);
  for (const TpMode mode :
       {TpMode::kBlockwise, TpMode::kDuplicated, TpMode::kDistributed, TpMode::kOwner}) {
    SCOPED_TRACE(to_string(mode));
    // The cpu backend runs each matrix's NS in turn, the opaque one the batched products
    // (Compute::batches_newton_schulz): both the bits of the separate parameters.
    const StepResult batched = run(experts, true, options(mode), groups, cpu_compute());
    const StepResult separate = run(experts, false, options(mode), groups, cpu_compute());
    expect_same_bits(batched, separate, to_string(mode));
    auto opaque = make_opaque_compute();
    expect_same_bits(run(experts, true, options(mode), groups, *opaque), separate,
                     fmt::format("{} (opaque)", to_string(mode)));
    ASSERT_EQ(batched.info.size(), experts.size());
    for (std::size_t e = 0; e < experts.size(); ++e)
      EXPECT_EQ(batched.info[e].batch, experts[e].count);
  }
}

// Every NS algorithm and precision: the batched NS gives each matrix its own NS's bits.
TEST(BatchedExperts, AlgorithmsAndPrecisionsEqualSeparateParameters) {
  const ProcessGroups groups = make_process_groups(test::world(), 1, 1);
  const std::vector<Experts> experts = {{{.m = 24, .n = 40}, 5}, {{.m = 40, .n = 24}, 3}};
  for (const NsAlgorithm algorithm : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
    for (const Precision precision : {Precision::kFp32, Precision::kTf32, Precision::kBf16}) {
      for (const bool syrk : {true, false}) {
        MuonOptions o = options(TpMode::kDuplicated);
        o.ns_algorithm = algorithm;
        o.precision = precision;
        o.use_syrk = syrk;
        const std::string what =
            fmt::format("{} {} syrk {}", to_string(algorithm), to_string(precision), syrk);
        auto opaque = make_opaque_compute();  // the batched products (cpu: per matrix)
        expect_same_bits(run(experts, true, o, groups, *opaque),
                         run(experts, false, o, groups, cpu_compute()), what);
      }
    }
  }
}

// The size once, at one rank: 64 experts of 256 x 512, one step, the batched products
// (opaque) against 64 separate parameters (cpu).
TEST(BatchedExperts, SixtyFourExpertsOf256x512) {
  if (test::world().size() != 1) GTEST_SKIP() << "one rank suffices (every rank holds all)";
  const ProcessGroups groups = make_process_groups(test::world(), 1, 1);
  const std::vector<Experts> experts = {{{.m = 256, .n = 512}, 64, true}};
  auto opaque = make_opaque_compute();
  const MuonOptions o = options(TpMode::kDuplicated);
  expect_same_bits(run(experts, true, o, groups, *opaque, 1),
                   run(experts, false, o, groups, cpu_compute(), 1), "64 x 256 x 512");
}

// The opaque backend: its batched entry takes the batch, one call per NS product per step.
TEST(BatchedExperts, OpaqueBackendBatchesEveryProduct) {
  const ProcessGroups groups = make_process_groups(test::world(), 1, 1);
  const Index count = 8;
  const std::vector<Experts> experts = {{{.m = 32, .n = 64}, count}};
  auto opaque = make_opaque_compute();
  const MuonOptions o = options(TpMode::kDuplicated);
  const StepResult batched = run(experts, true, o, groups, *opaque);
  expect_same_bits(batched, run(experts, false, o, groups, cpu_compute()), "opaque vs cpu");
  // Standard NS with syrk, quintic coefficients: per step the Gram matrix, its square and the
  // product with X, each one batched call for the 8 matrices; no single product.
  const auto products = static_cast<std::size_t>(3 * o.steps);
  EXPECT_EQ(batched.calls.gemm, 0u);
  EXPECT_EQ(batched.calls.syrk, 0u);
  EXPECT_EQ(batched.calls.batched_calls, products);
  EXPECT_EQ(batched.calls.batched_matrices, products * static_cast<std::size_t>(count));
}

// Owner mode and replicated homes: each slice its own unit for LPT, so the experts spread over
// the owners (homes); the same bits as separate parameters and as every replica's own NS.
TEST(BatchedExperts, ExpertsSpreadOverOwnersAndHomes) {
  const Communicator& w = test::world();
  if (w.size() == 1) GTEST_SKIP() << "owners and homes need ranks";
  const ProcessGroups groups = test::tp_gtp_world();
  const auto experts = experts_for(groups);
  const StepResult owner = run(experts, true, options(TpMode::kOwner), groups, cpu_compute());
  // 8 equal slices over T x G owners: every owner index gets 8 / (T G) of them.
  const int owners = groups.tp_size * groups.gtp_size;
  for (std::size_t e = 0; e < 2; ++e) {
    std::vector<int> per(static_cast<std::size_t>(owners), 0);
    ASSERT_EQ(owner.info[e].owners.size(), 8u);
    for (const int o : owner.info[e].owners) {
      ASSERT_GE(o, 0);
      ++per[static_cast<std::size_t>(o)];
    }
    for (const int n : per)
      EXPECT_EQ(n, 8 / owners) << "batch " << e;
  }
  // Replicated, unsharded: every rank holds all 8 experts; one home each, by LPT over the world.
  const ProcessGroups single = make_process_groups(w, 1, 1);
  const std::vector<Experts> replicated = {{{.m = 64, .n = 128}, 8}};
  MuonOptions home = options(TpMode::kDuplicated);
  home.replica_mode = ReplicaMode::kHome;
  MuonOptions every = home;
  every.replica_mode = ReplicaMode::kEveryRank;
  const StepResult homes = run(replicated, true, home, single, cpu_compute(), 2, w);
  expect_same_bits(homes, run(replicated, false, home, single, cpu_compute(), 2, w), "homes");
  expect_same_bits(homes, run(replicated, true, every, single, cpu_compute(), 2, w), "every rank");
  ASSERT_EQ(homes.info[0].owners.size(), 8u);
  std::vector<int> per(static_cast<std::size_t>(w.size()), 0);
  for (const int o : homes.info[0].owners)
    ++per[static_cast<std::size_t>(o)];
  for (const int n : per)
    EXPECT_EQ(n, 8 / w.size());
}

// MuonOptions::expert_tp_mode: the expert weights in their own mode, the others in tp_mode;
// owner and duplicated give the same bits, so the result is duplicated's.
TEST(BatchedExperts, ExpertTpModeAppliesToExpertWeights) {
  MuonOptions o = options(TpMode::kDuplicated);
  o.expert_tp_mode = TpMode::kOwner;
  const nlohmann::json j = o;
  EXPECT_EQ(j.at("expert_tp_mode"), "owner");
  EXPECT_EQ(j.get<MuonOptions>().expert_tp_mode, TpMode::kOwner);
  nlohmann::json same = j;
  same["expert_tp_mode"] = "same";
  EXPECT_FALSE(same.get<MuonOptions>().expert_tp_mode.has_value());
  same["expert_tp_mode"] = "sideways";
  EXPECT_THROW((void)same.get<MuonOptions>(), Error);
  const ProcessGroups groups = test::tp_gtp_world();
  auto experts = experts_for(groups);
  experts[0].expert = true;
  const StepResult mixed = run(experts, true, o, groups, cpu_compute());
  expect_same_bits(mixed, run(experts, true, options(TpMode::kDuplicated), groups, cpu_compute()),
                   "expert_tp_mode owner");
  ASSERT_TRUE(mixed.info[0].mode && mixed.info[1].mode);
  EXPECT_EQ(*mixed.info[0].mode, TpMode::kOwner);
  EXPECT_EQ(*mixed.info[1].mode, TpMode::kDuplicated);
  if (test::world().size() > 1) {  // the expert slices spread over the owners
    std::vector<int> owners = mixed.info[0].owners;
    std::sort(owners.begin(), owners.end());
    EXPECT_EQ(owners.front(), 0);
    EXPECT_EQ(owners.back(), groups.tp_size * groups.gtp_size - 1);
  }
}

// tp_mode auto plans a batched parameter (each slice as its own weight of the slice's shape),
// by the estimate and by measuring (plan measure times one slice); the steps run in the planned
// modes. The planned mode may differ from the separate parameters' (owner and duplicated give
// their bits, distributed its own rounding): compared within 1e-5 relative (fp32 NS's rounding
// over two steps, as test_muon_auto compares auto with duplicated).
TEST(BatchedExperts, AutoPlansBatchedParameters) {
  const ProcessGroups groups = test::tp_gtp_world();
  const auto experts = experts_for(groups);
  const StepResult reference =
      run(experts, false, options(TpMode::kDuplicated), groups, cpu_compute());
  for (const PlanMode plan : {PlanMode::kEstimate, PlanMode::kMeasure}) {
    MuonOptions o = options(TpMode::kAuto);
    o.plan = plan;
    const StepResult got = run(experts, true, o, groups, cpu_compute());
    for (const ParamInfo& p : got.info)
      EXPECT_TRUE(p.mode.has_value()) << p.name;
    ASSERT_EQ(got.slices.size(), reference.slices.size());
    for (std::size_t k = 0; k < got.slices.size(); ++k) {
      double diff = 0, norm = 0;
      for (Index i = 0; i < got.slices[k].size(); ++i) {
        const double a = got.slices[k].data()[i], b = reference.slices[k].data()[i];
        diff += (a - b) * (a - b);
        norm += b * b;
      }
      EXPECT_LE(std::sqrt(diff / norm), 1e-5) << "matrix " << k;
    }
  }
}

TEST(BatchedExperts, CheckpointRoundTrip) {
  const Communicator& w = test::world();
  const ProcessGroups groups = test::tp_gtp_world();
  const auto experts = experts_for(groups);
  std::string name;
  if (w.rank() == 0) {
    name = (fs::temp_directory_path() /
            fmt::format("distmuon-experts-{}-{}", ::getpid(), std::random_device{}()))
               .string();
  }
  const fs::path dir = w.broadcast_string(name, 0);
  auto make = [&](Muon& muon, std::vector<Matrix>& weights, Index batch_of_first) {
    for (std::size_t e = 0; e < experts.size(); ++e) {
      const Index batch = e == 0 ? batch_of_first : experts[e].count;
      weights.emplace_back(batch * experts[e].layout.shard_rows(), experts[e].layout.n_tp());
      ParamSpec s = test::layout_spec(experts[e].layout, groups, weights.back().view(),
                                      "experts" + std::to_string(e));
      s.batch = batch;
      muon.add_parameter(s);
    }
  };
  Muon saved(options(TpMode::kDuplicated), w, cpu_compute());
  std::vector<Matrix> wa;
  wa.reserve(experts.size());
  make(saved, wa, experts[0].count);
  std::vector<Matrix> grads;
  std::vector<ConstMatrixView> views;
  for (std::size_t e = 0; e < experts.size(); ++e) {
    grads.push_back(test::random_matrix(wa[e].rows(), wa[e].cols(), 7 + e + 10 * w.rank()));
    views.push_back(grads.back().view());
  }
  saved.step(views);
  saved.save(dir);
  Muon loaded(options(TpMode::kDuplicated), w, cpu_compute());
  std::vector<Matrix> wb;
  wb.reserve(experts.size());
  make(loaded, wb, experts[0].count);
  loaded.load(dir);
  for (std::size_t e = 0; e < experts.size(); ++e) {
    const ConstMatrixView a = saved.state_tensors(e)[0], b = loaded.state_tensors(e)[0];
    ASSERT_EQ(a.rows, b.rows);
    const TestLayout& l = experts[e].layout;
    const int t = l.tp > 1 ? groups.tp.rank() : 0, g = l.gtp > 1 ? groups.gtp.rank() : 0;
    for (Index i = 0; i < a.rows; ++i) {
      if (l.global_row(t, g, i % l.shard_rows()) < 0) continue;  // padding: loaded as zero
      EXPECT_EQ(std::memcmp(a.data + i * a.ld, b.data + i * b.ld, sizeof(float) * a.cols), 0)
          << "momentum of batch " << e << ", row " << i;
    }
  }
  // Another batch size is refused on every rank.
  Muon other(options(TpMode::kDuplicated), w, cpu_compute());
  std::vector<Matrix> wc;
  wc.reserve(experts.size());
  make(other, wc, experts[0].count / 2);
  try {
    other.load(dir);
    ADD_FAILURE() << "a checkpoint of another batch size was loaded";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("batch of 8 matrices"), std::string::npos) << e.what();
  }
  w.barrier();
  if (w.rank() == 0) fs::remove_all(dir);
}

// A batched parameter's matrices each end in their own padding rows (the GTP split's): a
// non-finite value there is ignored, as it is for a parameter of one matrix, and one in a
// matrix's own rows is refused on every rank, naming the matrix.
TEST(BatchedExperts, EachMatrixsPaddingRowsAreIgnoredAndItsOwnRowsChecked) {
  const Communicator& w = test::world();
  const ProcessGroups groups = test::tp_gtp_world();
  const Experts padded = experts_for(groups)[1];  // 8 matrices, GTP padding
  const TestLayout& l = padded.layout;
  const int t = l.tp > 1 ? groups.tp.rank() : 0, g = l.gtp > 1 ? groups.gtp.rank() : 0;
  const Index r = l.shard_rows();
  Index pad_row = -1, real_row = -1;  // within a matrix of this rank's shard
  for (Index i = 0; i < r; ++i)
    (l.global_row(t, g, i) < 0 ? pad_row : real_row) = i;
  Matrix weights = test::random_matrix(padded.count * r, l.n_tp(), 5);
  Muon muon(options(TpMode::kDuplicated), w, cpu_compute());
  ParamSpec s = test::layout_spec(l, groups, weights.view(), "experts");
  s.batch = padded.count;
  muon.add_parameter(s);
  Matrix grad = test::random_matrix(padded.count * r, l.n_tp(), 6);
  for (Index k = 0; k < padded.count; ++k) {  // the padding rows zero, as the caller holds them
    for (Index i = 0; i < r; ++i)
      if (l.global_row(t, g, i) < 0)
        std::memset(grad.view().row_block(k * r + i, 1).data, 0,
                    sizeof(float) * static_cast<std::size_t>(l.n_tp()));
  }
  const std::vector<ConstMatrixView> grads = {grad.view()};
  const float nan = std::nanf("");
  if (pad_row >= 0) grad.view()(3 * r + pad_row, 0) = nan;  // matrix 3's padding
  EXPECT_NO_THROW(muon.step(grads));
  if (pad_row >= 0) grad.view()(3 * r + pad_row, 0) = 0;
  if (w.rank() == 0) grad.view()(5 * r + real_row, 1) = nan;  // matrix 5's own rows, rank 0 only
  try {
    muon.step(grads);
    ADD_FAILURE() << "a non-finite gradient in matrix 5 stepped";
  } catch (const Error& e) {
    if (w.rank() == 0)
      EXPECT_NE(std::string(e.what()).find("'experts' (matrix 5 of its batch)"), std::string::npos)
          << e.what();
  }
}

TEST(BatchedExperts, BadSpecsRefused) {
  const Communicator& w = test::world();
  const ProcessGroups groups = make_process_groups(w, 1, 1);
  const TestLayout l{.m = 16, .n = 8};
  Matrix local(4 * 16, 8);
  auto spec = [&](Index batch, MatrixView v) {
    ParamSpec s = test::layout_spec(l, groups, v, "experts");
    s.batch = batch;
    return s;
  };
  {
    Muon muon(options(TpMode::kDuplicated), w, cpu_compute());
    try {
      muon.add_parameter(spec(0, local.view()));
      ADD_FAILURE() << "batch 0 accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("batch 0"), std::string::npos) << e.what();
    }
    try {
      muon.add_parameter(spec(3, local.view()));  // 64 rows for 3 x 16
      ADD_FAILURE() << "a local view of another batch's rows accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("batch of 3 (48 rows)"), std::string::npos) << e.what();
    }
  }
  if (w.size() == 1) return;
  // A batch that differs between ranks: refused on every rank before the first collective.
  Muon muon(options(TpMode::kDuplicated), w, cpu_compute());
  const Index batch = w.rank() == 0 ? 4 : 2;
  muon.add_parameter(spec(batch, local.view().row_block(0, batch * 16)));
  Matrix g(batch * 16, 8);
  const std::vector<ConstMatrixView> grads = {g.view()};
  try {
    muon.step(grads);
    ADD_FAILURE() << "ranks with different batches stepped";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("configuration"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace distmuon
