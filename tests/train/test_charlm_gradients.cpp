// The model's hand-written backward against finite differences, for every element of every
// parameter of a tiny model.
//
// The finite differences are taken on a float64 forward written here from the definition (no
// BLAS), so they are accurate to ~1e-10 (central differences, step 1e-5: truncation ~1e-10,
// rounding ~1e-16 / 1e-5). The float32 backward is then expected within 1e-5 relative per
// parameter (Frobenius), and every element within 1e-5 of the parameter's largest gradient: its
// own rounding measures ~2e-7 relative on these sizes, while a wrong term (a missing factor, a
// transposed product, a dropped residual path) gives errors of order 1, and even a 0.1% error
// in the softmax gradient gives ~1e-3.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "distmuon/charlm.h"
#include "distmuon/error.h"

namespace distmuon {
namespace {

using Params = std::vector<std::vector<double>>;  // charlm_param_infos order, row-major

CharLmConfig tiny_config() {
  CharLmConfig c;
  c.vocab = 11;
  c.context = 3;
  c.embed = 4;
  c.hidden = 6;
  c.ffn = 10;
  c.layers = 2;
  return c;
}

CharBatch tiny_batch(const CharLmConfig& c, Index windows, unsigned salt) {
  CharBatch b;
  b.context = c.context;
  for (Index i = 0; i < windows * c.context; ++i)
    b.tokens.push_back(static_cast<std::int32_t>((i * 7 + salt) % c.vocab));
  for (Index i = 0; i < windows; ++i)
    b.targets.push_back(static_cast<std::int32_t>((i * 5 + 3 + salt) % c.vocab));
  return b;
}

Params to_double(const CharLmWeights& w) {
  Params p;
  for (const Matrix* m : w.list())
    p.emplace_back(m->values().begin(), m->values().end());
  return p;
}

std::vector<double> rmsnorm(const std::vector<double>& x, double eps) {
  double ss = 0;
  for (double v : x)
    ss += v * v;
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    y[i] = x[i] * r;
  return y;
}

// y = W x for a row-major [out, in] W.
std::vector<double> matvec(const std::vector<double>& w, const std::vector<double>& x,
                           std::size_t out) {
  std::vector<double> y(out, 0.0);
  const std::size_t in = x.size();
  for (std::size_t i = 0; i < out; ++i)
    for (std::size_t j = 0; j < in; ++j)
      y[i] += w[i * in + j] * x[j];
  return y;
}

// The model's mean loss, straight from the definition in float64.
double reference_loss(const CharLmConfig& c, const Params& p, const CharBatch& batch) {
  const auto e = static_cast<std::size_t>(c.embed), h = static_cast<std::size_t>(c.hidden);
  const auto f = static_cast<std::size_t>(c.ffn), v = static_cast<std::size_t>(c.vocab);
  const double eps = c.norm_eps;
  double total = 0;
  for (Index b = 0; b < batch.size(); ++b) {
    std::vector<double> x0;
    for (int j = 0; j < c.context; ++j) {
      const auto t =
          static_cast<std::size_t>(batch.tokens[static_cast<std::size_t>(b * c.context + j)]);
      x0.insert(x0.end(), p[0].begin() + static_cast<std::ptrdiff_t>(t * e),
                p[0].begin() + static_cast<std::ptrdiff_t>((t + 1) * e));
    }
    std::vector<double> x = matvec(p[1], x0, h);
    for (int l = 0; l < c.layers; ++l) {
      std::vector<double> a = matvec(p[2 + 2 * static_cast<std::size_t>(l)], rmsnorm(x, eps), f);
      for (double& z : a)
        z = z * 0.5 * (1.0 + std::erf(z / std::sqrt(2.0)));
      const std::vector<double> out = matvec(p[3 + 2 * static_cast<std::size_t>(l)], a, h);
      for (std::size_t i = 0; i < h; ++i)
        x[i] += out[i];
    }
    const std::vector<double> logits = matvec(p.back(), rmsnorm(x, eps), v);
    double mx = logits[0];
    for (double z : logits)
      mx = std::max(mx, z);
    double sum = 0;
    for (double z : logits)
      sum += std::exp(z - mx);
    total += std::log(sum) + mx -
             logits[static_cast<std::size_t>(batch.targets[static_cast<std::size_t>(b)])];
  }
  return total / static_cast<double>(batch.size());
}

double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

TEST(CharLmGradients, MatchFiniteDifferencesOfFloat64ForwardForEveryParameter) {
  const CharLmConfig c = tiny_config();
  const CharLmWeights w = init_charlm_weights(c, 3);
  const CharBatch batch = tiny_batch(c, 5, 0);  // 15 context tokens over 11 ids: embeddings repeat
  CharLm model(c);
  CharLmWeights grads = CharLmWeights::zeros(c);
  const double loss = model.forward_backward(w, batch, &grads, cpu_compute());

  Params p = to_double(w);
  // The float32 forward against the float64 one: ~1e-7 relative rounding per operation.
  EXPECT_NEAR(loss, reference_loss(c, p, batch), 1e-5 * std::abs(loss));

  const auto infos = charlm_param_infos(c);
  const auto glist = grads.list();
  constexpr double kStep = 1e-5;
  for (std::size_t q = 0; q < p.size(); ++q) {
    std::vector<double> fd(p[q].size());
    for (std::size_t i = 0; i < p[q].size(); ++i) {
      const double saved = p[q][i];
      p[q][i] = saved + kStep;
      const double up = reference_loss(c, p, batch);
      p[q][i] = saved - kStep;
      const double down = reference_loss(c, p, batch);
      p[q][i] = saved;
      fd[i] = (up - down) / (2 * kStep);
    }
    const std::vector<double> got(glist[q]->values().begin(), glist[q]->values().end());
    double scale = 0;
    for (double g : fd)
      scale = std::max(scale, std::abs(g));
    ASSERT_GT(scale, 1e-4) << infos[q].name << ": a zero gradient would make this check vacuous";
    EXPECT_LE(rel_error(got, fd), 1e-5) << infos[q].name;
    for (std::size_t i = 0; i < fd.size(); ++i) {
      ASSERT_NEAR(got[i], fd[i], 1e-5 * scale) << infos[q].name << " element " << i;
    }
  }
}

// The float32 model against its own loss, without the reference: the directional derivative
// along a random direction per parameter, by central differences in float32. The float loss's
// rounding (~1e-7 absolute) over the step (1e-2 times a direction scaled like the parameter) and
// the step's O(step^2) truncation give relative errors measured up to ~6e-4, so the check uses
// 5e-3. It covers a wider config than the float64 test (more layers, larger products).
TEST(CharLmGradients, DirectionalDerivativesOfFloat32LossMatchBackward) {
  CharLmConfig c;
  c.vocab = 40;
  c.context = 5;
  c.embed = 8;
  c.hidden = 24;
  c.ffn = 48;
  c.layers = 3;
  const CharLmWeights w = init_charlm_weights(c, 9);
  const CharBatch batch = tiny_batch(c, 32, 1);
  CharLm model(c);
  CharLmWeights grads = CharLmWeights::zeros(c);
  model.forward_backward(w, batch, &grads, cpu_compute());
  const CharLmWeights dir = init_charlm_weights(c, 1234);  // random, scaled like the parameters
  const auto infos = charlm_param_infos(c);
  for (std::size_t q = 0; q < infos.size(); ++q) {
    double analytic = 0;
    const Matrix& g = *grads.list()[q];
    const Matrix& d = *dir.list()[q];
    for (Index i = 0; i < g.size(); ++i)
      analytic += static_cast<double>(g.data()[i]) * d.data()[i];
    const float eps = 1e-2f;
    CharLmWeights plus = w, minus = w;
    Matrix& mp = *plus.list()[q];
    Matrix& mm = *minus.list()[q];
    for (Index i = 0; i < mp.size(); ++i) {
      mp.data()[i] += eps * d.data()[i];
      mm.data()[i] -= eps * d.data()[i];
    }
    const double numeric =
        (model.loss(plus, batch, cpu_compute()) - model.loss(minus, batch, cpu_compute())) /
        (2.0 * eps);
    EXPECT_NEAR(analytic, numeric, 5e-3 * std::abs(numeric) + 1e-6) << infos[q].name;
  }
}

TEST(CharLmGradients, GradientsAreOverwrittenAndForwardOnlyAgrees) {
  const CharLmConfig c = tiny_config();
  const CharLmWeights w = init_charlm_weights(c, 5);
  const CharBatch a = tiny_batch(c, 4, 2), b = tiny_batch(c, 7, 3);
  CharLm model(c);
  CharLmWeights g1 = CharLmWeights::zeros(c), g2 = CharLmWeights::zeros(c);
  const double la = model.forward_backward(w, a, &g1, cpu_compute());
  model.forward_backward(w, b, &g2,
                         cpu_compute());  // a different batch size in between (workspace resize)
  model.forward_backward(w, a, &g2, cpu_compute());
  for (std::size_t q = 0; q < g1.list().size(); ++q) {
    EXPECT_EQ(relative_error(g1.list()[q]->view(), g2.list()[q]->view()), 0.0) << "param " << q;
  }
  EXPECT_EQ(model.loss(w, a, cpu_compute()), la);
}

TEST(CharLmGradients, RejectsBadBatchesAndShapes) {
  const CharLmConfig c = tiny_config();
  const CharLmWeights w = init_charlm_weights(c, 5);
  CharLm model(c);
  CharBatch bad = tiny_batch(c, 2, 0);
  bad.tokens[1] = c.vocab;
  EXPECT_THROW(model.loss(w, bad, cpu_compute()), Error);
  bad = tiny_batch(c, 2, 0);
  bad.targets[0] = -1;
  EXPECT_THROW(model.loss(w, bad, cpu_compute()), Error);
  bad = tiny_batch(c, 2, 0);
  bad.context = c.context + 1;
  EXPECT_THROW(model.loss(w, bad, cpu_compute()), Error);
  CharBatch empty;
  empty.context = c.context;
  EXPECT_THROW(model.loss(w, empty, cpu_compute()), Error);
  CharLmWeights wrong = w;
  wrong.fc2[1] = Matrix(c.hidden, c.ffn + 1);
  EXPECT_THROW(model.loss(wrong, tiny_batch(c, 2, 0), cpu_compute()), Error);
}

}  // namespace
}  // namespace distmuon
