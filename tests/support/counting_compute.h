#pragma once
// A counting Compute for the tests that check how much work the code under test issues.

#include <cstddef>
#include <map>
#include <optional>
#include <string>

#include "distmuon/compute.h"

namespace distmuon::test {

// A Compute that counts its calls by operation name ("gemm", "syrk", "copy", ...) and the FLOPs
// of its products as ns_flops counts them (gemm 2 m n k, syrk n^2 k), and runs each on the CPU
// backend (bit-equal to it).
class CountingCompute final : public Compute {
 public:
  std::map<std::string, int> calls;
  double flops = 0;
  std::string name() const override { return "counting"; }
  MemoryKind memory() const override { return MemoryKind::kHost; }
  void copy_from_host(ConstMatrixView host, MatrixView dst) override {
    cpu_compute().copy_from_host(host, dst);
  }
  void copy_to_host(ConstMatrixView src, MatrixView host) override {
    cpu_compute().copy_to_host(src, host);
  }
  void do_gemm(Trans ta, Trans tb, float alpha, ConstMatrixView a, ConstMatrixView b, float beta,
               MatrixView c, Precision precision) override {
    ++calls["gemm"];
    flops += 2.0 * c.rows * c.cols * (ta == Trans::kNo ? a.cols : a.rows);
    cpu_compute().gemm(ta, tb, alpha, a, b, beta, c, precision);
  }
  void do_syrk(Trans ta, float alpha, ConstMatrixView a, float beta, MatrixView c,
               Precision precision) override {
    ++calls["syrk"];
    flops += 1.0 * c.rows * c.cols * (ta == Trans::kNo ? a.cols : a.rows);
    cpu_compute().syrk(ta, alpha, a, beta, c, precision);
  }
  double sum_squares(ConstMatrixView a, bool in_double) override {
    ++calls["sum_squares"];
    return cpu_compute().sum_squares(a, in_double);
  }
  void scale(MatrixView a, float alpha) override {
    ++calls["scale"];
    cpu_compute().scale(a, alpha);
  }
  void axpby(float alpha, ConstMatrixView x, float beta, MatrixView y) override {
    ++calls["axpby"];
    cpu_compute().axpby(alpha, x, beta, y);
  }
  void pack_bf16(ConstMatrixView a, float* dst) override {
    ++calls["pack_bf16"];
    cpu_compute().pack_bf16(a, dst);
  }
  void unpack_bf16(const float* src, MatrixView a) override {
    ++calls["unpack_bf16"];
    cpu_compute().unpack_bf16(src, a);
  }
  void round(MatrixView a, Precision precision) override {
    ++calls["round"];
    cpu_compute().round(a, precision);
  }
  void add_diagonal(MatrixView a, float alpha) override {
    ++calls["add_diagonal"];
    cpu_compute().add_diagonal(a, alpha);
  }
  void fill(MatrixView a, float value) override {
    ++calls["fill"];
    cpu_compute().fill(a, value);
  }
  void copy(ConstMatrixView src, MatrixView dst) override {
    ++calls["copy"];
    cpu_compute().copy(src, dst);
  }
  std::optional<MatrixIndex> find_non_finite(ConstMatrixView a) override {
    ++calls["find_non_finite"];
    return cpu_compute().find_non_finite(a);
  }
  void muon_momentum(const MomentumStep& k, ConstMatrixView g, ConstMatrixView w, MatrixView buf,
                     MatrixView u) override {
    ++calls["muon_momentum"];
    cpu_compute().muon_momentum(k, g, w, buf, u);
  }
  void adamw(const AdamWStep& k, ConstMatrixView g, MatrixView m, MatrixView v,
             MatrixView p) override {
    ++calls["adamw"];
    cpu_compute().adamw(k, g, m, v, p);
  }

 protected:
  float* do_allocate(std::size_t count) override { return cpu_compute().allocate(count); }
  void do_release(float* data, std::size_t count) noexcept override {
    cpu_compute().release(data, count);
  }
};

}  // namespace distmuon::test
