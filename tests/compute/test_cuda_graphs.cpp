// CUDA graphs of the CUDA backend's bf16-storage Newton-Schulz (DISTMUON_CUDA_GRAPHS=1,
// docs/gpu.md "CUDA graphs"). As the optimizer calls it: the same buffers every step, new values
// in them. The captured and replayed calls must give bit for bit the results of the plain calls
// of the same backend (tolerance 0: a graph replays the very kernels and cuBLAS calls with the
// same arguments, and the backend keeps one cuBLAS workspace for both paths, so cuBLAS chooses
// the same algorithms). A key's first call runs uncaptured (a warm-up), its second is captured
// and launched, later ones replay; a new key (another shape, other coefficients) captures a new
// graph, and an older key still replays. Skipped ("no CUDA device: skipped") without a CUDA device.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "distmuon/error.h"
#include "test_util.h"

namespace distmuon {
namespace {

const std::vector<NsStep> kQuintic = {{4.0848f, -6.8946f, 2.9270f},
                                      {3.9505f, -6.3029f, 2.6377f},
                                      {3.7418f, -5.5913f, 2.3037f},
                                      {2.8769f, -3.1427f, 1.2046f},
                                      {2.8366f, -3.0525f, 1.2012f}};

// A backend made with DISTMUON_CUDA_GRAPHS set to `value` (the variable restored after).
std::unique_ptr<Compute> backend_with(const char* value) {
  struct Restore {
    const char* old = std::getenv("DISTMUON_CUDA_GRAPHS");
    std::string saved = old != nullptr ? old : "";
    ~Restore() {
      if (old != nullptr) {
        ::setenv("DISTMUON_CUDA_GRAPHS", saved.c_str(), 1);
      } else {
        ::unsetenv("DISTMUON_CUDA_GRAPHS");
      }
    }
  } restore;
  if (::setenv("DISTMUON_CUDA_GRAPHS", value, 1) != 0) throw Error("setenv failed");
  return make_cuda_compute();
}

// One equal-shape group's buffers on the device, kept across calls as the optimizer keeps them.
struct Group {
  Index m, n;
  bool rows, syrk;
  std::vector<DeviceMatrix> xs;
  DeviceMatrix scratch;
  Group(Compute& cuda, Index m_, Index n_, int count, bool syrk_)
      : m(m_), n(n_), rows(m_ <= n_), syrk(syrk_) {
    for (int i = 0; i < count; ++i)
      xs.emplace_back(cuda, m, n);
    scratch = DeviceMatrix(cuda, 1, ns_bf16_scratch_floats(count, m, n, rows));
  }
  // Fills the buffers with normalised random matrices of `seed`, runs newton_schulz_bf16, and
  // returns the results.
  std::vector<Matrix> run(Compute& cuda, std::uint64_t seed, const std::vector<NsStep>& steps) {
    std::vector<MatrixView> views;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      Matrix x = test::random_matrix(m, n, seed + i);
      cpu_compute().normalize(x.view(), 1e-7, true, nullptr);
      cuda.copy_from_host(x.view(), xs[i].view());
      views.push_back(xs[i].view());
    }
    cuda.newton_schulz_bf16(views, rows, steps, syrk, scratch.view());
    std::vector<Matrix> out;
    for (auto& x : xs)
      out.push_back(to_host(cuda, x.view()));
    return out;
  }
};

void expect_bit_equal(const std::vector<Matrix>& got, const std::vector<Matrix>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    Index differ = 0;
    for (Index e = 0; e < got[i].size(); ++e) {
      differ += std::bit_cast<std::uint32_t>(got[i].data()[e]) !=
                std::bit_cast<std::uint32_t>(want[i].data()[e]);
    }
    EXPECT_EQ(differ, 0) << what << ": matrix " << i << ", " << differ << " of " << got[i].size()
                         << " elements differ";
  }
}

TEST(CudaGraphs, ReplaysGiveThePlainPathsBitsAndNewKeysCapture) {
  DISTMUON_REQUIRE_CUDA();
  if (cuda_precision_override().value_or(Precision::kBf16) != Precision::kBf16) {
    GTEST_SKIP() << "DISTMUON_CUDA_PRECISION is not bf16";
  }
  auto cuda = backend_with("1");
  // {2 x 128 x 256}: a batch (strided-batched products); {1 x 2048 x 2048}, syrk: the triangle
  // products, whose pointer kernel runs inside the graph.
  Group batch(*cuda, 128, 256, 2, true);
  Group square(*cuda, 2048, 2048, 1, true);
  for (Group* g : {&batch, &square}) {
    const std::string what = fmt::format("{} x {}", g->xs.size(), shape_str(g->m, g->n));
    set_cuda_graphs(*cuda, false);
    const cuda::GraphStats none = cuda_graph_stats(*cuda);
    const auto plain1 = g->run(*cuda, 10, kQuintic);
    const auto plain2 = g->run(*cuda, 20, kQuintic);
    const auto plain3 = g->run(*cuda, 30, kQuintic);
    const cuda::GraphStats off = cuda_graph_stats(*cuda);
    EXPECT_EQ(off.warmups + off.captures + off.replays, none.warmups + none.captures + none.replays)
        << what << ": graphs off";
    set_cuda_graphs(*cuda, true);
    const auto graph1 = g->run(*cuda, 10, kQuintic);  // a new key: the plain calls, remembered
    const cuda::GraphStats first = cuda_graph_stats(*cuda);
    EXPECT_EQ(first.warmups, none.warmups + 1) << what;
    EXPECT_EQ(first.captures, none.captures) << what;
    const auto graph2 = g->run(*cuda, 20, kQuintic);  // its second call: captured, launched
    const cuda::GraphStats second = cuda_graph_stats(*cuda);
    EXPECT_EQ(second.captures, none.captures + 1) << what;
    EXPECT_EQ(second.replays, none.replays) << what;
    const auto graph3 = g->run(*cuda, 30, kQuintic);  // the same buffers, new values: replayed
    const cuda::GraphStats third = cuda_graph_stats(*cuda);
    EXPECT_EQ(third.captures, second.captures) << what;
    EXPECT_EQ(third.replays, second.replays + 1) << what;
    expect_bit_equal(graph1, plain1, what + ", first call (warm-up)");
    expect_bit_equal(graph2, plain2, what + ", second call (captured)");
    expect_bit_equal(graph3, plain3, what + ", third call (replayed)");
    // The replay really ran the new values: different inputs, different results.
    EXPECT_NE(std::bit_cast<std::uint32_t>(graph2[0].data()[0]),
              std::bit_cast<std::uint32_t>(graph3[0].data()[0]))
        << what;
  }
  const cuda::GraphStats both = cuda_graph_stats(*cuda);
  EXPECT_EQ(both.captures, 2u) << "one graph per shape";
  EXPECT_EQ(both.cached, 2u);
  // Other coefficients are another key; the first shape's graph is still cached.
  const std::vector<NsStep> cubic = {{1.5f, -0.5f, 0.0f}, {1.5f, -0.5f, 0.0f}};
  set_cuda_graphs(*cuda, false);
  const auto plain_cubic1 = batch.run(*cuda, 50, cubic);
  const auto plain_cubic2 = batch.run(*cuda, 60, cubic);
  set_cuda_graphs(*cuda, true);
  expect_bit_equal(batch.run(*cuda, 50, cubic), plain_cubic1, "cubic steps, warm-up");
  expect_bit_equal(batch.run(*cuda, 60, cubic), plain_cubic2, "cubic steps, captured");
  EXPECT_EQ(cuda_graph_stats(*cuda).captures, 3u);
  const std::size_t replays = cuda_graph_stats(*cuda).replays;
  batch.run(*cuda, 40, kQuintic);
  EXPECT_EQ(cuda_graph_stats(*cuda).captures, 3u);
  EXPECT_EQ(cuda_graph_stats(*cuda).replays, replays + 1);
}

TEST(CudaGraphs, OffByDefaultAndABadValueIsRefused) {
  DISTMUON_REQUIRE_CUDA();
  auto off = backend_with("0");
  Group g(*off, 64, 96, 1, false);
  g.run(*off, 1, kQuintic);
  g.run(*off, 2, kQuintic);
  EXPECT_EQ(cuda_graph_stats(*off).warmups, 0u);
  EXPECT_EQ(cuda_graph_stats(*off).captures, 0u);
  EXPECT_EQ(cuda_graph_stats(*off).replays, 0u);
  try {
    backend_with("yes");
    FAIL() << "DISTMUON_CUDA_GRAPHS=yes accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DISTMUON_CUDA_GRAPHS"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace distmuon
