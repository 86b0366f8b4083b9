// bfloat16 weights kept without a float32 copy (ParamSpec::bf16): each step unpacks them into
// float32 copies that live for the step only, steps those and packs the new weights back rounded
// to nearest even. Tolerance 0 against float32 weights holding the same values, rounded to
// bfloat16 after every step: unpacking is exact and packing is round_to(kBf16), so the steps
// make the same operations on the same values. Every mode (TP x GTP-sharded, AdamW and batched
// parameters included), on the cpu backend and on the opaque one; and between steps the backend
// holds no float32 copy of a bfloat16 weight.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/fault.h"
#include "distmuon/adamw.h"
#include "distmuon/compute.h"
#include "distmuon/error.h"
#include "distmuon/muon.h"
#include "distmuon/precision.h"
#include "distmuon/tp.h"
#include "optim_test_util.h"

namespace distmuon {
namespace {

using test::TestLayout;

// Two TP-row weights, one TP-column weight, a batch of 2 and an AdamW matrix.
struct Weight {
  TestLayout layout;
  Index batch = 1;
  ParamRole role = ParamRole::kHidden;
};

std::vector<Weight> model_for(int T, int G) {
  const int rows = T > 1 ? 0 : kNoPartition, cols = T > 1 ? 1 : kNoPartition;
  return {{{.m = 48, .n = 40, .tp_dim = rows, .tp = T, .gtp = G}},
          {{.m = 40, .n = 24, .tp_dim = cols, .tp = T, .gtp = G}},
          {{.m = 48, .n = 40, .tp_dim = rows, .tp = T, .gtp = G}, 2},
          {{.m = 32, .n = 24, .tp_dim = rows, .tp = T, .gtp = G}, 1, ParamRole::kOther}};
}

Matrix rounded(Matrix m) {
  for (float& v : m.values())
    v = round_to(Precision::kBf16, v);
  return m;
}

// The bf16 bits of a matrix (its values already bfloat16) as floats of packed storage, and back.
std::vector<float> packed(const Matrix& m) {
  std::vector<std::uint16_t> bits;
  for (const float v : m.values())
    bits.push_back(static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(v) >> 16));
  bits.resize(bits.size() + bits.size() % 2);
  std::vector<float> out(bits.size() / 2);
  std::memcpy(out.data(), bits.data(), out.size() * sizeof(float));
  return out;
}

Matrix unpacked(std::span<const float> storage, Index rows, Index cols) {
  Matrix m(rows, cols);
  const auto* bits = reinterpret_cast<const std::uint16_t*>(storage.data());
  for (float& v : m.values())
    v = std::bit_cast<float>(static_cast<std::uint32_t>(*bits++) << 16);
  return m;
}

struct Result {
  std::vector<Matrix> shards;
  std::vector<Matrix> states;  // each parameter's first state tensor, in float32
  std::size_t live_bytes = 0;  // the backend's, after the last step
};

// Three Muon steps (fixed seeds per weight and step). bf16: the weights as ParamSpec::bf16 in
// the backend's memory; else float32 weights rounded to bfloat16 after every step, and, with
// momentum_dtype param, their momentum too (through state_tensors' views). checkpoint: saved
// after the second step and loaded into a new optimizer that takes the third.
Result run(const std::vector<Weight>& model, const MuonOptions& o, const ProcessGroups& groups,
           Compute& compute, bool bf16, const std::filesystem::path& checkpoint = {}) {
  const int t = groups.tp.rank(), g = groups.gtp.rank();
  auto shard = [&](std::size_t i, std::uint64_t seed) {
    const TestLayout& l = model[i].layout;
    const Index r = l.shard_rows();
    Matrix all(model[i].batch * r, l.n_tp());
    for (Index k = 0; k < model[i].batch; ++k) {
      const Matrix s = test::shard_for(test::random_matrix(l.m, l.n, 16 * seed + k).view(), l,
                                       l.tp > 1 ? t : 0, l.gtp > 1 ? g : 0);
      std::memcpy(all.view().row_block(k * r, r).data, s.data(),
                  sizeof(float) * static_cast<std::size_t>(s.size()));
    }
    return all;
  };
  std::vector<DeviceMatrix> weights;  // float32 weights, or the bf16 storage (packed, 1 x k)
  std::vector<Index> rows, cols;
  std::vector<ParamSpec> specs;
  for (std::size_t i = 0; i < model.size(); ++i) {
    const Matrix w = rounded(shard(i, 1 + i));
    rows.push_back(w.rows());
    cols.push_back(w.cols());
    ParamSpec s;
    if (bf16) {
      const std::vector<float> bits = packed(w);
      weights.push_back(
          to_device(compute, ConstMatrixView{bits.data(), 1, static_cast<Index>(bits.size()),
                                             static_cast<Index>(bits.size())}));
      s = test::layout_spec(model[i].layout, groups,
                            MatrixView{nullptr, w.rows(), w.cols(), w.cols()},
                            "w" + std::to_string(i));
      s.bf16 = weights.back().view().data;
    } else {
      weights.push_back(to_device(compute, w.view()));
      s = test::layout_spec(model[i].layout, groups, weights.back().view(),
                            "w" + std::to_string(i));
    }
    s.batch = model[i].batch;
    s.role = model[i].role;
    specs.push_back(s);
  }
  auto make = [&] {
    auto m = std::make_unique<Muon>(o, test::world(), compute);
    for (const ParamSpec& s : specs)
      m->add_parameter(s);
    return m;
  };
  std::unique_ptr<Muon> muon = make();
  const bool rounded_momentum = o.momentum_dtype == MomentumDtype::kParam;
  Result out;
  for (int step = 0; step < 3; ++step) {
    if (step == 2 && !checkpoint.empty()) {
      muon->save(checkpoint);
      muon = make();
      muon->load(checkpoint);
    }
    std::vector<DeviceMatrix> grads;
    std::vector<ConstMatrixView> views;
    for (std::size_t i = 0; i < model.size(); ++i) {
      grads.push_back(to_device(compute, shard(i, 1000 * (step + 1) + i).view()));
      views.push_back(grads.back().view());
    }
    muon->step(views);
    if (bf16) continue;
    for (DeviceMatrix& w : weights)  // the float32 weights as bfloat16 stores them
      compute.copy_from_host(rounded(to_host(compute, w.view())).view(), w.view());
    for (std::size_t i = 0; rounded_momentum && i < model.size(); ++i) {
      if (model[i].role != ParamRole::kHidden) continue;  // AdamW's moments stay float32
      const MatrixView m = muon->state_tensors(i)[0];
      compute.copy_from_host(rounded(to_host(compute, m)).view(), m);
    }
  }
  out.live_bytes = compute.memory_stats().live_bytes;
  for (std::size_t i = 0; i < model.size(); ++i)
    out.states.push_back(muon->state_to_host(i, 0));
  for (std::size_t i = 0; i < model.size(); ++i) {
    const Matrix host = to_host(compute, weights[i].view());
    out.shards.push_back(bf16 ? unpacked(host.values(), rows[i], cols[i]) : host);
  }
  return out;
}

MuonOptions options(TpMode mode) {
  MuonOptions o;
  o.tp_mode = mode;
  o.weight_decay = 0.01;
  o.lr = 0.05;
  return o;
}

TEST(Bf16Weights, StepAsFloat32WeightsRoundedAfterEachStep) {
  const ProcessGroups groups = test::tp_gtp_world();
  const auto model = model_for(groups.tp_size, groups.gtp_size);
  for (const TpMode mode :
       {TpMode::kDuplicated, TpMode::kOwner, TpMode::kDistributed, TpMode::kBlockwise}) {
    SCOPED_TRACE(to_string(mode));
    const Result a = run(model, options(mode), groups, cpu_compute(), true);
    const Result b = run(model, options(mode), groups, cpu_compute(), false);
    test::expect_same_bits(a.shards, b.shards, to_string(mode), "weight",
                           "differs from the float32 weight rounded");
    test::expect_same_bits(a.states, b.states, to_string(mode), "state",
                           "differs from the float32 weight's");
    // The weights moved: a step that wrote nothing would pass the comparison too.
    for (std::size_t i = 0; i < model.size(); ++i) {
      const Matrix start = rounded(test::shard_for(
          test::random_matrix(model[i].layout.m, model[i].layout.n, 16 * (1 + i)).view(),
          model[i].layout, model[i].layout.tp > 1 ? groups.tp.rank() : 0,
          model[i].layout.gtp > 1 ? groups.gtp.rank() : 0));
      EXPECT_NE(std::memcmp(a.shards[i].data(), start.data(),
                            sizeof(float) * static_cast<std::size_t>(start.size())),
                0)
          << "weight " << i;
    }
  }
}

// momentum_dtype param: a bfloat16 weight's momentum kept in bfloat16, each step's rounded to
// nearest even once (the float32 run rounds its momentum after every step: the same bits); an
// AdamW parameter's moments and a float32 weight's momentum stay float32. Through a checkpoint
// (saved in float32, loaded rounded back: exactly) the next step is the same.
TEST(Bf16Weights, MomentumInTheWeightsDtype) {
  const ProcessGroups groups = test::tp_gtp_world();
  const auto model = model_for(groups.tp_size, groups.gtp_size);
  MuonOptions o = options(TpMode::kOwner);
  o.momentum_dtype = MomentumDtype::kParam;
  const Result a = run(model, o, groups, cpu_compute(), true);
  const Result b = run(model, o, groups, cpu_compute(), false);
  test::expect_same_bits(a.shards, b.shards, "param", "weight", "differs from the rounded run");
  test::expect_same_bits(a.states, b.states, "param", "momentum", "differs from the rounded run");
  for (std::size_t i = 0; i < model.size(); ++i) {  // every momentum value a bfloat16 one
    if (model[i].role != ParamRole::kHidden) continue;
    EXPECT_EQ(a.states[i].values()[0], round_to(Precision::kBf16, a.states[i].values()[0]));
    EXPECT_TRUE(std::equal(a.states[i].values().begin(), a.states[i].values().end(),
                           rounded(a.states[i]).values().begin()))
        << "momentum " << i << " holds a value bfloat16 does not";
  }
  // The float32 momentum differs: the option changes the maths (as torch's dtype does).
  const Result fp32_momentum = run(model, options(TpMode::kOwner), groups, cpu_compute(), true);
  EXPECT_NE(std::memcmp(a.states[0].data(), fp32_momentum.states[0].data(),
                        sizeof(float) * static_cast<std::size_t>(a.states[0].size())),
            0);
  // Saved and loaded between the second and the third step: the same three steps.
  const auto dir = std::filesystem::temp_directory_path() /
                   fmt::format("distmuon_bf16_momentum_{}", test::world().size());
  const Result c = run(model, o, groups, cpu_compute(), true, dir);
  test::expect_same_bits(c.shards, a.shards, "checkpoint", "weight", "differs after a reload");
  test::expect_same_bits(c.states, a.states, "checkpoint", "momentum", "differs after a reload");
  if (test::world().rank() == 0) std::filesystem::remove_all(dir);
}

// On a backend whose memory the host cannot address, the same bits; and between steps the
// backend holds exactly what it holds for float32 weights, less those weights and plus their
// bfloat16 storage: no float32 copy outlives a step.
TEST(Bf16Weights, NoFloat32CopyBetweenSteps) {
  const ProcessGroups groups = test::tp_gtp_world();
  const auto model = model_for(groups.tp_size, groups.gtp_size);
  const MuonOptions o = options(TpMode::kOwner);
  auto opaque_bf16 = make_opaque_compute();
  auto opaque_fp32 = make_opaque_compute();
  const Result a = run(model, o, groups, *opaque_bf16, true);
  const Result b = run(model, o, groups, *opaque_fp32, false);
  test::expect_same_bits(a.shards, b.shards, "opaque", "weight",
                         "differs from the float32 weight rounded");
  test::expect_same_bits(a.shards, run(model, o, groups, cpu_compute(), true).shards, "cpu",
                         "weight", "differs from the opaque backend's");
  std::size_t fp32_bytes = 0, bf16_bytes = 0;
  for (const Matrix& m : b.shards) {
    fp32_bytes += sizeof(float) * static_cast<std::size_t>(m.size());
    bf16_bytes += sizeof(float) * static_cast<std::size_t>((m.size() + 1) / 2);
  }
  EXPECT_EQ(a.live_bytes, b.live_bytes - fp32_bytes + bf16_bytes);
  // With the momentum in bfloat16 too, the Muon weights' momentum takes half as much.
  MuonOptions half = o;
  half.momentum_dtype = MomentumDtype::kParam;
  auto opaque_half = make_opaque_compute();
  const Result h = run(model, half, groups, *opaque_half, true);
  std::size_t momentum_saved = 0;
  for (std::size_t i = 0; i < model.size(); ++i) {
    if (model[i].role != ParamRole::kHidden) continue;
    const auto n = static_cast<std::size_t>(h.shards[i].size());
    momentum_saved += sizeof(float) * (n - (n + 1) / 2);
  }
  EXPECT_EQ(h.live_bytes, a.live_bytes - momentum_saved);
}

// A step refused on one rank (a non-finite gradient) leaves every bfloat16 weight as it was,
// and a weight whose next value would round past bfloat16's largest is refused, not stored as
// an infinity.
TEST(Bf16Weights, RefusedStepsStoreNothing) {
  const Communicator& world = test::world();
  Compute& compute = cpu_compute();
  Muon muon(options(TpMode::kDuplicated), world, compute);
  Matrix w = rounded(test::random_matrix(16, 8, 7));
  std::vector<float> storage = packed(w);
  const ParamSpec s{
      .name = "w", .local = {nullptr, 16, 8, 8}, .bf16 = storage.data(), .rows = 16, .cols = 8};
  muon.add_parameter(s);
  Matrix g = test::random_matrix(16, 8, 8);
  if (world.rank() == world.size() - 1) g(3, 2) = std::numeric_limits<float>::quiet_NaN();
  const std::vector<ConstMatrixView> grads{g.view()};
  const std::vector<float> before = storage;
  EXPECT_THROW(muon.step(grads), CollectiveError);
  EXPECT_EQ(storage, before);

  // A weight whose norm lies between bfloat16's largest value and float32's: its step's bound
  // (|w'_ij| <= ||w||_F + lr ||u||_F, weight_range.cpp) passes for float32, not for bfloat16.
  Matrix edge(16, 8);
  edge(0, 0) = static_cast<float>(kMaxBfloat16);
  edge(1, 0) = round_to(Precision::kBf16, 2.0e37f);
  MuonOptions o = options(TpMode::kDuplicated);
  o.weight_decay = 0;
  o.lr = 1e-3;
  const Matrix ones(16, 8, std::vector<float>(128, 1.0f));
  const std::vector<ConstMatrixView> grad{ones.view()};
  Muon as_fp32(o, world, compute);
  Matrix fp32 = edge;
  ParamSpec f{.name = "w", .local = fp32.view(), .rows = 16, .cols = 8};
  as_fp32.add_parameter(f);
  EXPECT_NO_THROW(as_fp32.step(grad));
  Muon as_bf16(o, world, compute);
  std::vector<float> edge_storage = packed(edge);
  ParamSpec h = s;
  h.bf16 = edge_storage.data();
  as_bf16.add_parameter(h);
  const std::vector<float> edge_before = edge_storage;
  try {
    as_bf16.step(grad);
    ADD_FAILURE() << "a step past bfloat16's range was taken";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("bfloat16's range"), std::string::npos) << e.what();
  }
  EXPECT_EQ(edge_storage, edge_before);
}

// A failure making the float32 copies on one rank (an allocation, before the step's first
// collective) ends the step on every rank with the same error naming that rank, and nothing is
// stored; so does a rank that stores a weight in another dtype than the others (the
// configuration the ranks agree on holds each weight's dtype). A hang fails the test's timeout.
TEST(Bf16Weights, OneRanksFailureEndsEveryRanksStep) {
  const Communicator& world = test::world();
  if (world.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int last = world.size() - 1;
  Matrix w = rounded(test::random_matrix(16, 8, 7));
  std::vector<float> storage = packed(w);
  const ParamSpec s{
      .name = "w", .local = {nullptr, 16, 8, 8}, .bf16 = storage.data(), .rows = 16, .cols = 8};
  const Matrix g = test::random_matrix(16, 8, 8);
  const std::vector<ConstMatrixView> grads{g.view()};
  for (const char* action : {"oom", "throw"}) {
    SCOPED_TRACE(action);
    Muon muon(options(TpMode::kDuplicated), world, cpu_compute());
    muon.add_parameter(s);
    detail::arm_fault(fmt::format("{}:bf16-hold:{}", last, action));
    const std::vector<float> before = storage;
    try {
      muon.step(grads);
      ADD_FAILURE() << "the step went on";
    } catch (const CollectiveError& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("failed on rank(s) {} of", last)),
                std::string::npos)
          << e.what();
    }
    detail::disarm_fault();
    EXPECT_EQ(storage, before);
  }
  // The last rank holds the weight in float32, the others in bfloat16.
  Muon mixed(options(TpMode::kDuplicated), world, cpu_compute());
  ParamSpec m = s;
  if (world.rank() == last) {
    m.local = w.view();
    m.bf16 = nullptr;
  }
  mixed.add_parameter(m);
  try {
    mixed.step(grads);
    ADD_FAILURE() << "ranks storing the weight in different dtypes stepped";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("weight_dtype"), std::string::npos) << e.what();
  }
}

TEST(Bf16Weights, BadStorageRefused) {
  Muon muon(options(TpMode::kDuplicated), test::world(), cpu_compute());
  std::vector<float> storage(64);
  ParamSpec s{
      .name = "w", .local = {nullptr, 16, 8, 9}, .bf16 = storage.data(), .rows = 16, .cols = 8};
  EXPECT_THROW(muon.add_parameter(s), Error);  // strided
  Matrix w(16, 8);
  s.local = w.view();
  EXPECT_THROW(muon.add_parameter(s), Error);  // both a float32 view and bf16 storage
}

}  // namespace
}  // namespace distmuon
