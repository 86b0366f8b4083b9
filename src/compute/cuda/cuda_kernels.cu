// The CUDA backend's elementwise kernels and reductions (cuda_kernels.h). Elementwise kernels
// walk the rows x cols elements of a view with a two-dimensional grid-stride loop (rows over the
// grid's y, columns over x: an element's address is i * ld + j, no division per element); they
// evaluate the same float expressions, in the same order, as the CPU backend
// (src/compute/cpu/cpu_compute.cpp), and this file is compiled without contraction into fused
// multiply-adds (-fmad=false), so that their results are bit-equal to the CPU backend's.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "compute/cuda/cuda_kernels.h"

namespace distmuon::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 4096;

constexpr std::int64_t kMaxRowBlocks = 65535;  // the grid's y limit

// The grid of a rows x cols walk: enough x blocks for a row, y blocks for the rows, at most
// kMaxBlocks blocks in all (each thread then strides over both).
dim3 grid_for(std::int64_t rows, std::int64_t cols) {
  std::int64_t x = (cols + kThreads - 1) / kThreads;
  x = x < kMaxBlocks ? x : kMaxBlocks;
  std::int64_t y = kMaxBlocks / x;
  y = y < rows ? y : rows;
  y = y < kMaxRowBlocks ? y : kMaxRowBlocks;
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(y < 1 ? 1 : y));
}

// Runs f(i, j) for every element (i, j) of a rows x cols view.
template <class F>
__global__ void each_element(std::int64_t rows, std::int64_t cols, F f) {
  const std::int64_t col_stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  const std::int64_t j0 = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  for (std::int64_t i = blockIdx.y; i < rows; i += gridDim.y) {
    for (std::int64_t j = j0; j < cols; j += col_stride)
      f(i, j);
  }
}

template <class F>
cudaError_t launch(cudaStream_t s, std::int64_t rows, std::int64_t cols, F f) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  each_element<<<grid_for(rows, cols), kThreads, 0, s>>>(rows, cols, f);
  return cudaGetLastError();
}

struct ScaleOp {
  Dev a;
  float alpha;
  __device__ void operator()(std::int64_t i, std::int64_t j) const {
    float& x = a.data[i * a.ld + j];
    x = alpha == 0.0f ? 0.0f : x * alpha;
  }
};

// Compute::normalize's scale from the sum of squares in device memory: the factor (one sqrt and
// one double division) is computed once per block by its first thread and shared, so that no
// element pays them; then a grid-stride walk as each_element's.
__global__ void norm_scale_kernel(Dev a, const double* sum, double eps) {
  __shared__ float alpha;
  __shared__ bool finite;
  if (threadIdx.x == 0) {
    const double ss = *sum;
    // Not finite: infinite or NaN (a comparison with NaN is false).
    finite = ss <= 1.7976931348623157e308;
    const double norm = finite ? sqrt(ss) : 0.0;
    alpha = static_cast<float>(1.0 / (norm < eps ? eps : norm));  // std::max(norm, eps)
  }
  __syncthreads();
  const std::int64_t col_stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  const std::int64_t j0 = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  for (std::int64_t i = blockIdx.y; i < a.rows; i += gridDim.y) {
    for (std::int64_t j = j0; j < a.cols; j += col_stride) {
      float& x = a.data[i * a.ld + j];
      if (!finite) {
        x = __int_as_float(0x7fc00000);  // quiet NaN: the caller's check finds it
      } else {
        x = alpha == 0.0f ? 0.0f : x * alpha;
      }
    }
  }
}

struct AxpbyOp {
  float alpha;
  ConstDev x;
  float beta;
  Dev y;
  __device__ void operator()(std::int64_t i, std::int64_t j) const {
    const float xv = x.data[i * x.ld + j];
    float& yv = y.data[i * y.ld + j];
    yv = beta == 0.0f ? alpha * xv : alpha * xv + beta * yv;
  }
};

// Compute::ns_polynomial: p = (b * gram + 1 * p) + a on the diagonal, the order of the default's
// axpby then add_diagonal (src/compute/ns_polynomial.cpp), in one pass.
struct PolynomialOp {
  float a, b;
  ConstDev gram;
  Dev p;
  __device__ void operator()(std::int64_t i, std::int64_t j) const {
    float& pv = p.data[i * p.ld + j];
    float v = b * gram.data[i * gram.ld + j] + 1.0f * pv;
    if (i == j) v += a;
    pv = v;
  }
};

struct DiagonalOp {
  Dev a;
  float alpha;
  __device__ void operator()(std::int64_t i, std::int64_t) const { a.data[i * a.ld + i] += alpha; }
};

struct FillOp {
  Dev a;
  float value;
  __device__ void operator()(std::int64_t i, std::int64_t j) const { a.data[i * a.ld + j] = value; }
};

// round_to (precision.h) on the bits, as the CPU backends do it: bf16 round to nearest even,
// tf32 round to nearest with ties away from zero; infinities and NaN kept.
struct RoundOp {
  Dev a;
  bool bf16;
  __device__ void operator()(std::int64_t i, std::int64_t j) const {
    float& x = a.data[i * a.ld + j];
    const unsigned bits = __float_as_uint(x);
    if ((bits & 0x7f800000u) == 0x7f800000u) return;
    x = __uint_as_float(bf16 ? (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u
                             : (bits + 0x1000u) & 0xffffe000u);
  }
};

struct MomentumOp {
  MomentumArgs k;
  ConstDev g, w;
  Dev buf, u;
  __device__ void operator()(std::int64_t i, std::int64_t j) const {
    const float mu = k.momentum;
    const float gij = g.data[i * g.ld + j] + k.l2 * w.data[i * w.ld + j];
    float& br = buf.data[i * buf.ld + j];
    const float b = mu * br + (1.0f - mu) * gij;
    br = b;
    u.data[i * u.ld + j] = k.nesterov ? (1.0f - mu) * gij + mu * b : b;
  }
};

struct AdamWOp {
  AdamWArgs k;
  ConstDev g;
  Dev m, v, p;
  __device__ void operator()(std::int64_t i, std::int64_t j) const {
    const float gij = g.data[i * g.ld + j];
    float& mr = m.data[i * m.ld + j];
    float& vr = v.data[i * v.ld + j];
    float& pr = p.data[i * p.ld + j];
    mr = k.beta1 * mr + (1.0f - k.beta1) * gij;
    vr = k.beta2 * vr + (1.0f - k.beta2) * gij * gij;
    const float denom = sqrtf(vr) / k.bias2_sqrt + k.eps;
    pr = pr * k.decay - k.lr * (mr / k.bias1) / denom;
  }
};

struct ToBf16Op {
  ConstDev a;
  __nv_bfloat16* dst;
  __device__ void operator()(std::int64_t i, std::int64_t j) const {
    dst[i * a.cols + j] = __float2bfloat16_rn(a.data[i * a.ld + j]);
  }
};

struct FromBf16Op {
  const __nv_bfloat16* src;
  Dev a;
  __device__ void operator()(std::int64_t i, std::int64_t j) const {
    a.data[i * a.ld + j] = __bfloat162float(src[i * a.cols + j]);
  }
};

// The lower triangle of c from its upper one, one 32 x 32 tile at a time through shared memory
// so that both the reads and the writes are coalesced. Tiles above the diagonal do nothing.
constexpr int kTile = 32, kTileRows = 8;
template <class T>
__global__ void mirror_kernel(T* data, std::int64_t n, std::int64_t ld) {
  __shared__ T tile[kTile][kTile + 1];
  const int bi = blockIdx.y, bj = blockIdx.x;  // the destination tile (rows bi, columns bj)
  if (bj > bi) return;
  // Read the source tile (rows bj, columns bi) of the upper triangle.
  for (int r = threadIdx.y; r < kTile; r += kTileRows) {
    const std::int64_t i = static_cast<std::int64_t>(bj) * kTile + r;
    const std::int64_t j = static_cast<std::int64_t>(bi) * kTile + threadIdx.x;
    if (i < n && j < n) tile[r][threadIdx.x] = data[i * ld + j];
  }
  __syncthreads();
  for (int r = threadIdx.y; r < kTile; r += kTileRows) {
    const std::int64_t i = static_cast<std::int64_t>(bi) * kTile + r;
    const std::int64_t j = static_cast<std::int64_t>(bj) * kTile + threadIdx.x;
    if (i < n && j < n && j < i) data[i * ld + j] = tile[threadIdx.x][r];
  }
}

__global__ void upper_block_pointers_kernel(const char* a, std::int64_t a_step, char* c,
                                            std::int64_t c_row_step, std::int64_t c_col_step, int t,
                                            const void** row_block, const void** col_block,
                                            void** c_block) {
  int p = 0;
  for (int i = 0; i < t; ++i) {
    for (int j = i; j < t; ++j, ++p) {
      if (p != static_cast<int>(threadIdx.x)) continue;
      row_block[p] = a + i * a_step;
      col_block[p] = a + j * a_step;
      c_block[p] = c + i * c_row_step + j * c_col_step;
    }
  }
}

template <class T>
__device__ T block_sum(T v) {
  __shared__ T part[kThreads / 32];
  for (int o = 16; o > 0; o /= 2)
    v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = threadIdx.x < kThreads / 32 ? part[threadIdx.x] : T(0);
  if (warp == 0) {
    for (int o = 16; o > 0; o /= 2)
      v += __shfl_down_sync(0xffffffffu, v, o);
  }
  return v;  // the block's sum in thread 0
}

template <class T>
__global__ void sum_squares_kernel(ConstDev a, double* out) {
  const std::int64_t col_stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  const std::int64_t j0 = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  T s = 0;
  for (std::int64_t i = blockIdx.y; i < a.rows; i += gridDim.y) {
    for (std::int64_t j = j0; j < a.cols; j += col_stride) {
      const T x = a.data[i * a.ld + j];
      s += x * x;
    }
  }
  s = block_sum(s);
  if (threadIdx.x == 0) atomicAdd(out, static_cast<double>(s));
}

// The first non-finite element's row-major index i * cols + j (atomicMin over the threads).
__global__ void find_non_finite_kernel(ConstDev a, unsigned long long* out) {
  const std::int64_t col_stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  const std::int64_t j0 = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  for (std::int64_t i = blockIdx.y; i < a.rows; i += gridDim.y) {
    for (std::int64_t j = j0; j < a.cols; j += col_stride) {
      if (!isfinite(a.data[i * a.ld + j])) {
        atomicMin(out, static_cast<unsigned long long>(i * a.cols + j));
        return;  // this thread's later elements have larger indices
      }
    }
  }
}

}  // namespace

cudaError_t scale(cudaStream_t s, Dev a, float alpha) {
  return launch(s, a.rows, a.cols, ScaleOp{a, alpha});
}
cudaError_t scale_by_norm(cudaStream_t s, Dev a, const double* sum, double eps) {
  if (a.rows <= 0 || a.cols <= 0) return cudaSuccess;
  norm_scale_kernel<<<grid_for(a.rows, a.cols), kThreads, 0, s>>>(a, sum, eps);
  return cudaGetLastError();
}
cudaError_t axpby(cudaStream_t s, float alpha, ConstDev x, float beta, Dev y) {
  return launch(s, y.rows, y.cols, AxpbyOp{alpha, x, beta, y});
}
cudaError_t add_diagonal(cudaStream_t s, Dev a, float alpha) {
  const std::int64_t n = a.rows < a.cols ? a.rows : a.cols;
  return launch(s, n, 1, DiagonalOp{a, alpha});
}
cudaError_t ns_polynomial(cudaStream_t s, float a, float b, ConstDev gram, Dev p) {
  return launch(s, p.rows, p.cols, PolynomialOp{a, b, gram, p});
}
cudaError_t round(cudaStream_t s, Dev a, bool bf16) {
  return launch(s, a.rows, a.cols, RoundOp{a, bf16});
}
cudaError_t fill(cudaStream_t s, Dev a, float value) {
  return launch(s, a.rows, a.cols, FillOp{a, value});
}
cudaError_t muon_momentum(cudaStream_t s, MomentumArgs k, ConstDev g, ConstDev w, Dev buf, Dev u) {
  return launch(s, g.rows, g.cols, MomentumOp{k, g, w, buf, u});
}
cudaError_t adamw(cudaStream_t s, AdamWArgs k, ConstDev g, Dev m, Dev v, Dev p) {
  return launch(s, g.rows, g.cols, AdamWOp{k, g, m, v, p});
}
cudaError_t to_bf16(cudaStream_t s, ConstDev a, void* dst) {
  return launch(s, a.rows, a.cols, ToBf16Op{a, static_cast<__nv_bfloat16*>(dst)});
}
cudaError_t from_bf16(cudaStream_t s, const void* src, Dev a) {
  return launch(s, a.rows, a.cols, FromBf16Op{static_cast<const __nv_bfloat16*>(src), a});
}

cudaError_t upper_block_pointers(cudaStream_t s, const void* a, std::int64_t a_step, void* c,
                                 std::int64_t c_row_step, std::int64_t c_col_step, int t,
                                 const void** row_block, const void** col_block, void** c_block) {
  upper_block_pointers_kernel<<<1, t*(t + 1) / 2, 0, s>>>(
      static_cast<const char*>(a), a_step, static_cast<char*>(c), c_row_step, c_col_step, t,
      row_block, col_block, c_block);
  return cudaGetLastError();
}

cudaError_t mirror_upper(cudaStream_t s, Dev c) {
  if (c.rows <= 1) return cudaSuccess;
  const auto tiles = static_cast<unsigned>((c.rows + kTile - 1) / kTile);
  mirror_kernel<float><<<dim3(tiles, tiles), dim3(kTile, kTileRows), 0, s>>>(c.data, c.rows, c.ld);
  return cudaGetLastError();
}

cudaError_t mirror_upper_bf16(cudaStream_t s, void* c, std::int64_t n, std::int64_t ld) {
  if (n <= 1) return cudaSuccess;
  const auto tiles = static_cast<unsigned>((n + kTile - 1) / kTile);
  mirror_kernel<__nv_bfloat16>
      <<<dim3(tiles, tiles), dim3(kTile, kTileRows), 0, s>>>(static_cast<__nv_bfloat16*>(c), n, ld);
  return cudaGetLastError();
}

cudaError_t sum_squares(cudaStream_t s, ConstDev a, bool in_double, double* out) {
  const std::int64_t n = a.rows * a.cols;
  if (n <= 0) return cudaSuccess;
  if (in_double) {
    sum_squares_kernel<double><<<grid_for(a.rows, a.cols), kThreads, 0, s>>>(a, out);
  } else {
    sum_squares_kernel<float><<<grid_for(a.rows, a.cols), kThreads, 0, s>>>(a, out);
  }
  return cudaGetLastError();
}

cudaError_t find_non_finite(cudaStream_t s, ConstDev a, unsigned long long* out) {
  const std::int64_t n = a.rows * a.cols;
  if (n <= 0) return cudaSuccess;
  find_non_finite_kernel<<<grid_for(a.rows, a.cols), kThreads, 0, s>>>(a, out);
  return cudaGetLastError();
}

}  // namespace distmuon::cuda
