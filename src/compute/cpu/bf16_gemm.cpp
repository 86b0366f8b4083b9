// bf16 products on the CPU through oneDNN's matmul primitive (bf16_gemm.h).
#include "compute/cpu/bf16_gemm.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string_view>

#include "distmuon/error.h"

namespace distmuon::detail {
namespace {

using dnnl::memory;

// The calling thread's OpenMP thread count (what oneDNN's kernels use) set to `threads` for the
// lifetime of this object, then restored, so that other OpenMP code in the process keeps its own.
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int threads) : previous_(omp_get_max_threads()) {
    if (threads != previous_) omp_set_num_threads(threads);
  }
  ~ScopedOmpThreads() {
    if (omp_get_max_threads() != previous_) omp_set_num_threads(previous_);
  }
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;

 private:
  int previous_;
};

struct Engine {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};
Engine& engine() {
  static Engine e;
  return e;
}

const char* status_text(dnnl_status_t s) {
  switch (s) {
    case dnnl_out_of_memory:
      return "out of memory";
    case dnnl_unimplemented:
      return "no kernel for this product on this CPU";
    case dnnl_invalid_arguments:
      return "invalid shapes or strides";
    default:
      return "the matrix library failed";
  }
}

// op(x)'s descriptor: x is stored row-major (x.rows x x.cols, leading dimension x.ld); op(x) is
// rows x cols of the product, the transpose read through strides.
memory::desc operand(const Bf16Matrix& x, Trans t) {
  const memory::dim r = x.rows, c = x.cols, ld = x.ld;
  if (t == Trans::kNo) return memory::desc({r, c}, memory::data_type::bf16, {ld, 1});
  return memory::desc({c, r}, memory::data_type::bf16, {1, ld});
}

// Rows [r0, r0 + count) of op(a), as a matrix of a's storage.
Bf16Matrix op_rows(const Bf16Matrix& a, Trans t, Index r0, Index count) {
  if (t == Trans::kNo) return {a.data + r0 * a.ld, count, a.cols, a.ld};
  return {a.data + r0, a.rows, count, a.ld};
}

// Row panels of a syrk of order n. Measured (bench_newton_schulz's BM_product, docs/precision.md):
// at one thread 4 panels take half the time of the full product at order 1024; at two threads on
// 2 shared cores the panels' shorter parallel regions lost to it (60 ms against 37), so the full
// product there. One panel (the full product) below order 512, where the panels' smaller products
// lose more rate than they save work.
Index syrk_panels(Index n, int threads) {
  if (threads > 1) return 1;
  return n >= 1024 ? 4 : (n >= 512 ? 2 : 1);
}

dnnl::matmul::primitive_desc matmul_desc(const memory::desc& a, const memory::desc& b,
                                         const memory::desc& c, float alpha, float beta) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // the caller's kept buffer
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, engine().engine);
}

struct Probe {
  bool enabled = false;
  std::string summary;
};

// Whether oneDNN has a real bf16 kernel for this CPU: the implementation it picks for a small
// product (its reference code is far slower than the emulation with sgemm).
Probe probe() {
  const dnnl_version_t* v = dnnl_version();
  const std::string library = fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch);
  const char* env = std::getenv("DISTMUON_CPU_BF16");
  const std::string_view choice = env != nullptr ? env : "onednn";
  if (choice != "onednn" && choice != "emulate") {
    throw Error(
        fmt::format("DISTMUON_CPU_BF16='{}' is not a bf16 mode (valid: onednn, emulate)", choice));
  }
  if (choice == "emulate") return {false, "emulated (DISTMUON_CPU_BF16=emulate)"};
  try {
    const memory::desc a({64, 64}, memory::data_type::bf16, {64, 1});
    const memory::desc c({64, 64}, memory::data_type::f32, {64, 1});
    const std::string impl = matmul_desc(a, a, c, 1.0f, 0.0f).impl_info_str();
    if (impl.rfind("ref", 0) == 0) {
      return {false, fmt::format("emulated ({} has no bf16 kernel for this CPU)", library)};
    }
    return {true, fmt::format("{}, {}", library, impl)};
  } catch (const dnnl::error& e) {
    return {false, fmt::format("emulated ({}: {})", library, status_text(e.status))};
  }
}

const Probe& probed() {
  static const Probe p = probe();
  return p;
}

// One row of to_bf16, compiled for AVX-512 and AVX2 beside the baseline and chosen by the CPU at
// load time: the baseline's SSE code is several times slower, and it runs between oneDNN's
// AVX-512 kernels.
__attribute__((target_clones("arch=skylake-avx512", "avx2", "default"))) void row_to_bf16(
    const float* src, std::uint16_t* dst, Index cols) {
  for (Index j = 0; j < cols; ++j) {
    const auto bits = std::bit_cast<std::uint32_t>(src[j]);
    // Round to nearest even on the 16 dropped bits (round_to); Inf and NaN are kept (a NaN
    // whose payload lies in the dropped bits keeps its quiet bit).
    const std::uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const bool special = (bits & 0x7f800000u) == 0x7f800000u;
    const std::uint32_t kept = (bits >> 16) | ((bits & 0x7fffffu) != 0 ? 0x40u : 0u);
    dst[j] = static_cast<std::uint16_t>(special ? kept : rounded);
  }
}

}  // namespace

__attribute__((target_clones("arch=skylake-avx512", "avx2", "default"))) void round_row_to_bf16(
    float* row, Index cols) {
  for (Index j = 0; j < cols; ++j) {
    const auto bits = std::bit_cast<std::uint32_t>(row[j]);
    const std::uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
    const bool special = (bits & 0x7f800000u) == 0x7f800000u;  // Inf and NaN kept (round_to)
    row[j] = std::bit_cast<float>(special ? bits : rounded);
  }
}

void to_bf16(ConstMatrixView a, std::uint16_t* out, int threads) {
  const Index rows = a.rows, cols = a.cols;
  // Rows split over the threads when the copy is large enough to pay for waking them.
  const bool parallel = threads > 1 && rows * cols >= (Index{1} << 16);
#pragma omp parallel for num_threads(threads) if (parallel) schedule(static)
  for (Index i = 0; i < rows; ++i)
    row_to_bf16(a.data + i * a.ld, out + i * cols, cols);
}

void onednn_bf16_gemm(Trans ta, Trans tb, float alpha, Bf16Matrix a, Bf16Matrix b, float beta,
                      MatrixView c, const Bf16Scratchpad& scratchpad, int threads) {
  const memory::desc da = operand(a, ta), db = operand(b, tb);
  const memory::desc dc({c.rows, c.cols}, memory::data_type::f32, {c.ld, 1});
  try {
    // oneDNN sizes its blocking for the thread count when the primitive is made (its primitive
    // cache keeps one per shape, transposition, scale and thread count).
    const ScopedOmpThreads scoped(threads);
    Engine& e = engine();
    const dnnl::matmul::primitive_desc pd = matmul_desc(da, db, dc, alpha, beta);
    const dnnl::matmul product(pd);
    memory ma(da, e.engine, const_cast<std::uint16_t*>(a.data));
    memory mb(db, e.engine, const_cast<std::uint16_t*>(b.data));
    memory mc(dc, e.engine, c.data);
    const memory::desc dpad = pd.scratchpad_desc();
    memory mpad(dpad, e.engine, scratchpad(dpad.get_size()));
    product.execute(e.stream, {{DNNL_ARG_SRC, ma},
                               {DNNL_ARG_WEIGHTS, mb},
                               {DNNL_ARG_DST, mc},
                               {DNNL_ARG_SCRATCHPAD, mpad}});
    e.stream.wait();
  } catch (const dnnl::error& err) {
    const Index m = ta == Trans::kNo ? a.rows : a.cols, k = ta == Trans::kNo ? a.cols : a.rows;
    const Index n = tb == Trans::kNo ? b.cols : b.rows;
    throw Error(fmt::format("bf16 product on the CPU (op(a) {} x op(b) {} into c {}): {}",
                            shape_str(m, k), shape_str(k, n), shape_str(c.rows, c.cols),
                            status_text(err.status)));
  }
}

std::size_t bf16_syrk_work(Index n, int threads) {
  const Index t = syrk_panels(n, threads);
  return t == 1 ? 0 : static_cast<std::size_t>((n + t - 1) / t * n);
}

void onednn_bf16_syrk_upper(Trans ta, float alpha, Bf16Matrix a, float beta, MatrixView c,
                            float* work, const Bf16Scratchpad& scratchpad, int threads) {
  const Index n = c.rows;
  const Trans other = ta == Trans::kNo ? Trans::kYes : Trans::kNo;
  const Index t = syrk_panels(n, threads);
  if (t == 1) {
    onednn_bf16_gemm(ta, other, alpha, a, a, beta, c, scratchpad, threads);
    return;
  }
  // Each panel into contiguous work (oneDNN's AMX kernels want a dense output), then its upper
  // part into c.
  const Index bs = (n + t - 1) / t;
  for (Index r0 = 0; r0 < n; r0 += bs) {
    const Index rows = std::min(bs, n - r0), cols = n - r0;
    const MatrixView panel{work, rows, cols, cols};
    onednn_bf16_gemm(ta, other, alpha, op_rows(a, ta, r0, rows), op_rows(a, ta, r0, cols), 0.0f,
                     panel, scratchpad, threads);
    for (Index i = 0; i < rows; ++i) {
      const float* src = panel.data + i * cols;
      float* dst = c.data + (r0 + i) * c.ld + r0;
      if (beta == 0.0f) {
        std::copy(src + i, src + cols, dst + i);
      } else {
        for (Index j = i; j < cols; ++j)
          dst[j] = src[j] + beta * dst[j];
      }
    }
  }
}

bool onednn_bf16_enabled() {
  return probed().enabled;
}

std::string bf16_gemm_summary() {
  return probed().summary;
}

}  // namespace distmuon::detail
