#pragma once
// AdamW for the parameters Muon does not orthogonalise: embeddings, output heads, 1-D
// parameters (biases, norm gains) and any parameter registered with use_muon = false.
//
// Per element, at 1-based step t:
//   p <- p (1 - lr wd)                                   (decoupled weight decay)
//   m <- b1 m + (1 - b1) g,   v <- b2 v + (1 - b2) g^2
//   p <- p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// AdamW is elementwise, so a sharded parameter needs no communication.

#include <cstdint>
#include <limits>
#include <optional>
#include <span>

#include "distmuon/compute.h"
#include "distmuon/matrix.h"

namespace distmuon {

// The largest finite float32 (3.4e38): settings are applied as float32 factors, so each must be
// (and so must the factors made of them, such as 1 - lr x weight_decay) at most this.
inline constexpr double kMaxFloat32 = std::numeric_limits<float>::max();
// bfloat16's largest finite value, (2 - 2^-7) 2^127 (bits 0x7f7f).
inline constexpr double kMaxBfloat16 = 3.3895313892515355e38;

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;

  void validate() const;  // throws distmuon::Error naming the field and its valid range
};

// Where an AdamW step with gradient g would take the second moment b2 v + (1 - b2) g^2 of a finite
// gradient past float32's range (g of about 8e19 and more at beta2 = 0.95): the first such
// element, or nothing. One batched sum of squares of every g and v (one transfer on a device
// backend) bounds every element (b2 ||v||_2 + (1 - b2) ||g||_2^2); only a parameter over that
// bound is read on the host and checked element by element (in double, refused within 1e-6 of
// the range). The caller refuses the step before anything is written (Muon::step names the
// parameter, agreed over the world). grads[i] and exp_avg_sq[i] have the same shape.
struct AdamWOverflow {
  std::size_t index = 0;  // into grads
  MatrixIndex at;         // the element
  float grad = 0;         // its gradient
};
std::optional<AdamWOverflow> adamw_overflow(std::span<const ConstMatrixView> grads,
                                            std::span<const ConstMatrixView> exp_avg_sq,
                                            const AdamWOptions& options, Compute& compute);
// The same with the sums of squares (in double) of grads and exp_avg_sq given, from a batch the
// caller shares with other checks.
std::optional<AdamWOverflow> adamw_overflow(std::span<const ConstMatrixView> grads,
                                            std::span<const ConstMatrixView> exp_avg_sq,
                                            std::span<const double> grad_sums,
                                            std::span<const double> exp_avg_sq_sums,
                                            const AdamWOptions& options, Compute& compute);

// One AdamW step on compute (Compute::adamw). p, g, exp_avg and exp_avg_sq have the same shape
// and live in compute's memory; step >= 1.
void adamw_update(MatrixView p, ConstMatrixView g, MatrixView exp_avg, MatrixView exp_avg_sq,
                  std::int64_t step, const AdamWOptions& options, Compute& compute);

}  // namespace distmuon
