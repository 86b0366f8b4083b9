// Single-rank tests of the optimizer's options and update rules: validation messages, weight
// decay methods, Nesterov on and off, scale modes, AdamW, and the routing of parameters.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "distmuon/error.h"
#include "optim_test_util.h"

namespace distmuon {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MuonOptions, InvalidValuesListTheValidOnes) {
  EXPECT_NE(
      error_of([] { parse_scale_mode("rms"); }).find("spectral, shape_scaling, unit_rms_norm"),
      std::string::npos);
  EXPECT_NE(error_of([] { parse_weight_decay_method("adam"); }).find("decoupled, independent, l2"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_tp_mode("fast");
            }).find("blockwise, duplicated, distributed, owner, auto"),
            std::string::npos);
  auto invalid = [](auto edit) {
    MuonOptions o;
    edit(o);
    return error_of([&] { o.validate(); });
  };
  EXPECT_NE(invalid([](MuonOptions& o) { o.momentum = 1.5; }).find("0 <= momentum <= 1"),
            std::string::npos);
  EXPECT_NE(invalid([](MuonOptions& o) {
              o.schedule_warns = true;
              o.steps = 0;
            }).find("steps"),
            std::string::npos);
  EXPECT_NE(invalid([](MuonOptions& o) { o.lr = -1; }).find("lr"), std::string::npos);
  EXPECT_NE(invalid([](MuonOptions& o) { o.cost_model = "magic"; }).find("refined, reference"),
            std::string::npos);
  EXPECT_NE(invalid([](MuonOptions& o) { o.coefficients = "nope"; }).find("quintic"),
            std::string::npos);
  EXPECT_NE(invalid([](MuonOptions& o) {
              o.coefficients = "cubic5";
              o.steps = 4;
            }).find("5 steps"),
            std::string::npos);
  EXPECT_NE(invalid([](MuonOptions& o) { o.extra_scale_factor = 0; }).find("extra_scale_factor"),
            std::string::npos);
  EXPECT_NE(invalid([](MuonOptions& o) { o.adamw.beta2 = 1; }).find("beta2"), std::string::npos);
  // The reference model prices standard NS only: auto would silently run standard.
  EXPECT_NE(invalid([](MuonOptions& o) {
              o.cost_model = "reference";
              o.ns_algorithm = NsAlgorithm::kGram;
            }).find("ns_algorithm"),
            std::string::npos);
  EXPECT_EQ(invalid([](MuonOptions& o) {
              o.cost_model = "reference";
              o.ns_algorithm = NsAlgorithm::kGram;
              o.tp_mode = TpMode::kDuplicated;
            }),
            "");
  EXPECT_THROW(Muon(MuonOptions{.momentum = -0.1}, local_communicator(), cpu_compute()), Error);
  EXPECT_EQ(invalid([](MuonOptions&) {}), "");
}

// The default keeps the mathematics of duplicated: standard NS, whatever auto picks.
TEST(MuonOptions, DefaultNsAlgorithmIsStandard) {
  EXPECT_EQ(MuonOptions{}.ns_algorithm, NsAlgorithm::kStandard);
  EXPECT_EQ(MuonOptions{}.ns_options().algorithm, NsAlgorithm::kStandard);
}

TEST(MuonOptions, JsonRoundTrip) {
  MuonOptions o;
  o.lr = 0.125;
  o.weight_decay_method = WeightDecayMethod::kL2;
  o.scale_mode = ScaleMode::kUnitRmsNorm;
  o.tp_mode = TpMode::kDistributed;
  o.adamw.beta1 = 0.8;
  o.schedule_warns = true;
  const nlohmann::json j = o;
  EXPECT_EQ(j.at("schedule_check"), "warn");
  const MuonOptions back = j.get<MuonOptions>();
  EXPECT_EQ(nlohmann::json(back), j);
  EXPECT_EQ(back.scale_mode, ScaleMode::kUnitRmsNorm);
  EXPECT_TRUE(back.schedule_warns);
  nlohmann::json odd = j;
  odd["schedule_check"] = "sometimes";
  EXPECT_NE(error_of([&] { (void)odd.get<MuonOptions>(); }).find("valid: strict, warn"),
            std::string::npos);
  odd.erase("schedule_check");  // options written before the key existed: strict
  EXPECT_FALSE(odd.get<MuonOptions>().schedule_warns);
}

TEST(MuonOptions, ScaleFactors) {
  EXPECT_DOUBLE_EQ(muon_scale(ScaleMode::kSpectral, 64, 16), 8.0);
  EXPECT_DOUBLE_EQ(muon_scale(ScaleMode::kSpectral, 16, 64), 8.0);
  EXPECT_DOUBLE_EQ(muon_scale(ScaleMode::kShapeScaling, 64, 16), 2.0);
  EXPECT_DOUBLE_EQ(muon_scale(ScaleMode::kShapeScaling, 16, 64), 1.0);
  EXPECT_DOUBLE_EQ(muon_scale(ScaleMode::kUnitRmsNorm, 16, 64), 0.5);
}

// One unsharded parameter stepped by Muon and by the float64 reference. Tolerance 1e-5
// relative: fp32 against float64 Newton-Schulz on a 24 x 40 matrix (see the NS tests).
void check_against_reference(MuonOptions o, const std::string& what) {
  const Index m = 24, n = 40;
  Matrix p = test::random_matrix(m, n, 1);
  Matrix p_ref = Matrix::from(p.view());
  Muon opt(o, local_communicator(), cpu_compute());
  ParamSpec s;
  s.name = "w";
  s.local = p.view();
  s.rows = m;
  s.cols = n;
  opt.add_parameter(s);
  test::ReferenceMuon ref(o, m, n);
  for (int step = 0; step < 3; ++step) {
    const Matrix g = test::random_matrix(m, n, 10 + static_cast<std::uint64_t>(step));
    const ConstMatrixView grads[] = {g.view()};
    opt.step(grads);
    test::reference_step(ref, p_ref, g.view(), {});
    EXPECT_LE(relative_error(p.view(), p_ref.view()), 1e-5) << what << " step " << step;
  }
  EXPECT_EQ(opt.step_count(), 3);
}

TEST(MuonUpdate, WeightDecayMethodsNesterovAndScaleModesMatchTheReference) {
  for (auto method :
       {WeightDecayMethod::kDecoupled, WeightDecayMethod::kIndependent, WeightDecayMethod::kL2}) {
    for (bool nesterov : {true, false}) {
      for (auto scale : {ScaleMode::kSpectral, ScaleMode::kShapeScaling, ScaleMode::kUnitRmsNorm}) {
        MuonOptions o;
        o.lr = 0.5;  // updates as large as the weights, so errors in either show
        o.weight_decay = 0.1;
        o.weight_decay_method = method;
        o.nesterov = nesterov;
        o.scale_mode = scale;
        o.extra_scale_factor = 0.7;
        o.tp_mode = TpMode::kDuplicated;
        check_against_reference(
            o, fmt::format("{} nesterov={} {}", to_string(method), nesterov, to_string(scale)));
      }
    }
  }
}

TEST(MuonUpdate, NonMuonParametersUseAdamW) {
  MuonOptions o;
  o.tp_mode = TpMode::kDuplicated;
  o.adamw = {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1};
  Muon opt(o, local_communicator(), cpu_compute());
  const Index rows = 6, cols = 5;
  std::vector<Matrix> params;
  for (int k = 0; k < 4; ++k)
    params.push_back(test::random_matrix(rows, cols, 20 + static_cast<std::uint64_t>(k)));
  const std::vector<Matrix> start = {Matrix::from(params[0].view()), Matrix::from(params[1].view()),
                                     Matrix::from(params[2].view()),
                                     Matrix::from(params[3].view())};
  const ParamRole roles[] = {ParamRole::kEmbedding, ParamRole::kOutputHead, ParamRole::kOther,
                             ParamRole::kHidden};
  for (int k = 0; k < 4; ++k) {
    ParamSpec s;
    s.name = fmt::format("p{}", k);
    s.local = params[static_cast<std::size_t>(k)].view();
    s.rows = rows;
    s.cols = cols;
    s.role = roles[k];
    s.use_muon = k != 3;  // a hidden matrix opted out of Muon
    opt.add_parameter(s);
  }
  for (const ParamInfo& info : opt.parameters())
    EXPECT_FALSE(info.muon) << info.name;
  for (int t = 1; t <= 2; ++t) {
    const Matrix g = test::random_matrix(rows, cols, 50 + static_cast<std::uint64_t>(t));
    const ConstMatrixView grads[] = {g.view(), g.view(), g.view(), g.view()};
    opt.step(grads);
  }
  // The reference AdamW in float64, same gradients.
  for (int k = 0; k < 4; ++k) {
    std::vector<double> m(static_cast<std::size_t>(rows * cols)), v(m.size());
    std::vector<double> p(start[static_cast<std::size_t>(k)].values().begin(),
                          start[static_cast<std::size_t>(k)].values().end());
    for (int t = 1; t <= 2; ++t) {
      const Matrix g = test::random_matrix(rows, cols, 50 + static_cast<std::uint64_t>(t));
      for (std::size_t i = 0; i < p.size(); ++i) {
        const double gi = g.values()[i];
        m[i] = 0.9 * m[i] + 0.1 * gi;
        v[i] = 0.99 * v[i] + 0.01 * gi * gi;
        p[i] = p[i] * (1 - 0.01 * 0.1) - 0.01 * (m[i] / (1 - std::pow(0.9, t))) /
                                             (std::sqrt(v[i] / (1 - std::pow(0.99, t))) + 1e-8);
      }
    }
    // fp32 against float64 on elementwise arithmetic: 1e-6 relative.
    const Matrix expected(rows, cols, std::vector<float>(p.begin(), p.end()));
    EXPECT_LE(relative_error(params[static_cast<std::size_t>(k)].view(), expected.view()), 1e-6)
        << k;
  }
}

TEST(MuonUpdate, RegistrationErrorsAreClear) {
  Muon opt(MuonOptions{.tp_mode = TpMode::kDuplicated}, local_communicator(), cpu_compute());
  Matrix local(4, 4);
  ParamSpec s;
  s.name = "w";
  s.local = local.view();
  s.rows = 8;  // a full 8 x 4 weight cannot have a 4 x 4 shard without sharding
  s.cols = 4;
  EXPECT_NE(error_of([&] { opt.add_parameter(s); }).find("local shard is 4x4"), std::string::npos);
  s.rows = 4;
  opt.add_parameter(s);
  EXPECT_NE(error_of([&] { opt.add_parameter(s); }).find("already registered"), std::string::npos);
  const Matrix g(3, 4);
  const ConstMatrixView grads[] = {g.view()};
  EXPECT_THROW(opt.step(grads), CollectiveError);
}

TEST(MuonUpdate, StepStatsAreRecorded) {
  Muon opt(MuonOptions{.tp_mode = TpMode::kDuplicated}, local_communicator(), cpu_compute());
  Matrix p(8, 8);
  ParamSpec s;
  s.name = "w";
  s.local = p.view();
  s.rows = 8;
  s.cols = 8;
  opt.add_parameter(s);
  const Matrix g = test::random_matrix(8, 8, 3);
  const ConstMatrixView grads[] = {g.view()};
  opt.step(grads);
  EXPECT_GT(opt.last_step_stats().total_s, 0.0);
  EXPECT_GE(opt.last_step_stats().total_s, opt.last_step_stats().comm_s);
}

TEST(MuonUpdate, SetOptionsChangesTheNextStepsAndRefusesPlanFields) {
  // Two optimizers on the same weights and gradients: one built with the final options, one
  // switched to them by set_options before its second step. Equal bit for bit afterwards.
  MuonOptions first{.momentum = 0.95, .tp_mode = TpMode::kDuplicated};
  MuonOptions second = first;
  second.lr = 0.05;
  second.momentum = 0.5;
  second.nesterov = false;
  second.steps = 4;
  second.eps = 1e-3;
  second.scale_mode = ScaleMode::kShapeScaling;
  Muon a(first, local_communicator(), cpu_compute());
  Muon b(second, local_communicator(), cpu_compute());
  Matrix pa = test::random_matrix(6, 9, 7), pb = Matrix::from(pa.view());
  ParamSpec s{.name = "w", .local = pa.view(), .rows = 6, .cols = 9};
  a.add_parameter(s);
  s.local = pb.view();
  b.add_parameter(s);
  const Matrix g1 = test::random_matrix(6, 9, 8), g2 = test::random_matrix(6, 9, 9);
  const ConstMatrixView s1[] = {g1.view()}, s2[] = {g2.view()};
  a.step(s1);
  a.set_options(second);
  EXPECT_EQ(a.options().momentum, 0.5);
  // b: the first step under the first options too, by the same switch the other way round.
  b.set_options(first);
  b.step(s1);
  b.set_options(second);
  a.step(s2);
  b.step(s2);
  EXPECT_EQ(relative_error(pa.view(), pb.view()), 0.0);
  MuonOptions planned = second;
  planned.tp_mode = TpMode::kOwner;
  EXPECT_NE(error_of([&] { a.set_options(planned); }).find("tp_mode is fixed"), std::string::npos);
  MuonOptions bad = second;
  bad.eps = 0;
  EXPECT_NE(error_of([&] { a.set_options(bad); }).find("eps"), std::string::npos);
  EXPECT_EQ(a.options().eps, 1e-3);  // nothing changed on a refusal
}

TEST(MuonUpdate, InactiveParametersDoNotStep) {
  Muon opt(MuonOptions{.weight_decay = 0.1, .tp_mode = TpMode::kDuplicated}, local_communicator(),
           cpu_compute());
  Matrix w = test::random_matrix(5, 7, 1), bias = test::random_matrix(5, 1, 2);
  opt.add_parameter(ParamSpec{.name = "w", .local = w.view(), .rows = 5, .cols = 7});
  opt.add_parameter(ParamSpec{
      .name = "b", .local = bias.view(), .rows = 5, .cols = 1, .role = ParamRole::kOther});
  const Matrix gw = test::random_matrix(5, 7, 3), gb = test::random_matrix(5, 1, 4);
  const ConstMatrixView grads[] = {gw.view(), gb.view()};
  const Matrix w0 = Matrix::from(w.view()), b0 = Matrix::from(bias.view());
  const std::uint8_t only_bias[] = {0, 1};
  opt.step(grads, {}, only_bias);
  EXPECT_EQ(relative_error(w.view(), w0.view()), 0.0);  // no decay, no momentum either
  EXPECT_GT(relative_error(bias.view(), b0.view()), 0.0);
  const Matrix momentum = Matrix::from(opt.state_tensors(0)[0]);
  for (float v : momentum.values())
    EXPECT_EQ(v, 0.0f);
  const std::uint8_t wrong[] = {1};
  EXPECT_THROW(opt.step(grads, {}, wrong), CollectiveError);
}

}  // namespace
}  // namespace distmuon
