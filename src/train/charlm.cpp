// Forward and backward of the character-level model (see distmuon/charlm.h for the maths).
// Matrix products go through the Compute interface; elementwise steps are plain loops.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "distmuon/charlm.h"
#include "distmuon/error.h"

namespace distmuon {
namespace {

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

// y = x / sqrt(mean(x^2) + eps) per row; inv_rms[b] = 1 / sqrt(mean(x_b^2) + eps).
void rmsnorm_forward(ConstMatrixView x, float eps, MatrixView y, std::vector<float>& inv_rms) {
  for (Index b = 0; b < x.rows; ++b) {
    const float* xr = x.data + b * x.ld;
    double ss = 0.0;
    for (Index j = 0; j < x.cols; ++j)
      ss += static_cast<double>(xr[j]) * xr[j];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(x.cols) + eps));
    inv_rms[static_cast<std::size_t>(b)] = r;
    float* yr = y.data + b * y.ld;
    for (Index j = 0; j < x.cols; ++j)
      yr[j] = xr[j] * r;
  }
}

// dx (+)= r dy - r^3 x (dy . x) / H per row, the gradient of rmsnorm_forward.
void rmsnorm_backward(ConstMatrixView x, const std::vector<float>& inv_rms, ConstMatrixView dy,
                      MatrixView dx, bool accumulate) {
  for (Index b = 0; b < x.rows; ++b) {
    const float* xr = x.data + b * x.ld;
    const float* dyr = dy.data + b * dy.ld;
    float* dxr = dx.data + b * dx.ld;
    double dot = 0.0;
    for (Index j = 0; j < x.cols; ++j)
      dot += static_cast<double>(dyr[j]) * xr[j];
    const float r = inv_rms[static_cast<std::size_t>(b)];
    const float k =
        static_cast<float>(static_cast<double>(r) * r * r * dot / static_cast<double>(x.cols));
    for (Index j = 0; j < x.cols; ++j) {
      const float g = r * dyr[j] - k * xr[j];
      dxr[j] = accumulate ? dxr[j] + g : g;
    }
  }
}

// In place: a = GELU(a) = a Phi(a); when grad is not null it receives GELU'(a) = Phi(a) + a phi(a).
void gelu_forward(MatrixView a, Matrix* grad) {
  for (Index i = 0; i < a.rows; ++i) {
    float* row = a.data + i * a.ld;
    float* g = grad != nullptr ? grad->data() + i * grad->cols() : nullptr;
    for (Index j = 0; j < a.cols; ++j) {
      const double x = row[j];
      const double cdf = 0.5 * (1.0 + std::erf(x * kInvSqrt2));
      if (g != nullptr) g[j] = static_cast<float>(cdf + x * kInvSqrt2Pi * std::exp(-0.5 * x * x));
      row[j] = static_cast<float>(x * cdf);
    }
  }
}

void check_shape(const char* what, const Matrix& m, Index rows, Index cols) {
  if (m.rows() != rows || m.cols() != cols) {
    throw Error(fmt::format("charlm: {} is {}, the config needs {}", what, shape_str(m.view()),
                            shape_str(rows, cols)));
  }
}

void check_weights(const char* what, const CharLmConfig& c, const CharLmWeights& w) {
  if (w.fc1.size() != static_cast<std::size_t>(c.layers) ||
      w.fc2.size() != static_cast<std::size_t>(c.layers)) {
    throw Error(fmt::format("charlm: {} have {}/{} fc1/fc2 matrices, the config has {} layers",
                            what, w.fc1.size(), w.fc2.size(), c.layers));
  }
  const auto infos = charlm_param_infos(c);
  const auto list = w.list();
  for (std::size_t p = 0; p < infos.size(); ++p) {
    check_shape(fmt::format("{} {}", what, infos[p].name).c_str(), *list[p], infos[p].rows,
                infos[p].cols);
  }
}

}  // namespace

CharLm::CharLm(CharLmConfig config) : config_(config) {
  config_.validate();
}

double CharLm::forward_flops_per_window(const CharLmConfig& c) {
  const double h = c.hidden, f = c.ffn;
  return 2.0 *
         (static_cast<double>(c.context) * c.embed * h + c.layers * 2.0 * h * f + h * c.vocab);
}

void CharLm::check(const CharLmWeights& w, const CharBatch& batch,
                   const CharLmWeights* grads) const {
  check_weights("weights", config_, w);
  if (grads != nullptr) check_weights("gradients", config_, *grads);
  if (batch.context != config_.context) {
    throw Error(fmt::format("charlm: batch context {} differs from the model's {}", batch.context,
                            config_.context));
  }
  if (batch.tokens.size() != batch.targets.size() * static_cast<std::size_t>(config_.context)) {
    throw Error(fmt::format("charlm: batch of {} targets holds {} tokens, expected {} x {}",
                            batch.targets.size(), batch.tokens.size(), batch.targets.size(),
                            config_.context));
  }
  const auto bad = [&](std::int32_t t) { return t < 0 || t >= config_.vocab; };
  for (const auto* ids : {&batch.tokens, &batch.targets}) {
    if (const auto it = std::find_if(ids->begin(), ids->end(), bad); it != ids->end()) {
      throw Error(
          fmt::format("charlm: token id {} outside the vocabulary [0, {})", *it, config_.vocab));
    }
  }
}

void CharLm::resize(Index batch) {
  if (batch == batch_) return;
  const Index h = config_.hidden, f = config_.ffn,
              ce = static_cast<Index>(config_.context) * config_.embed;
  x0_ = Matrix(batch, ce);
  d_x0_ = Matrix(batch, ce);
  stream_.assign(static_cast<std::size_t>(config_.layers) + 1, Matrix(batch, h));
  blocks_.assign(static_cast<std::size_t>(config_.layers),
                 Block{std::vector<float>(static_cast<std::size_t>(batch)), Matrix(batch, h),
                       Matrix(batch, f), Matrix(batch, f)});
  final_inv_rms_.assign(static_cast<std::size_t>(batch), 0.0f);
  final_normed_ = Matrix(batch, h);
  probs_ = Matrix(batch, config_.vocab);
  d_stream_ = Matrix(batch, h);
  d_normed_ = Matrix(batch, h);
  d_act_ = Matrix(batch, f);
  batch_ = batch;
}

double CharLm::forward_backward(const CharLmWeights& w, const CharBatch& batch,
                                CharLmWeights* grads, Compute& compute) {
  check(w, batch, grads);
  const Index n = batch.size();
  if (n == 0) throw Error("charlm: empty batch (the mean loss is undefined)");
  resize(n);
  const Index e = config_.embed, c = config_.context;

  for (Index b = 0; b < n; ++b) {
    for (Index j = 0; j < c; ++j) {
      const float* src = w.embedding.data() + batch.tokens[static_cast<std::size_t>(b * c + j)] * e;
      std::copy(src, src + e, x0_.data() + b * x0_.cols() + j * e);
    }
  }
  compute.gemm(Trans::kNo, Trans::kYes, 1.0f, x0_, w.input, 0.0f, stream_[0]);
  for (std::size_t l = 0; l < blocks_.size(); ++l) {
    Block& blk = blocks_[l];
    rmsnorm_forward(stream_[l], config_.norm_eps, blk.normed, blk.inv_rms);
    compute.gemm(Trans::kNo, Trans::kYes, 1.0f, blk.normed, w.fc1[l], 0.0f, blk.act);
    gelu_forward(blk.act, grads != nullptr ? &blk.gelu_grad : nullptr);
    copy(stream_[l], stream_[l + 1]);
    compute.gemm(Trans::kNo, Trans::kYes, 1.0f, blk.act, w.fc2[l], 1.0f, stream_[l + 1]);
  }
  rmsnorm_forward(stream_.back(), config_.norm_eps, final_normed_, final_inv_rms_);
  compute.gemm(Trans::kNo, Trans::kYes, 1.0f, final_normed_, w.head, 0.0f, probs_);

  // Softmax cross-entropy per row; probs_ then holds d(mean loss)/d(logits) = (p - onehot) / B.
  double total = 0.0;
  const Index v = config_.vocab;
  for (Index b = 0; b < n; ++b) {
    float* row = probs_.data() + b * v;
    const float mx = *std::max_element(row, row + v);
    double sum = 0.0;
    for (Index j = 0; j < v; ++j)
      sum += std::exp(static_cast<double>(row[j]) - mx);
    const std::int32_t target = batch.targets[static_cast<std::size_t>(b)];
    total += std::log(sum) + mx - row[target];
    if (grads != nullptr) {
      const double inv = 1.0 / (sum * static_cast<double>(n));
      for (Index j = 0; j < v; ++j)
        row[j] = static_cast<float>(std::exp(static_cast<double>(row[j]) - mx) * inv);
      row[target] -= static_cast<float>(1.0 / static_cast<double>(n));
    }
  }
  const double loss = total / static_cast<double>(n);
  if (!std::isfinite(loss)) throw Error(fmt::format("charlm: the loss is not finite ({})", loss));
  if (grads != nullptr) backward(w, batch, *grads, compute);
  return loss;
}

void CharLm::backward(const CharLmWeights& w, const CharBatch& batch, CharLmWeights& g,
                      Compute& compute) {
  compute.gemm(Trans::kYes, Trans::kNo, 1.0f, probs_, final_normed_, 0.0f, g.head);
  compute.gemm(Trans::kNo, Trans::kNo, 1.0f, probs_, w.head, 0.0f, d_normed_);
  rmsnorm_backward(stream_.back(), final_inv_rms_, d_normed_, d_stream_, false);
  for (std::size_t l = blocks_.size(); l-- > 0;) {
    const Block& blk = blocks_[l];
    // d_stream_ is d(loss)/d(stream_[l + 1]); the residual passes it straight to stream_[l].
    compute.gemm(Trans::kYes, Trans::kNo, 1.0f, d_stream_, blk.act, 0.0f, g.fc2[l]);
    compute.gemm(Trans::kNo, Trans::kNo, 1.0f, d_stream_, w.fc2[l], 0.0f, d_act_);
    for (Index i = 0; i < d_act_.size(); ++i)
      d_act_.data()[i] *= blk.gelu_grad.data()[i];
    compute.gemm(Trans::kYes, Trans::kNo, 1.0f, d_act_, blk.normed, 0.0f, g.fc1[l]);
    compute.gemm(Trans::kNo, Trans::kNo, 1.0f, d_act_, w.fc1[l], 0.0f, d_normed_);
    rmsnorm_backward(stream_[l], blk.inv_rms, d_normed_, d_stream_, true);
  }
  compute.gemm(Trans::kYes, Trans::kNo, 1.0f, d_stream_, x0_, 0.0f, g.input);
  compute.gemm(Trans::kNo, Trans::kNo, 1.0f, d_stream_, w.input, 0.0f, d_x0_);
  compute.scale(g.embedding, 0.0f);
  const Index e = config_.embed, c = config_.context;
  for (Index b = 0; b < batch.size(); ++b) {
    for (Index j = 0; j < c; ++j) {
      float* dst = g.embedding.data() + batch.tokens[static_cast<std::size_t>(b * c + j)] * e;
      const float* src = d_x0_.data() + b * d_x0_.cols() + j * e;
      for (Index k = 0; k < e; ++k)
        dst[k] += src[k];
    }
  }
}

}  // namespace distmuon
