// NS's three bf16 products of a 1024x4096 matrix (bf16 operands, fp32 accumulation and output)
// on the CPU libraries distmuon could use, as a shared object that bench/cpu_bf16_kernels.py
// loads beside PyTorch, to time them interleaved with torch's own bf16 matmul in one process
// (docs/precision.md, "bf16 on the CPU (oneDNN)"). Built by that script against oneDNN 2.x or
// 3.x headers, and with -DWITH_MKL against oneMKL's cblas_gemm_bf16bf16f32.
//
// Product w: 0 = X X^T (X 1024x4096), 1 = A A (A 1024x1024), 2 = B X.
// bench_run(0, w): oneDNN matmul on the plain (strided) layouts distmuon passes.
// bench_run(1, w): oneDNN matmul with the weights in the kernel's own layout (format_tag::any),
//                  reordered into it before each product (the operand changes every product).
// bench_run(2, w): oneMKL cblas_gemm_bf16bf16f32 (only with -DWITH_MKL).
#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#ifdef WITH_MKL
#include <mkl.h>
#endif

namespace {
using dnnl::memory;
using dt = memory::data_type;
constexpr int kM = 1024, kK = 4096;

dnnl::matmul::primitive_desc make_pd(const dnnl::engine& eng, const memory::desc& a,
                                     const memory::desc& b, const memory::desc& c) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::matmul::primitive_desc(eng, a, b, c, attr);
#else
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, eng);
#endif
}

struct State {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{eng};
  std::vector<std::uint16_t> x = std::vector<std::uint16_t>(kM * kK);
  std::vector<std::uint16_t> s = std::vector<std::uint16_t>(kM * kM);
  std::vector<float> c = std::vector<float>(kM * kK);
  std::vector<char> pad = std::vector<char>(std::size_t{1} << 28);
  memory::desc a[3], b[3], d[3];
  dnnl::matmul::primitive_desc pd[2][3];
  dnnl::matmul prim[2][3];
  std::vector<std::uint16_t> blocked[3];

  State() {
    // bf16 values in [1, 2): exponent of 1.0, random mantissa bits.
    for (auto& v : x) v = static_cast<std::uint16_t>(0x3f80 | (std::rand() & 0x7f));
    for (auto& v : s) v = static_cast<std::uint16_t>(0x3f80 | (std::rand() & 0x7f));
    a[0] = memory::desc({kM, kK}, dt::bf16, {kK, 1});
    b[0] = memory::desc({kK, kM}, dt::bf16, {1, kK});  // X^T read through strides
    d[0] = memory::desc({kM, kM}, dt::f32, {kM, 1});
    a[1] = b[1] = memory::desc({kM, kM}, dt::bf16, {kM, 1});
    d[1] = d[0];
    a[2] = a[1];
    b[2] = memory::desc({kM, kK}, dt::bf16, {kK, 1});
    d[2] = memory::desc({kM, kK}, dt::f32, {kK, 1});
    for (int w = 0; w < 3; ++w) {
      pd[0][w] = make_pd(eng, a[w], b[w], d[w]);
      const memory::dims dims = w == 0   ? memory::dims{kK, kM}
                                : w == 1 ? memory::dims{kM, kM}
                                         : memory::dims{kM, kK};
      const memory::desc any(dims, dt::bf16, memory::format_tag::any);
      pd[1][w] = make_pd(eng, a[w], any, d[w]);
      for (int v = 0; v < 2; ++v) prim[v][w] = dnnl::matmul(pd[v][w]);
      blocked[w].resize(pd[1][w].weights_desc().get_size() / 2 + 64);
    }
  }
  void* lhs(int w) { return w == 0 ? x.data() : s.data(); }
  void* rhs(int w) { return w == 1 ? s.data() : x.data(); }
};

State& state() {
  static State s;
  return s;
}
}  // namespace

extern "C" const char* bench_library() {
  static char text[256];
  State& q = state();
  const dnnl_version_t* v = dnnl_version();
  std::snprintf(text, sizeof text, "oneDNN %d.%d.%d (%s; any: %s)", v->major, v->minor, v->patch,
                q.pd[0][0].impl_info_str(), q.pd[1][0].impl_info_str());
  return text;
}

extern "C" int bench_run(int variant, int w) {
  if (w < 0 || w > 2 || variant < 0 || variant > 2) return 1;
  State& q = state();
  if (variant == 2) {
#ifdef WITH_MKL
    auto* x = reinterpret_cast<const MKL_BF16*>(q.x.data());
    auto* s = reinterpret_cast<const MKL_BF16*>(q.s.data());
    if (w == 0)
      cblas_gemm_bf16bf16f32(CblasRowMajor, CblasNoTrans, CblasTrans, kM, kM, kK, 1.f, x, kK, x,
                             kK, 0.f, q.c.data(), kM);
    if (w == 1)
      cblas_gemm_bf16bf16f32(CblasRowMajor, CblasNoTrans, CblasNoTrans, kM, kM, kM, 1.f, s, kM, s,
                             kM, 0.f, q.c.data(), kM);
    if (w == 2)
      cblas_gemm_bf16bf16f32(CblasRowMajor, CblasNoTrans, CblasNoTrans, kM, kK, kM, 1.f, s, kM, x,
                             kK, 0.f, q.c.data(), kK);
    return 0;
#else
    return 1;
#endif
  }
  memory weights(q.b[w], q.eng, q.rhs(w));
  if (variant == 1) {
    memory packed(q.pd[1][w].weights_desc(), q.eng, q.blocked[w].data());
    dnnl::reorder(weights, packed).execute(q.stream, weights, packed);
    weights = packed;
  }
  const auto& pd = q.pd[variant][w];
  q.prim[variant][w].execute(
      q.stream, {{DNNL_ARG_SRC, memory(q.a[w], q.eng, q.lhs(w))},
                 {DNNL_ARG_WEIGHTS, weights},
                 {DNNL_ARG_DST, memory(q.d[w], q.eng, q.c.data())},
                 {DNNL_ARG_SCRATCHPAD, memory(pd.scratchpad_desc(), q.eng, q.pad.data())}});
  q.stream.wait();
  return 0;
}
