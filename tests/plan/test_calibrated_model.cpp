// The refined model with a measured (calibrated) profile: the measured rates replace the
// datasheet figures where they apply, on hand-computed cases; the calibration's JSON and its
// interpolation. Expected values are written out from the equations of docs/cost-model.md; the
// tolerance is relative 1e-12 (only the divisions by rates round).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "distmuon/cost_model.h"
#include "distmuon/error.h"
#include "distmuon/hardware_profile.h"
#include "expect_rel.h"

namespace distmuon {
namespace {

using test::expect_rel;

// Datasheet fields far from the measured ones, so that a test sees which were used.
HardwareProfile measured_profile() {
  HardwareProfile p;
  p.name = "measured";
  p.peak_tflops_bf16 = p.peak_tflops_fp32 = 1;  // 1e12 FLOP/s
  p.intra_domain_gbps = p.inter_domain_gbps = 1000;
  p.intra_domain_latency_us = p.inter_domain_latency_us = 100;
  p.domain_size = 2;
  p.source = "test";
  Calibration c;
  c.elem_size = 4;
  c.group_size = 2;
  // Flat tables: the Gram syrk at 50 GFLOP/s, the update gemm at 100, at every (s, l).
  c.gram_syrk = {{64, 4096}, {64, 4096}, {{50, 50}, {50, 50}}};
  c.update_gemm = {{64, 4096}, {64, 4096}, {{100, 100}, {100, 100}}};
  c.elementwise = {1, 2, 4, 0.5};      // G elements/s: sum_squares, scale, axpby, fill
  c.all_gather = CollectiveFit{2, 5};  // 2 us per ring step, 5 GB/s
  c.all_reduce = CollectiveFit{1, 4};
  c.host = "host";
  c.date = "2025-01-01T00:00:00Z";
  p.calibration = c;
  return p;
}

AutoKey key_512x256(int elem_size = 4, bool crosses = false) {
  return AutoKey{.m = 512,
                 .n = 256,
                 .group_size = 2,
                 .crosses_domain = crosses,
                 .steps = 1,
                 .use_syrk = true,
                 .elem_size = elem_size};
}

// 512 x 256 rows split over G = 2, one step, syrk, fp32.
// duplicated: NS of 512 x 256 with the Gram on the 256 columns (s = 256, l = 512):
//   Gram syrk s^2 l = 2^25 and A A syrk s^3 = 2^24 at 50 GFLOP/s, update gemm 2 s^2 l = 2^26 at
//   100. Elementwise over x = 2^17 elements: the norm x at 1 G/s; passes at 2 G/s: normalise,
//   Muon scale, copy back (one step is odd): 3 x, plus the slice copied back x / G;
//   B = b A + c A A, s^2 = 2^16 at 4 G/s; fresh buffers at 0.5 G/s: the iteration's scratch (x),
//   A and B (2 s^2), the gathered matrix (x). One all-gather of 2^19
//   payload bytes: 2^18 on the wire at 5 GB/s, one ring step of 2 us.
// distributed: NS of the 256 x 256 shard with the Gram on its columns (s = l = 256): 2^24 syrk,
//   2^24 syrk, 2^25 gemm; elementwise over x = 2^16: norm x, passes 3 x, axpby 2^16, fills
//   x + 2 s^2 = 3 x 2^16; all-reduces of 8 bytes (norm) and 2^18 bytes (Gram): 2 payload (G - 1) /
//   G on the wire at 4 GB/s, 2 ring steps of 1 us each.
TEST(CalibratedModel, UsesTheMeasuredRatesAndFits) {
  const HardwareProfile p = measured_profile();
  const CostEstimate e = estimate_refined(key_512x256(), &p);
  expect_rel(e.duplicated.compute_s, 0x1p25 / 50e9 + 0x1p24 / 50e9 + 0x1p26 / 100e9);
  expect_rel(e.duplicated.elementwise_s,
             0x1p17 / 1e9 + (3 * 0x1p17 + 0x1p16) / 2e9 + 0x1p16 / 4e9 + 3 * 0x1p17 / 0.5e9);
  expect_rel(e.duplicated.elementwise_elements,
             0x1p17 + (3 * 0x1p17 + 0x1p16) + 0x1p16 + 3 * 0x1p17);
  expect_rel(e.duplicated.bandwidth_s, 0x1p18 / 5e9);
  expect_rel(e.duplicated.latency_s, 2e-6);
  EXPECT_EQ(e.duplicated.flops, 0x1p25 + 0x1p24 + 0x1p26);  // the FLOP count is unchanged

  expect_rel(e.distributed.compute_s, 0x1p24 / 50e9 + 0x1p24 / 50e9 + 0x1p25 / 100e9);
  expect_rel(e.distributed.elementwise_s,
             0x1p16 / 1e9 + 3 * 0x1p16 / 2e9 + 0x1p16 / 4e9 + 3 * 0x1p16 / 0.5e9);
  expect_rel(e.distributed.bandwidth_s, (8 + 0x1p18) / 4e9);
  expect_rel(e.distributed.latency_s, 4e-6);
  expect_rel(e.duplicated.seconds(), e.duplicated.compute_s + e.duplicated.elementwise_s +
                                         e.duplicated.bandwidth_s + e.duplicated.latency_s);
  // duplicated ~1.68 ms + 1.16 + 0.05; distributed ~1.0 ms + 0.57 + 0.07.
  EXPECT_EQ(e.choice, TpMode::kDistributed);
}

TEST(CalibratedModel, DatasheetFiguresWhereTheCalibrationDoesNotApply) {
  const HardwareProfile p = measured_profile();
  // bf16 was not measured: compute at the datasheet peak, no elementwise time; the collectives
  // (same domain) still use the fits.
  const CostEstimate bf16 = estimate_refined(key_512x256(/*elem_size=*/2), &p);
  expect_rel(bf16.duplicated.compute_s, (0x1p25 + 0x1p24 + 0x1p26) / 1e12);
  EXPECT_EQ(bf16.duplicated.elementwise_s, 0.0);
  expect_rel(bf16.duplicated.bandwidth_s, 0x1p17 / 5e9);  // 2-byte elements
  // A crossing group was not measured: the collectives use the datasheet bandwidth and latency.
  const CostEstimate crossing = estimate_refined(key_512x256(4, /*crosses=*/true), &p);
  expect_rel(crossing.duplicated.bandwidth_s, 0x1p18 / 1000e9);
  expect_rel(crossing.duplicated.latency_s, 100e-6);
  expect_rel(crossing.duplicated.compute_s, 0x1p25 / 50e9 + 0x1p24 / 50e9 + 0x1p26 / 100e9);
  // The reference model ignores the calibration.
  const CostEstimate ref = estimate_reference(key_512x256(), &p);
  expect_rel(ref.duplicated.compute_s, (0x1p25 + 0x1p24 + 0x1p26) / 1e12);
}

TEST(CalibratedModel, WithoutTheCalibrationTheProfileGivesTheDatasheetModel) {
  HardwareProfile p = measured_profile();
  p.calibration.reset();
  const CostEstimate e = estimate_refined(key_512x256(), &p);
  expect_rel(e.duplicated.compute_s, (0x1p25 + 0x1p24 + 0x1p26) / 1e12);
  EXPECT_EQ(e.duplicated.elementwise_s, 0.0);
  expect_rel(e.duplicated.bandwidth_s, 0x1p18 / 1000e9);
}

// Each product runs at the rate measured for its own shape: the Gram syrk and the update gemm at
// (s, l), the A A syrk at (s, s).
TEST(CalibratedModel, ProductsAtTheRatesOfTheirShapes) {
  HardwareProfile p = measured_profile();
  p.calibration->gram_syrk = {{128, 256}, {256, 512}, {{10, 20}, {40, 80}}};
  p.calibration->update_gemm = {{128, 256}, {256, 512}, {{15, 30}, {60, 120}}};
  const CostEstimate e = estimate_refined(key_512x256(), &p);
  // duplicated: s = 256, l = 512.
  expect_rel(e.duplicated.compute_s, 0x1p25 / 80e9 + 0x1p24 / 40e9 + 0x1p26 / 120e9);
  // distributed: the 256 x 256 shard, s = l = 256.
  expect_rel(e.distributed.compute_s, 0x1p24 / 40e9 + 0x1p24 / 40e9 + 0x1p25 / 60e9);
}

// Bilinear in (log s, log l) on log(rate), the edge values outside the grid.
TEST(Calibration, RateTableInterpolation) {
  const RateTable t{{100, 400}, {100, 400}, {{10, 40}, {40, 160}}};
  expect_rel(t.flops_per_s(200, 200), 40e9);   // (10 40 40 160)^(1/4)
  expect_rel(t.flops_per_s(200, 100), 20e9);   // sqrt(10 40)
  expect_rel(t.flops_per_s(50, 1000), 40e9);   // clamped to (100, 400)
  expect_rel(t.flops_per_s(400, 400), 160e9);  // a grid point
  const RateTable one{{256}, {256}, {{7}}};
  expect_rel(one.flops_per_s(10, 1e6), 7e9);
}

TEST(Calibration, JsonRoundTripAndOldFilesStillLoad) {
  const HardwareProfile p = measured_profile();
  const nlohmann::json j = p;
  EXPECT_EQ(j.at("calibration").at("gram_syrk").at("gflops").size(), 2u);
  EXPECT_EQ(j.get<HardwareProfile>(), p);
  nlohmann::json old = j;
  old.erase("calibration");
  const HardwareProfile q = old.get<HardwareProfile>();
  EXPECT_FALSE(q.calibration.has_value());
  // A group of one has no collective fits.
  HardwareProfile single = p;
  single.calibration->all_gather.reset();
  single.calibration->all_reduce.reset();
  const nlohmann::json js = single;
  EXPECT_FALSE(js.at("calibration").contains("all_gather"));
  EXPECT_EQ(js.get<HardwareProfile>(), single);
  // Through a file, as --profile FILE reads it.
  const auto file = std::filesystem::temp_directory_path() /
                    ("distmuon-test-calibrated-" + std::to_string(::getpid()) + ".json");
  save_profile(p, file);
  EXPECT_EQ(load_profile(file), p);
  EXPECT_EQ(resolve_profile(file.string()), p);
  std::filesystem::remove(file);
}

TEST(Calibration, MalformedFieldsAreNamed) {
  const nlohmann::json good = measured_profile();
  const auto message = [](const nlohmann::json& j) {
    try {
      (void)j.get<HardwareProfile>();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  nlohmann::json j = good;
  j["calibration"].erase("gram_syrk");
  EXPECT_NE(message(j).find("gram_syrk"), std::string::npos) << message(j);
  j = good;
  j["calibration"]["update_gemm"]["s"] = nlohmann::json::array();
  EXPECT_NE(message(j).find("calibration.update_gemm.s"), std::string::npos) << message(j);
  j = good;
  j["calibration"]["gram_syrk"]["l"] = {4096, 64};  // not ascending
  EXPECT_NE(message(j).find("calibration.gram_syrk.l"), std::string::npos) << message(j);
  j = good;
  j["calibration"]["gram_syrk"]["gflops"] = {{50, 50}};  // one row for two sizes
  EXPECT_NE(message(j).find("calibration.gram_syrk.gflops"), std::string::npos) << message(j);
  j = good;
  j["calibration"]["all_reduce"]["gbps"] = 0;
  EXPECT_NE(message(j).find("calibration.all_reduce.gbps"), std::string::npos) << message(j);
  j = good;
  j["calibration"]["elementwise_gelems"]["axpby"] = "fast";
  EXPECT_NE(message(j).find("elementwise_gelems"), std::string::npos) << message(j);
  j = good;
  j["calibration"] = 3;
  EXPECT_NE(message(j).find("calibration"), std::string::npos) << message(j);
}

}  // namespace
}  // namespace distmuon
