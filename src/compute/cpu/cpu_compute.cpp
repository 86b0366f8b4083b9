// CPU compute backend over CBLAS (OpenBLAS); bf16 products through oneDNN (bf16_gemm.h).
#include <cblas.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "compute/cpu/bf16_gemm.h"
#include "compute/shape_checks.h"
#include "distmuon/blas_info.h"
#include "distmuon/compute.h"
#include "distmuon/error.h"

namespace distmuon {
namespace {

CBLAS_TRANSPOSE cblas_trans(Trans t) {
  return t == Trans::kYes ? CblasTrans : CblasNoTrans;
}
using detail::check_same;

std::once_flag threads_once;
void init_threads() {
  std::call_once(threads_once, [] {
    int threads = 1;
    const char* env = std::getenv("DISTMUON_BLAS_THREADS");
    if (env != nullptr && *env != '\0') {  // set and not empty (an empty value is unset)
      char* end = nullptr;
      const long v = std::strtol(env, &end, 10);
      if (end == env || *end != '\0' || v < 1 || v > 1024) {
        throw Error(
            fmt::format("DISTMUON_BLAS_THREADS='{}' is not a thread count in [1, 1024]", env));
      }
      threads = static_cast<int>(v);
    }
    openblas_set_num_threads(threads);
  });
}

// Once per process, at the first product: kernels below what the CPU supports (blas_info.h).
std::once_flag core_warning_once;
void warn_about_core_once() {
  std::call_once(core_warning_once, [] {
    if (const auto warning = blas_core_warning()) spdlog::warn("{}", *warning);
  });
}

// Copies the upper triangle of a square matrix into its lower one, in tiles so that the
// transposed reads stay in cache (about 5x faster than a row loop at n = 1024; it matters
// because NS mirrors two s x s matrices per step).
void mirror_upper(MatrixView c) {
  constexpr Index kTile = 64;
  const Index n = c.rows;
  for (Index bi = 0; bi < n; bi += kTile) {
    const Index ie = std::min(bi + kTile, n);
    for (Index bj = 0; bj <= bi; bj += kTile) {
      const Index je = std::min(bj + kTile, n);
      for (Index i = bi; i < ie; ++i) {
        float* row = c.data + i * c.ld;
        for (Index j = bj; j < std::min(je, i); ++j)
          row[j] = c.data[j * c.ld + i];
      }
    }
  }
}

// The sum of squares of a matrix's elements in T, in kLanes running sums (element j of a row goes
// to lane j mod kLanes), added pairwise at the end: a fixed order (the same bits on every machine
// and every call) that the compiler vectorises, where one running sum waits on each addition. Rows
// are added one at a time, so that a pass that reads them for more than the sum adds them as it
// goes (muon_directions).
template <typename T>
struct LaneSquares {
  static constexpr Index kLanes = 8;
  T lane[kLanes] = {};
  void add(const float* row, Index cols) {
    Index j = 0;
    if constexpr (std::is_same_v<T, double>) {
      // The lanes as four pairs of doubles (GCC's and Clang's vector extensions): the same
      // operations on each lane in the same order, which the compiler otherwise leaves scalar.
      using Pair = double __attribute__((vector_size(16)));
      using FloatPair = float __attribute__((vector_size(8)));
      Pair acc[kLanes / 2];
      std::memcpy(acc, lane, sizeof(acc));
      for (; j + kLanes <= cols; j += kLanes) {
        for (Index k = 0; k < kLanes / 2; ++k) {
          FloatPair f;
          std::memcpy(&f, row + j + 2 * k, sizeof(f));
          const Pair d = __builtin_convertvector(f, Pair);
          acc[k] += d * d;
        }
      }
      std::memcpy(lane, acc, sizeof(acc));
    } else {
      for (; j + kLanes <= cols; j += kLanes) {
        for (Index k = 0; k < kLanes; ++k)
          lane[k] += static_cast<T>(row[j + k]) * static_cast<T>(row[j + k]);
      }
    }
    for (; j < cols; ++j)
      lane[j % kLanes] += static_cast<T>(row[j]) * static_cast<T>(row[j]);
  }
  T total() const {
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
           ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
};

template <typename T>
T lane_sum_squares(ConstMatrixView a) {
  LaneSquares<T> sum;
  for (Index i = 0; i < a.rows; ++i)
    sum.add(a.data + i * a.ld, a.cols);
  return sum.total();
}

// Whether a row has a non-finite element: a branch-free scan (the compiler vectorises it).
bool has_non_finite(const float* row, Index cols) {
  std::uint32_t special = 0;
  for (Index j = 0; j < cols; ++j)
    special |= (std::bit_cast<std::uint32_t>(row[j]) & 0x7f800000u) == 0x7f800000u;
  return special != 0;
}

// The first non-finite element of a row: the scan first (every step checks its inputs), then the
// element's place only in a row that has one.
std::optional<Index> first_non_finite(const float* row, Index cols) {
  if (!has_non_finite(row, cols)) return std::nullopt;
  for (Index j = 0; j < cols; ++j) {
    if (!std::isfinite(row[j])) return j;
  }
  return std::nullopt;
}

// Muon's momentum step on one row (muon_momentum's formula, each operation in its order): the new
// momentum into buf_out (may be buf) and the direction into u (may be buf_out).
void momentum_row(const MomentumStep& k, const float* g, const float* w, const float* buf,
                  float* buf_out, float* u, Index cols) {
  const float mu = k.momentum, wd = k.l2;
  for (Index j = 0; j < cols; ++j) {
    const float gij = g[j] + wd * w[j];
    const float b = mu * buf[j] + (1.0f - mu) * gij;
    buf_out[j] = b;
    u[j] = k.nesterov ? (1.0f - mu) * gij + mu * b : b;
  }
}

// The direction only (buf read, not written).
void direction_row(const MomentumStep& k, const float* __restrict g, const float* __restrict w,
                   const float* __restrict buf, float* __restrict u, Index cols) {
  const float mu = k.momentum, wd = k.l2;
  if (k.nesterov) {
    for (Index j = 0; j < cols; ++j) {
      const float gij = g[j] + wd * w[j];
      const float b = mu * buf[j] + (1.0f - mu) * gij;
      u[j] = (1.0f - mu) * gij + mu * b;
    }
  } else {
    for (Index j = 0; j < cols; ++j)
      u[j] = mu * buf[j] + (1.0f - mu) * (g[j] + wd * w[j]);
  }
}

// The new momentum only, in place.
void advance_row(const MomentumStep& k, const float* __restrict g, const float* __restrict w,
                 float* __restrict buf, Index cols) {
  const float mu = k.momentum, wd = k.l2;
  for (Index j = 0; j < cols; ++j)
    buf[j] = mu * buf[j] + (1.0f - mu) * (g[j] + wd * w[j]);
}

class CpuCompute final : public Compute {
 public:
  std::string name() const override { return "cpu-openblas"; }
  MemoryKind memory() const override { return MemoryKind::kHost; }
  // One matrix's whole NS after the other: 1.4x faster than a loop per product for 64 experts of
  // 256 x 512 (bench_batched_ns; docs/data-parallel.md).
  bool batches_newton_schulz() const override { return false; }
  void copy_from_host(ConstMatrixView host, MatrixView dst) override { copy(host, dst); }
  void copy_to_host(ConstMatrixView src, MatrixView host) override { copy(src, host); }

  ~CpuCompute() override {
    for (Scratch& s : scratch_)
      release(s.data, s.count);
  }

  void do_gemm(Trans ta, Trans tb, float alpha, ConstMatrixView a, ConstMatrixView b, float beta,
               MatrixView c, Precision precision) override {
    init_threads();
    warn_about_core_once();
    const auto [m, n, k] = detail::check_gemm(ta, tb, a, b, c);
    if (m == 0 || n == 0) return;
    if (k == 0) {
      scale(c, beta);
      return;
    }
    std::unique_lock<std::mutex> lock;
    if (precision == Precision::kBf16 && detail::onednn_bf16_enabled()) {
      // bf16 copies of the operands (one when b is a), multiplied by oneDNN's bf16 kernels.
      lock = std::unique_lock(scratch_mutex_);
      const int threads = openblas_get_num_threads();
      const detail::Bf16Matrix a16 = bf16_copy(0, a, threads);
      const detail::Bf16Matrix b16 = same_matrix(a, b) ? a16 : bf16_copy(1, b, threads);
      detail::onednn_bf16_gemm(ta, tb, alpha, a16, b16, beta, c, onednn_scratchpad_, threads);
      return;
    }
    if (precision != Precision::kFp32) {
      // The emulation: sgemm (fp32 products and accumulation, fp32 output) on copies of the
      // operands rounded as the GPU rounds them (precision.h). One copy when b is a.
      lock = std::unique_lock(scratch_mutex_);
      const bool same = same_matrix(a, b);
      const ConstMatrixView ra = rounded(0, a, precision);
      b = same ? ra : rounded(1, b, precision);
      a = ra;
    }
    cblas_sgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), static_cast<blasint>(m),
                static_cast<blasint>(n), static_cast<blasint>(k), alpha, a.data,
                static_cast<blasint>(a.ld), b.data, static_cast<blasint>(b.ld), beta, c.data,
                static_cast<blasint>(c.ld));
  }

  void do_syrk(Trans ta, float alpha, ConstMatrixView a, float beta, MatrixView c,
               Precision precision) override {
    init_threads();
    warn_about_core_once();
    const auto [n, k] = detail::check_syrk(ta, a, c);
    if (n == 0) return;
    if (k == 0) {
      scale(c, beta);
      return;
    }
    std::unique_lock<std::mutex> lock;
    if (precision == Precision::kBf16 && detail::onednn_bf16_enabled()) {
      // The upper triangle from one bf16 copy, mirrored as ssyrk's.
      lock = std::unique_lock(scratch_mutex_);
      const int threads = openblas_get_num_threads();
      const detail::Bf16Matrix a16 = bf16_copy(0, a, threads);
      float* work = scratch(1, detail::bf16_syrk_work(n, threads));
      detail::onednn_bf16_syrk_upper(ta, alpha, a16, beta, c, work, onednn_scratchpad_, threads);
      mirror_upper(c);
      return;
    }
    if (precision != Precision::kFp32) {
      lock = std::unique_lock(scratch_mutex_);
      a = rounded(0, a, precision);
    }
    cblas_ssyrk(CblasRowMajor, CblasUpper, cblas_trans(ta), static_cast<blasint>(n),
                static_cast<blasint>(k), alpha, a.data, static_cast<blasint>(a.ld), beta, c.data,
                static_cast<blasint>(c.ld));
    mirror_upper(c);
  }

  double sum_squares(ConstMatrixView a, bool in_double) override {
    return in_double ? lane_sum_squares<double>(a) : lane_sum_squares<float>(a);
  }

  void scale(MatrixView a, float alpha) override {
    for (Index i = 0; i < a.rows; ++i) {
      float* row = a.data + i * a.ld;
      if (alpha == 0.0f) {
        for (Index j = 0; j < a.cols; ++j)
          row[j] = 0.0f;  // also clears NaN/Inf, like BLAS beta=0
      } else {
        for (Index j = 0; j < a.cols; ++j)
          row[j] *= alpha;
      }
    }
  }

  void axpby(float alpha, ConstMatrixView x, float beta, MatrixView y) override {
    if (x.rows != y.rows || x.cols != y.cols) {
      throw Error(
          fmt::format("axpby: shape mismatch {} vs {}", shape_str(x), shape_str(y.rows, y.cols)));
    }
    for (Index i = 0; i < y.rows; ++i) {
      const float* xr = x.data + i * x.ld;
      float* yr = y.data + i * y.ld;
      if (beta == 0.0f) {
        for (Index j = 0; j < y.cols; ++j)
          yr[j] = alpha * xr[j];
      } else {
        for (Index j = 0; j < y.cols; ++j)
          yr[j] = alpha * xr[j] + beta * yr[j];
      }
    }
  }

  void add_diagonal(MatrixView a, float alpha) override {
    if (a.rows != a.cols) {
      throw Error(fmt::format("add_diagonal: matrix {} is not square", shape_str(a.rows, a.cols)));
    }
    for (Index i = 0; i < a.rows; ++i)
      a(i, i) += alpha;
  }

  void round(MatrixView a, Precision precision) override {
    if (precision == Precision::kFp32) return;
    for (Index i = 0; i < a.rows; ++i) {
      float* row = a.data + i * a.ld;
      if (precision == Precision::kBf16) {
        detail::round_row_to_bf16(row, a.cols);  // round_to's bits, vectorised
        continue;
      }
      for (Index j = 0; j < a.cols; ++j)
        row[j] = round_to(precision, row[j]);
    }
  }

  void pack_bf16(ConstMatrixView a, float* dst) override {
    detail::to_bf16(a, reinterpret_cast<std::uint16_t*>(dst), 1);
  }
  void unpack_bf16(const float* src, MatrixView a) override {
    const auto* bits = reinterpret_cast<const std::uint16_t*>(src);
    for (Index i = 0; i < a.rows; ++i) {
      float* row = a.data + i * a.ld;
      for (Index j = 0; j < a.cols; ++j)
        row[j] = std::bit_cast<float>(static_cast<std::uint32_t>(*bits++) << 16);
    }
  }
  void fill(MatrixView a, float value) override {
    for (Index i = 0; i < a.rows; ++i)
      std::fill_n(a.data + i * a.ld, a.cols, value);
  }

  void copy(ConstMatrixView src, MatrixView dst) override {
    check_same("copy", "destination", dst, src);
    if (src.size() == 0 || src.data == dst.data) return;
    const auto row_bytes = sizeof(float) * static_cast<std::size_t>(src.cols);
    if (src.contiguous() && dst.contiguous()) {
      std::memmove(dst.data, src.data, row_bytes * static_cast<std::size_t>(src.rows));
      return;
    }
    for (Index i = 0; i < src.rows; ++i)
      std::memmove(dst.data + i * dst.ld, src.data + i * src.ld, row_bytes);
  }

  std::optional<MatrixIndex> find_non_finite(ConstMatrixView a) override {
    for (Index i = 0; i < a.rows; ++i) {
      if (const auto j = first_non_finite(a.data + i * a.ld, a.cols)) return MatrixIndex{i, *j};
    }
    return std::nullopt;
  }

  void muon_momentum(const MomentumStep& k, ConstMatrixView g, ConstMatrixView w, MatrixView buf,
                     MatrixView u) override {
    check_same("muon_momentum", "weight", w, g);
    check_same("muon_momentum", "momentum", buf, g);
    check_same("muon_momentum", "update", u, g);
    for (Index i = 0; i < g.rows; ++i) {
      float* br = buf.data + i * buf.ld;
      momentum_row(k, g.data + i * g.ld, w.data + i * w.ld, br, br, u.data + i * u.ld, g.cols);
    }
  }

  // One pass over each direction's rows: u from g, w and buf, then (the row in the cache) the sums
  // of w and u, or a scan of u. g, w and buf are checked through u: a non-finite element of any
  // of them makes u's element non-finite (each enters u through + and * with finite factors,
  // and IEEE arithmetic keeps infinities and NaN non-finite, 0 x inf included), so u all finite
  // (its sum of squares finite) means they are; otherwise, rarely, they are scanned for the
  // first non-finite element of each (u may also overflow from finite inputs: then none is).
  void muon_directions(const MomentumStep& k, std::span<const MuonDirection> dirs,
                       std::span<const ConstMatrixView> others,
                       std::span<std::optional<MatrixIndex>> found,
                       std::span<double> sums) override {
    detail::check_muon_directions(dirs, others, found, sums);
    std::size_t summed = 0;
    std::vector<float> row;  // u's row when only its sum is asked for (sums_only)
    for (std::size_t n = 0; n < dirs.size(); ++n) {
      const MuonDirection& d = dirs[n];
      LaneSquares<double> w_sum, u_sum;
      bool u_finite = true;
      const bool scratch = d.sums && d.sums_only;
      if (scratch) row.resize(static_cast<std::size_t>(d.g.cols));
      for (Index i = 0; i < d.g.rows; ++i) {
        const float* wr = d.w.data + i * d.w.ld;
        float* ur = scratch ? row.data() : d.u.data + i * d.u.ld;
        direction_row(k, d.g.data + i * d.g.ld, wr, d.buf.data + i * d.buf.ld, ur, d.g.cols);
        if (d.sums) {
          w_sum.add(wr, d.g.cols);
          u_sum.add(ur, d.g.cols);
        } else if (u_finite) {
          u_finite = !has_non_finite(ur, d.g.cols);
        }
      }
      if (d.sums) {
        sums[summed++] = w_sum.total();
        sums[summed++] = u_sum.total();
        u_finite = std::isfinite(sums[summed - 1]);
      }
      std::optional<MatrixIndex>* f = &found[3 * n];
      f[0] = f[1] = f[2] = std::nullopt;
      if (!u_finite) {
        f[0] = find_non_finite(d.g.row_block(0, d.checked_rows));
        f[1] = find_non_finite(d.w.row_block(0, d.checked_rows));
        f[2] = find_non_finite(d.buf.row_block(0, d.checked_rows));
      }
    }
    for (std::size_t n = 0; n < others.size(); ++n)
      found[3 * dirs.size() + n] = find_non_finite(others[n]);
  }

  // muon_momentum, scale and axpby of the default (compute.h) per element: each element of g, w,
  // buf and u read once, w and buf written once.
  void muon_apply(const MomentumStep& k, ConstMatrixView g, MatrixView w, MatrixView buf,
                  ConstMatrixView u, float decay, float lr) override {
    check_same("muon_apply", "weight", w, g);
    check_same("muon_apply", "momentum", buf, g);
    check_same("muon_apply", "update", u, g);
    const float alpha = -lr;
    for (Index i = 0; i < g.rows; ++i) {
      float* br = buf.data + i * buf.ld;
      float* wr = w.data + i * w.ld;
      const float* ur = u.data + i * u.ld;
      advance_row(k, g.data + i * g.ld, wr, br, g.cols);
      // scale's w decay (0 clears, as scale does), then axpby's alpha u + 1 w.
      if (decay == 1.0f) {
        for (Index j = 0; j < g.cols; ++j)
          wr[j] = alpha * ur[j] + wr[j];
      } else if (decay == 0.0f) {
        for (Index j = 0; j < g.cols; ++j)
          wr[j] = alpha * ur[j] + 0.0f;
      } else {
        for (Index j = 0; j < g.cols; ++j)
          wr[j] = alpha * ur[j] + wr[j] * decay;
      }
    }
  }

  void adamw(const AdamWStep& k, ConstMatrixView g, MatrixView m, MatrixView v,
             MatrixView p) override {
    check_same("adamw", "first moment", m, g);
    check_same("adamw", "second moment", v, g);
    check_same("adamw", "parameter", p, g);
    for (Index i = 0; i < g.rows; ++i) {
      const float* gr = g.data + i * g.ld;
      float* mr = m.data + i * m.ld;
      float* vr = v.data + i * v.ld;
      float* pr = p.data + i * p.ld;
      for (Index j = 0; j < g.cols; ++j) {
        const float gij = gr[j];
        mr[j] = k.beta1 * mr[j] + (1.0f - k.beta1) * gij;
        vr[j] = k.beta2 * vr[j] + (1.0f - k.beta2) * gij * gij;
        const float denom = std::sqrt(vr[j]) / k.bias2_sqrt + k.eps;
        pr[j] = pr[j] * k.decay - k.lr * (mr[j] / k.bias1) / denom;
      }
    }
  }

 protected:
  float* do_allocate(std::size_t count) override {
    // Zero-filled, aligned for the BLAS kernels' vector loads.
    const std::size_t bytes = (count * sizeof(float) + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, bytes);
    if (p != nullptr) std::memset(p, 0, bytes);
    return static_cast<float*>(p);
  }
  void do_release(float* data, std::size_t) noexcept override { std::free(data); }

 private:
  static constexpr std::size_t kAlign = 64;

  static bool same_matrix(ConstMatrixView a, ConstMatrixView b) {
    return a.data == b.data && a.rows == b.rows && a.cols == b.cols && a.ld == b.ld;
  }

  // Scratch buffer `slot` grown to at least `count` floats: this backend's memory
  // (allocate, so it is counted), kept and grown when a larger operand comes, so that repeated
  // products of one shape allocate nothing. scratch_mutex_ held.
  float* scratch(int slot, std::size_t count) {
    Scratch& s = scratch_[slot];
    if (count > s.count) {
      float* grown = allocate(count);  // throws when it cannot; the old buffer stays valid
      release(s.data, s.count);
      s = {grown, count};
    }
    return s.data;
  }

  // A contiguous bf16 copy of a in scratch buffer `slot` (bf16_gemm.h's rounding).
  detail::Bf16Matrix bf16_copy(int slot, ConstMatrixView a, int threads) {
    const auto count = static_cast<std::size_t>(a.rows * a.cols);
    auto* out = reinterpret_cast<std::uint16_t*>(scratch(slot, (count + 1) / 2));
    detail::to_bf16(a, out, threads);
    return {out, a.rows, a.cols, a.cols};
  }

  // A contiguous copy of a with every element rounded to `precision`, in scratch buffer `slot`.
  ConstMatrixView rounded(int slot, ConstMatrixView a, Precision precision) {
    Scratch& s = scratch_[slot];
    scratch(slot, static_cast<std::size_t>(a.rows * a.cols));
    for (Index i = 0; i < a.rows; ++i) {
      const float* src = a.data + i * a.ld;
      float* dst = s.data + i * a.cols;
      for (Index j = 0; j < a.cols; ++j)
        dst[j] = round_to(precision, src[j]);
    }
    return {s.data, a.rows, a.cols, a.cols};
  }

  struct Scratch {
    float* data = nullptr;
    std::size_t count = 0;
  };
  // 0 and 1: the rounded (or bf16) copies of a reduced-precision product's operands (1 also a bf16
  // syrk's panels); 2: oneDNN's working memory.
  Scratch scratch_[3];
  const detail::Bf16Scratchpad onednn_scratchpad_ = [this](std::size_t bytes) -> void* {
    return scratch(2, (bytes + sizeof(float) - 1) / sizeof(float));
  };
  std::mutex scratch_mutex_;
};

}  // namespace

Compute& cpu_compute() {
  static CpuCompute instance;
  return instance;
}

void set_blas_threads(int threads) {
  if (threads < 1)
    throw Error(fmt::format("set_blas_threads: {} is not a positive thread count", threads));
  init_threads();
  openblas_set_num_threads(threads);
}

int blas_threads() {
  init_threads();
  return openblas_get_num_threads();
}

}  // namespace distmuon
