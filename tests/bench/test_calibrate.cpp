// Calibration: the latency/bandwidth fit on synthetic sweeps (exact lines, a negative intercept, a
// flat sweep), the ring terms by hand, and a tiny real calibration whose profile validates and
// survives a file round trip. Measured rates themselves are not asserted (they depend on the
// machine), only their bookkeeping.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "distmuon/calibrate.h"
#include "distmuon/error.h"
#include "test_util.h"

namespace distmuon {
namespace {

using test::world;

CollectiveRate point(std::size_t bytes, double seconds) {
  CollectiveRate r;
  r.bytes = bytes;
  r.time = summarize({seconds});
  return r;
}

// t = 10 us + bytes / 2 GB/s is recovered exactly (tolerance 1e-9 relative: the normal equations
// round).
TEST(Calibrate, FitRecoversAnExactLine) {
  std::vector<CollectiveRate> sweep;
  for (std::size_t b = 8; b <= (8u << 20); b *= 8)
    sweep.push_back(point(b, 10e-6 + static_cast<double>(b) / 2e9));
  const LineFit f = fit_latency_bandwidth(sweep);
  EXPECT_NEAR(f.a_s, 10e-6, 1e-9 * 10e-6);
  EXPECT_NEAR(f.b_s_per_byte, 0.5e-9, 1e-9 * 0.5e-9);
  EXPECT_LT(f.max_rel_error, 1e-9);
  EXPECT_FALSE(f.fallback);
}

TEST(Calibrate, FitClampsANegativeInterceptAndFallsBackOnAFlatSweep) {
  // Times proportional to size but the small ones measured a little fast: the line through the
  // points would cross below zero; the fit goes through the origin instead.
  const LineFit origin =
      fit_latency_bandwidth({point(1000, 0.5e-6), point(2000, 2e-6), point(4000, 4e-6)});
  EXPECT_EQ(origin.a_s, 0.0);
  EXPECT_GT(origin.b_s_per_byte, 0.0);
  // Larger messages measured faster than small ones: no positive slope to fit.
  const LineFit flat = fit_latency_bandwidth({point(8, 3e-6), point(64, 2e-6), point(512, 1e-6)});
  EXPECT_TRUE(flat.fallback);
  EXPECT_EQ(flat.a_s, 1e-6);                        // the smallest time
  EXPECT_DOUBLE_EQ(flat.b_s_per_byte, 1e-6 / 512);  // the largest message's time per byte
  EXPECT_THROW(fit_latency_bandwidth({}), Error);
}

// a = (g - 1) alpha (all-gather) or 2 (g - 1) alpha (all-reduce); b = f (g - 1) / g / bw.
TEST(Calibrate, RingTermsOfALine) {
  const LineFit line{12e-6, 1e-9, 0, false};  // 12 us + 1 ns per byte
  const CollectiveFit ag = ring_terms(CollectiveKind::kAllGather, 4, line);
  EXPECT_DOUBLE_EQ(ag.latency_us, 4.0);  // 12 / 3
  EXPECT_DOUBLE_EQ(ag.gbps, 0.75);       // (3 / 4) / 1e-9 bytes per s
  const CollectiveFit ar = ring_terms(CollectiveKind::kAllReduce, 4, line);
  EXPECT_DOUBLE_EQ(ar.latency_us, 2.0);  // 12 / 6
  EXPECT_DOUBLE_EQ(ar.gbps, 1.5);        // 2 (3 / 4) / 1e-9
  EXPECT_THROW(ring_terms(CollectiveKind::kAllGather, 1, line), Error);
}

CalibrateOptions tiny() {
  CalibrateOptions o;
  o.name = "tiny";
  o.sizes = {16, 32};
  o.min_bytes = 8;
  o.max_bytes = 4096;
  o.factor = 8;
  o.elementwise_elements = 4096;
  o.compute_timing = {0, 1};
  o.comm_timing = {1, 2};
  return o;
}

TEST(Calibrate, TinyCalibrationWritesAProfileThatLoads) {
  const Communicator& w = world();
  const CalibrationReport rep = calibrate(w, tiny(), cpu_compute());
  const HardwareProfile& p = rep.profile;
  ASSERT_TRUE(p.calibration.has_value());
  const Calibration& c = *p.calibration;
  EXPECT_EQ(p.name, "tiny");
  EXPECT_EQ(c.group_size, w.size());
  EXPECT_EQ(c.elem_size, 4);
  // A 2 x 2 grid of (s, l), s-major; the Gram syrk of an s x l matrix, the gemm (l x s) (s x s).
  ASSERT_EQ(rep.gram_syrk.size(), 4u);
  EXPECT_EQ(c.gram_syrk.s, (std::vector<double>{16, 32}));
  EXPECT_EQ(c.update_gemm.l, (std::vector<double>{16, 32}));
  EXPECT_EQ(rep.update_gemm[1].m, 32);  // s = 16, l = 32
  EXPECT_EQ(rep.update_gemm[1].k, 16);
  EXPECT_DOUBLE_EQ(c.gram_syrk.gflops[0][1],
                   16.0 * 16 * 32 / rep.gram_syrk[1].time.median_s * 1e-9);
  EXPECT_DOUBLE_EQ(c.update_gemm.gflops[1][0], rep.update_gemm[2].flops_per_s * 1e-9);
  double best = 0;
  for (const auto& row : c.update_gemm.gflops)
    for (double v : row)
      best = std::max(best, v);
  EXPECT_DOUBLE_EQ(p.peak_tflops_fp32, best * 1e-3);
  EXPECT_GT(c.elementwise.sum_squares, 0.0);
  EXPECT_FALSE(c.host.empty());
  EXPECT_FALSE(c.date.empty());
  EXPECT_NE(p.source.find("distmuon calibrate"), std::string::npos);
  if (w.size() > 1) {
    ASSERT_EQ(rep.collectives.size(), 2u);
    ASSERT_TRUE(c.all_gather && c.all_reduce);
    EXPECT_EQ(*c.all_reduce, rep.collectives[1].fit);
    EXPECT_EQ(p.intra_domain_gbps, c.all_reduce->gbps);
    // 8, 64, 512, 4096 bytes; all-gather payloads rounded up to whole f32 chunks per rank.
    EXPECT_EQ(rep.collectives[1].points.size(), 4u);
    for (const CollectiveRate& r : rep.collectives[0].points)
      EXPECT_EQ(r.bytes % (4 * static_cast<std::size_t>(w.size())), 0u) << r.bytes;
  } else {
    EXPECT_TRUE(rep.collectives.empty());
    EXPECT_FALSE(c.all_gather || c.all_reduce);
    EXPECT_EQ(p.intra_domain_gbps, 8 * c.elementwise.scale);
  }
  EXPECT_NO_THROW(p.validate());
  EXPECT_FALSE(format_calibration(rep).empty());
  if (w.rank() == 0) {
    const auto file = std::filesystem::temp_directory_path() /
                      fmt::format("distmuon-test-calibrate-{}.json", ::getpid());
    save_profile(p, file);
    EXPECT_EQ(load_profile(file), p);
    std::filesystem::remove(file);
  }
}

TEST(Calibrate, BadOptionsFailOnEveryRank) {
  CalibrateOptions o = tiny();
  o.sizes = {32, 16};
  EXPECT_THROW(calibrate(world(), o, cpu_compute()), CollectiveError);
  o = tiny();
  o.factor = 1;
  EXPECT_THROW(calibrate(world(), o, cpu_compute()), CollectiveError);
}

}  // namespace
}  // namespace distmuon
