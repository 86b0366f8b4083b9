// Compute's batched products (compute.h): the argument checks every backend shares, the call
// counts, and the default that runs each matrix's product in turn.
#include <fmt/format.h>

#include "compute/shape_checks.h"
#include "distmuon/compute.h"
#include "distmuon/error.h"

namespace distmuon {
namespace detail {
namespace {

template <class View>
void check_count(const char* op, const char* name, std::span<const View> v, std::size_t count) {
  if (v.size() != count) {
    throw Error(fmt::format("{}: {} {} matrices for a batch of {}", op, v.size(), name, count));
  }
  for (const View& x : v) {
    if (x.rows != v[0].rows || x.cols != v[0].cols) {
      throw Error(fmt::format("{}: {} matrices of shapes {} and {} in one batch", op, name,
                              shape_str(v[0]), shape_str(x)));
    }
  }
}

}  // namespace

void check_gemm_batched(Trans ta, Trans tb, std::span<const ConstMatrixView> a,
                        std::span<const ConstMatrixView> b, std::span<const MatrixView> c) {
  check_count("gemm_batched", "a", a, c.size());
  check_count("gemm_batched", "b", b, c.size());
  check_count("gemm_batched", "c", c, c.size());
  for (std::size_t i = 0; i < c.size(); ++i)
    check_gemm(ta, tb, a[i], b[i], c[i]);
}

void check_syrk_batched(Trans ta, std::span<const ConstMatrixView> a,
                        std::span<const MatrixView> c) {
  check_count("syrk_batched", "a", a, c.size());
  check_count("syrk_batched", "c", c, c.size());
  for (std::size_t i = 0; i < c.size(); ++i)
    check_syrk(ta, a[i], c[i]);
}

std::optional<Index> batch_stride(std::span<const ConstMatrixView> views) {
  if (views.size() < 2) return Index{0};
  const Index stride = views[1].data - views[0].data;
  for (std::size_t i = 1; i < views.size(); ++i) {
    if (views[i].ld != views[0].ld || views[i].data - views[i - 1].data != stride) {
      return std::nullopt;
    }
  }
  return stride;
}

}  // namespace detail

void Compute::gemm_batched(Trans ta, Trans tb, float alpha, std::span<const ConstMatrixView> a,
                           std::span<const ConstMatrixView> b, float beta,
                           std::span<const MatrixView> c, Precision precision) {
  detail::check_gemm_batched(ta, tb, a, b, c);
  batched_calls_.fetch_add(1, std::memory_order_relaxed);
  batched_matrices_.fetch_add(c.size(), std::memory_order_relaxed);
  if (!c.empty()) do_gemm_batched(ta, tb, alpha, a, b, beta, c, precision);
}

void Compute::syrk_batched(Trans ta, float alpha, std::span<const ConstMatrixView> a, float beta,
                           std::span<const MatrixView> c, Precision precision) {
  detail::check_syrk_batched(ta, a, c);
  batched_calls_.fetch_add(1, std::memory_order_relaxed);
  batched_matrices_.fetch_add(c.size(), std::memory_order_relaxed);
  if (!c.empty()) do_syrk_batched(ta, alpha, a, beta, c, precision);
}

Compute::ProductCalls Compute::product_calls() const {
  return {gemm_calls_.load(), syrk_calls_.load(), batched_calls_.load(), batched_matrices_.load()};
}

void Compute::do_gemm_batched(Trans ta, Trans tb, float alpha, std::span<const ConstMatrixView> a,
                              std::span<const ConstMatrixView> b, float beta,
                              std::span<const MatrixView> c, Precision precision) {
  for (std::size_t i = 0; i < c.size(); ++i)
    do_gemm(ta, tb, alpha, a[i], b[i], beta, c[i], precision);
}

void Compute::do_syrk_batched(Trans ta, float alpha, std::span<const ConstMatrixView> a, float beta,
                              std::span<const MatrixView> c, Precision precision) {
  for (std::size_t i = 0; i < c.size(); ++i)
    do_syrk(ta, alpha, a[i], beta, c[i], precision);
}

}  // namespace distmuon
