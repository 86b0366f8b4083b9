// Newton-Schulz (standard and Gram) and a Muon step on the CUDA backend against the CPU backend.
// Tolerances (relative Frobenius error of the CUDA result against the CPU one), and why:
//  - fp32: 2e-5. Each backend's NS is within 1e-5 of a float64 reference (tests/ns), and the
//    products differ only in summation order; Gram NS amplifies rounding more (its s x s
//    polynomials), 1e-4.
//  - tf32 and bf16 (each call's precision, NsOptions::precision): against the float64 reference
//    with the bounds the CPU's emulation of the same precision meets
//    (tests/ns/test_ns_precision.cpp, docs/precision.md): standard 1e-2 (tf32) and 8e-2 (bf16),
//    Gram twice that.
//  - Compute::normalize: bit-equal (tolerance 0) to the host formula x * float(1 / max(sqrt(s),
//    eps)) applied to the backend's own sum s, on a matrix of one kernel block (a fixed order of
//    summation, so the sum normalize keeps on the device is the one sum_squares reads back).
//  - Compute::newton_schulz_bf16 (bf16 storage, bf16 outputs) against the CPU's emulation of
//    its order (src/compute/ns_bf16.cpp): with no step, bit-equal (the conversions to and from
//    bf16 are exact or round to nearest even on both); one step, at least 95% of the elements
//    bit-equal and every one within two bf16 spacings of the largest (the products sum in fp32 in
//    different orders, so an output near a bf16 rounding tie may land on its neighbour:
//    tests/ns/test_ns_bf16_storage.cpp's argument, with cuBLAS's longer sums); five quintic
//    steps within 2e-2 relative (5 bf16 unit roundoffs: the neighbours move later steps a little,
//    and NS does not compound them); a batch of two (strided-batched products) within the same
//    2e-2 of the emulation, matrix by matrix.
// Every test is skipped ("no CUDA device: skipped") on a machine without a CUDA device.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cuda_test_util.h"
#include "distmuon/error.h"
#include "distmuon/muon.h"
#include "distmuon/newton_schulz.h"
#include "test_util.h"

namespace distmuon {
namespace {

struct Shape {
  Index m, n;
};
constexpr Shape kShapes[] = {{64, 160}, {160, 64}, {96, 96}};

Matrix cuda_ns(Compute& cuda, const Matrix& g, const NsOptions& opts) {
  DeviceMatrix x = to_device(cuda, g.view());
  NsWorkspace ws;
  newton_schulz_inplace(x.view(), opts, cuda, nullptr, &ws);
  return to_host(cuda, x.view());
}

// fp32: against the CPU backend's result (see the file's comment). tf32 and bf16: against the
// float64 reference, with tests/ns/test_ns_precision.cpp's bounds, which the CPU's emulation of
// each precision (operands rounded as the GPU rounds them, fp32 sums) meets on these shape
// families: standard tf32 1e-2, bf16 8e-2; Gram twice that.
double tolerance(Precision p, NsAlgorithm algorithm) {
  const bool gram = algorithm == NsAlgorithm::kGram;
  if (p != Precision::kFp32) return test::reduced_precision_ns_bound(gram, p);
  return gram ? 1e-4 : 2e-5;
}

TEST(CudaNewtonSchulz, StandardAndGramMatchCpu) {
  DISTMUON_REQUIRE_CUDA();
  auto cuda = make_cuda_compute();  // one backend: the precision is each call's (NsOptions)
  for (const Precision p : {Precision::kFp32, Precision::kTf32, Precision::kBf16}) {
    for (const NsAlgorithm algorithm : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
      for (const bool use_syrk : {true, false}) {
        NsOptions opts;
        opts.algorithm = algorithm;
        opts.use_syrk = use_syrk;
        opts.precision = p;
        for (const Shape& sh : kShapes) {
          const Matrix g = test::random_matrix(sh.m, sh.n, 40 + static_cast<std::uint64_t>(sh.m));
          const Matrix want = p == Precision::kFp32 ? newton_schulz(g.view(), opts, cpu_compute())
                                                    : test::reference_newton_schulz<double>(
                                                          g.view(), opts.coefficients, opts.steps);
          const Matrix got = cuda_ns(*cuda, g, opts);
          EXPECT_LE(relative_error(got.view(), want.view()), tolerance(p, algorithm))
              << to_string(p) << " " << to_string(algorithm) << " syrk " << use_syrk << " "
              << shape_str(sh.m, sh.n);
        }
      }
    }
  }
}

// Compute::normalize on the device: no sum comes back; the factor is the host's expression of the
// device's sum; a non-finite sum makes every element NaN; a zero matrix stays zero.
TEST(CudaNorm, NormalizeOnTheDeviceIsTheHostFormula) {
  DISTMUON_REQUIRE_CUDA();
  auto cuda = make_cuda_compute();
  const double eps = NsOptions{}.eps;
  for (const bool in_double : {true, false}) {
    const Matrix g = test::random_matrix(12, 20, 80);  // 240 elements: one block of 256 threads
    DeviceMatrix x = to_device(*cuda, g.view());
    const double s = cuda->sum_squares(x.view(), in_double);
    EXPECT_FALSE(cuda->normalize(x.view(), eps, in_double, nullptr).has_value());
    const auto f = static_cast<float>(1.0 / std::max(std::sqrt(s), eps));
    const Matrix got = to_host(*cuda, x.view());
    for (Index k = 0; k < g.size(); ++k)
      ASSERT_EQ(got.data()[k], g.data()[k] * f) << "in_double " << in_double << " " << k;
  }
  // A large matrix (many blocks: the order of the block sums varies): within 1e-6 of the CPU's.
  const Matrix big = test::random_matrix(300, 500, 81);
  Matrix want = big;
  ASSERT_TRUE(cpu_compute().normalize(want.view(), eps, true, nullptr).has_value());
  DeviceMatrix xb = to_device(*cuda, big.view());
  cuda->normalize(xb.view(), eps, true, nullptr);
  EXPECT_LE(relative_error(to_host(*cuda, xb.view()).view(), want.view()), 1e-6);
  // Non-finite: every element NaN (the caller's check finds it); zero: zeros.
  Matrix bad = test::random_matrix(12, 20, 82);
  bad(5, 7) = std::numeric_limits<float>::infinity();
  DeviceMatrix xbad = to_device(*cuda, bad.view());
  const double bad_sum = cuda->sum_squares(xbad.view(), true);
  cuda->normalize(xbad.view(), eps, true, nullptr);
  const Matrix got_bad = to_host(*cuda, xbad.view());
  std::size_t nan = 0, zeros = 0;
  for (const float v : got_bad.values()) {
    nan += std::isnan(v) ? 1 : 0;
    zeros += v == 0.0f ? 1 : 0;
  }
  EXPECT_EQ(nan, got_bad.values().size())
      << "sum of squares read back: " << bad_sum << "; " << zeros << " zeros, first value "
      << got_bad(0, 0) << ", the infinite element became " << got_bad(5, 7);
  DeviceMatrix zero(*cuda, 7, 9);
  cuda->normalize(zero.view(), eps, true, nullptr);
  const Matrix got_zero = to_host(*cuda, zero.view());  // kept: values() views it
  for (const float v : got_zero.values())
    ASSERT_EQ(v, 0.0f);
}

// The public NS still refuses a non-finite input on CUDA (checked after the iteration), and a
// Muon step with a non-finite momentum throws CollectiveError naming the weight.
TEST(CudaNorm, NonFiniteInputsAreRefused) {
  DISTMUON_REQUIRE_CUDA();
  auto cuda = make_cuda_compute();
  for (const NsAlgorithm algorithm : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
    NsOptions o;
    o.algorithm = algorithm;
    Matrix g = test::random_matrix(24, 40, 83);
    g(3, 4) = std::numeric_limits<float>::quiet_NaN();
    EXPECT_THROW(newton_schulz(g.view(), o, *cuda), Error) << to_string(algorithm);
  }
  MuonOptions options;
  options.tp_mode = TpMode::kDuplicated;
  DeviceMatrix w = to_device(*cuda, test::random_matrix(24, 40, 84).view());
  Muon opt(options, local_communicator(), *cuda);
  opt.add_parameter({.name = "hidden.w", .local = w.view(), .rows = 24, .cols = 40});
  const DeviceMatrix grad = to_device(*cuda, test::random_matrix(24, 40, 85).view());
  const std::vector<ConstMatrixView> grads{grad.view()};
  opt.step(grads);
  Matrix momentum = to_host(*cuda, opt.state_tensors(0).at(0));
  momentum(0, 0) = std::numeric_limits<float>::quiet_NaN();
  cuda->copy_from_host(momentum.view(), opt.state_tensors(0).at(0));
  try {
    opt.step(grads);
    ADD_FAILURE() << "a NaN momentum did not fail the step";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("'hidden.w'"), std::string::npos) << e.what();
  }
}

// One hidden weight (Muon) and one embedding (AdamW), three steps, duplicated mode on one rank:
// the updates after each step on CUDA against the CPU backend's (fp32).
TEST(CudaMuon, StepsMatchCpu) {
  DISTMUON_REQUIRE_CUDA();
  Compute& cuda = cuda_compute();
  if (const auto forced = cuda_precision_override(); forced && *forced != Precision::kFp32) {
    GTEST_SKIP() << "DISTMUON_CUDA_PRECISION is not fp32: the fp32 comparison does not apply";
  }
  MuonOptions options;
  options.precision = Precision::kFp32;  // unset, the CUDA backend's default would be bf16
  options.tp_mode = TpMode::kDuplicated;
  options.weight_decay = 0.01;
  const Matrix w0 = test::random_matrix(48, 80, 50), e0 = test::random_matrix(30, 16, 51);

  Matrix w = w0, e = e0;
  Muon cpu_opt(options, local_communicator(), cpu_compute());
  cpu_opt.add_parameter({.name = "hidden.w", .local = w.view(), .rows = 48, .cols = 80});
  cpu_opt.add_parameter(
      {.name = "embed", .local = e.view(), .rows = 30, .cols = 16, .role = ParamRole::kEmbedding});
  DeviceMatrix dw = to_device(cuda, w0.view()), de = to_device(cuda, e0.view());
  Muon cuda_opt(options, local_communicator(), cuda);
  cuda_opt.add_parameter({.name = "hidden.w", .local = dw.view(), .rows = 48, .cols = 80});
  cuda_opt.add_parameter(
      {.name = "embed", .local = de.view(), .rows = 30, .cols = 16, .role = ParamRole::kEmbedding});
  for (int step = 0; step < 3; ++step) {
    const Matrix gw = test::random_matrix(48, 80, 60 + static_cast<std::uint64_t>(step));
    const Matrix ge = test::random_matrix(30, 16, 70 + static_cast<std::uint64_t>(step));
    const std::vector<ConstMatrixView> grads{gw.view(), ge.view()};
    cpu_opt.step(grads);
    const DeviceMatrix dgw = to_device(cuda, gw.view()), dge = to_device(cuda, ge.view());
    const std::vector<ConstMatrixView> dgrads{dgw.view(), dge.view()};
    cuda_opt.step(dgrads);
    // The updates themselves (w - w0), so that the weights' size does not hide their error;
    // 1e-4: 2e-5 on the update plus the cancellation of w - w0 (|w| / |w - w0| about 20).
    for (const auto& [got, want, w_start] : {std::tuple{to_host(cuda, dw.view()), w, w0},
                                             std::tuple{to_host(cuda, de.view()), e, e0}}) {
      Matrix d_got = got, d_want = want;
      cpu_compute().axpby(-1.0f, w_start.view(), 1.0f, d_got.view());
      cpu_compute().axpby(-1.0f, w_start.view(), 1.0f, d_want.view());
      EXPECT_LE(relative_error(d_got.view(), d_want.view()), 1e-4) << "step " << step;
    }
  }
}

// The CPU emulation's and the CUDA backend's newton_schulz_bf16 of the same normalised inputs.
struct Bf16Run {
  std::vector<Matrix> cpu, cuda;
};
Bf16Run run_bf16(Compute& cuda, Index m, Index n, int count, bool rows, bool syrk,
                 std::span<const NsStep> steps) {
  Bf16Run out;
  std::vector<MatrixView> host;
  std::vector<DeviceMatrix> dev;
  std::vector<MatrixView> dev_views;
  for (int i = 0; i < count; ++i) {
    Matrix x = test::random_matrix(m, n, 80 + static_cast<std::uint64_t>(i));
    cpu_compute().normalize(x.view(), 1e-7, true, nullptr);
    out.cpu.push_back(x);
    dev.push_back(to_device(cuda, x.view()));
  }
  for (auto& x : out.cpu)
    host.push_back(x.view());
  for (auto& d : dev)
    dev_views.push_back(d.view());
  Matrix scratch(1, ns_bf16_scratch_floats(count, m, n, rows));
  cpu_compute().newton_schulz_bf16(host, rows, steps, syrk, scratch.view());
  DeviceMatrix dscratch(cuda, 1, ns_bf16_scratch_floats(count, m, n, rows));
  cuda.newton_schulz_bf16(dev_views, rows, steps, syrk, dscratch.view());
  for (auto& d : dev)
    out.cuda.push_back(to_host(cuda, d.view()));
  return out;
}

TEST(CudaNewtonSchulz, Bf16StorageMatchesTheCpuEmulation) {
  DISTMUON_REQUIRE_CUDA();
  if (cuda_precision_override().value_or(Precision::kBf16) != Precision::kBf16) {
    GTEST_SKIP() << "DISTMUON_CUDA_PRECISION is not bf16";
  }
  auto cuda = make_cuda_compute();
  const NsStep quintic[] = {{4.0848f, -6.8946f, 2.9270f},
                            {3.9505f, -6.3029f, 2.6377f},
                            {3.7418f, -5.5913f, 2.3037f},
                            {2.8769f, -3.1427f, 1.2046f},
                            {2.8366f, -3.0525f, 1.2012f}};
  const NsStep cubic[] = {{1.5f, -0.5f, 0.0f}};
  // {64, 160} and {160, 64}: both Gram sides; {2048, 2560}: the triangle products (s = 2048 is
  // two blocks of 1024) with bf16 output and the bf16 mirror.
  // The CPU's emulation of the large shape on every core of the machine (restored after).
  const int threads = blas_threads();
  set_blas_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  for (const auto [m, n] : {std::pair<Index, Index>{64, 160}, {160, 64}, {2048, 2560}}) {
    const bool rows = m <= n;
    for (const bool syrk : {true, false}) {
      if (m == 2048 && !syrk) continue;  // the large shape is there for the triangle products
      const std::string what = fmt::format("{} syrk {}", shape_str(m, n), syrk);
      const Bf16Run none = run_bf16(*cuda, m, n, 1, rows, syrk, {});
      EXPECT_EQ(relative_error(none.cuda[0].view(), none.cpu[0].view()), 0.0) << what;
      for (const auto& one :
           {std::span<const NsStep>(quintic, 1), std::span<const NsStep>(cubic)}) {
        const Bf16Run r = run_bf16(*cuda, m, n, 1, rows, syrk, one);
        Index equal = 0;
        double worst = 0, largest = 0;
        for (Index i = 0; i < m; ++i)
          for (Index j = 0; j < n; ++j) {
            const double got = r.cuda[0](i, j), want = r.cpu[0](i, j);
            equal += got == want;
            worst = std::max(worst, std::abs(got - want));
            largest = std::max(largest, std::abs(want));
          }
        const double share = double(equal) / double(m * n);
        std::printf("bf16 storage, one step (c %g), %s: %.2f%% bit-equal, worst %.2e\n", one[0].c,
                    what.c_str(), 100 * share, worst / largest);
        EXPECT_GE(share, 0.95) << what;
        EXPECT_LE(worst, std::ldexp(largest, -6)) << what;
      }
      const Bf16Run five = run_bf16(*cuda, m, n, 1, rows, syrk, quintic);
      const double err = relative_error(five.cuda[0].view(), five.cpu[0].view());
      std::printf("bf16 storage, 5 quintic steps, %s: %.2e from the emulation\n", what.c_str(),
                  err);
      EXPECT_LE(err, 2e-2) << what;
    }
  }
  set_blas_threads(threads);
  // A batch: every product one strided-batched GEMM.
  const Bf16Run batch = run_bf16(*cuda, 96, 128, 2, true, true, quintic);
  for (int i = 0; i < 2; ++i) {
    EXPECT_LE(relative_error(batch.cuda[i].view(), batch.cpu[i].view()), 2e-2) << "matrix " << i;
  }
}

}  // namespace
}  // namespace distmuon
