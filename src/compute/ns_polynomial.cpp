// Compute::ns_polynomial's default (compute.h): the rounding order of the CUDA backend's fused
// polynomial kernel (src/compute/cuda/cuda_kernels.cu, PolynomialOp) as two elementwise passes,
// so that the CPU and opaque backends, and with them the precision bounds of docs/precision.md
// measured on the CPU, see the same bits as the GPU.
#include <fmt/format.h>

#include "distmuon/compute.h"
#include "distmuon/error.h"

namespace distmuon {

void Compute::ns_polynomial(float a, float b, ConstMatrixView gram, MatrixView p) {
  if (gram.rows != gram.cols || p.rows != gram.rows || p.cols != gram.cols) {
    throw Error(
        fmt::format("ns_polynomial: the Gram matrix {} and the polynomial {} must be the "
                    "same square shape",
                    shape_str(gram), shape_str(p.rows, p.cols)));
  }
  axpby(b, gram, 1.0f, p);  // b * gram + 1 * p: the product by 1 is exact
  add_diagonal(p, a);
}

}  // namespace distmuon
