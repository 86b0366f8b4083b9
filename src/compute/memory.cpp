// Backend-owned memory: Compute's counted allocation, DeviceMatrix, host <-> backend copies, and
// the batched reductions' default loops, the host form of Newton-Schulz's normalisation, and the
// bf16 wire's default (none).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "distmuon/compute.h"
#include "distmuon/error.h"

namespace distmuon {

float* Compute::allocate(std::size_t count) {
  if (count == 0) return nullptr;
  float* p = do_allocate(count);
  if (p == nullptr) {
    throw Error(fmt::format("{}: allocating {} floats ({} bytes) failed", name(), count,
                            count * sizeof(float)));
  }
  ++allocations_;
  const std::size_t live = live_bytes_ += count * sizeof(float);
  std::size_t peak = peak_bytes_.load();
  while (live > peak && !peak_bytes_.compare_exchange_weak(peak, live)) {
  }
  return p;
}

void Compute::release(float* data, std::size_t count) noexcept {
  if (data == nullptr) return;
  do_release(data, count);
  ++releases_;
  live_bytes_ -= count * sizeof(float);
}

MemoryStats Compute::memory_stats() const {
  return {allocations_.load(), releases_.load(), live_bytes_.load(), peak_bytes_.load()};
}

void Compute::sum_squares(std::span<const ConstMatrixView> as, bool in_double,
                          std::span<double> out) {
  DISTMUON_ASSERT(as.size() == out.size(), "one result per matrix");
  for (std::size_t i = 0; i < as.size(); ++i)
    out[i] = sum_squares(as[i], in_double);
}

std::optional<double> Compute::normalize(MatrixView x, double eps, bool in_double,
                                         const Communicator* group) {
  double ss = sum_squares(x, in_double);
  if (group != nullptr) ss = group->all_reduce(ss);
  if (std::isfinite(ss)) scale(x, static_cast<float>(1.0 / std::max(std::sqrt(ss), eps)));
  return ss;
}

void Compute::find_non_finite(std::span<const ConstMatrixView> as,
                              std::span<std::optional<MatrixIndex>> out) {
  DISTMUON_ASSERT(as.size() == out.size(), "one result per matrix");
  for (std::size_t i = 0; i < as.size(); ++i)
    out[i] = find_non_finite(as[i]);
}

DeviceMatrix::DeviceMatrix(Compute& compute, Index rows, Index cols) {
  ensure(compute, rows, cols);
}

DeviceMatrix::DeviceMatrix(DeviceMatrix&& o) noexcept
    : compute_(o.compute_), data_(o.data_), rows_(o.rows_), cols_(o.cols_) {
  o.compute_ = nullptr;
  o.data_ = nullptr;
  o.rows_ = o.cols_ = 0;
}

DeviceMatrix& DeviceMatrix::operator=(DeviceMatrix&& o) noexcept {
  if (this != &o) {
    reset();
    compute_ = o.compute_;
    data_ = o.data_;
    rows_ = o.rows_;
    cols_ = o.cols_;
    o.compute_ = nullptr;
    o.data_ = nullptr;
    o.rows_ = o.cols_ = 0;
  }
  return *this;
}

void DeviceMatrix::ensure(Compute& compute, Index rows, Index cols) {
  if (rows < 0 || cols < 0)
    throw Error(fmt::format("DeviceMatrix: negative shape {}", shape_str(rows, cols)));
  if (compute_ == &compute && rows_ == rows && cols_ == cols) return;
  reset();
  data_ = compute.allocate(static_cast<std::size_t>(rows * cols));
  compute_ = &compute;
  rows_ = rows;
  cols_ = cols;
}

void DeviceMatrix::reset() noexcept {
  if (compute_ != nullptr) compute_->release(data_, static_cast<std::size_t>(size()));
  compute_ = nullptr;
  data_ = nullptr;
  rows_ = cols_ = 0;
}

DeviceMatrix to_device(Compute& compute, ConstMatrixView host) {
  DeviceMatrix out(compute, host.rows, host.cols);
  compute.copy_from_host(host, out.view());
  return out;
}

Matrix to_host(Compute& compute, ConstMatrixView src) {
  Matrix out(src.rows, src.cols);
  compute.copy_to_host(src, out.view());
  return out;
}

void Compute::pack_bf16(ConstMatrixView a, float*) {
  throw Error(fmt::format("the {} backend has no bf16 wire (packing {})", name(), shape_str(a)));
}

void Compute::unpack_bf16(const float*, MatrixView a) {
  throw Error(fmt::format("the {} backend has no bf16 wire (unpacking {})", name(),
                          shape_str(a.rows, a.cols)));
}

}  // namespace distmuon
