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

#include "distmuon/compute.h"
#include "distmuon/matrix.h"

namespace distmuon {

// The largest finite float32 (3.4e38): settings are applied as float32 factors, so each must be
// (and so must the factors made of them, such as 1 - lr x weight_decay) at most this.
inline constexpr double kMaxFloat32 = std::numeric_limits<float>::max();

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;

  void validate() const;  // throws distmuon::Error naming the field and its valid range
};

// One AdamW step on compute (Compute::adamw). p, g, exp_avg and exp_avg_sq have the same shape
// and live in compute's memory; step >= 1.
void adamw_update(MatrixView p, ConstMatrixView g, MatrixView exp_avg, MatrixView exp_avg_sq,
                  std::int64_t step, const AdamWOptions& options, Compute& compute);

}  // namespace distmuon
