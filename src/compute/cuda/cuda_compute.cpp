// The CUDA compute backend: cuBLAS for gemm and syrk, the kernels of cuda_kernels.cu for the
// rest, on device memory and one stream per backend. Row-major views map onto cuBLAS's
// column-major convention as their transposes: c = op(a) op(b) is c^T = op(b)^T op(a)^T.
#include "compute/cuda/cuda_compute.h"

#include <cublas_v2.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "comm/nccl/nccl_comm.h"
#include "compute/cuda/cuda_check.h"
#include "compute/cuda/cuda_kernels.h"
#include "compute/cuda/cuda_libraries.h"
#include "compute/shape_checks.h"
#include "core/host.h"
#include "distmuon/error.h"

namespace distmuon {
namespace {

using cuda::check;

using detail::check_ld;
using detail::check_same;
cublasOperation_t cublas_op(Trans t) {
  return t == Trans::kYes ? CUBLAS_OP_T : CUBLAS_OP_N;
}
cuda::Dev dev(MatrixView a) {
  return {a.data, a.rows, a.cols, a.ld};
}
cuda::ConstDev dev(ConstMatrixView a) {
  return {a.data, a.rows, a.cols, a.ld};
}

// cuBLAS takes int dimensions.
int blas_int(const char* op, Index v) {
  if (v > std::numeric_limits<int>::max()) {
    throw Error(fmt::format("{}: dimension {} exceeds cuBLAS's int range", op, v));
  }
  return static_cast<int>(v);
}

cublasComputeType_t compute_type(CudaPrecision p) {
  switch (p) {
    case CudaPrecision::kTf32:
      return CUBLAS_COMPUTE_32F_FAST_TF32;
    case CudaPrecision::kBf16:
      return CUBLAS_COMPUTE_32F_FAST_16BF;
    case CudaPrecision::kFp32:
    case CudaPrecision::kBf16Operands:  // bf16 operands, fp32 accumulation
      break;
  }
  return CUBLAS_COMPUTE_32F;
}

class CudaCompute final : public Compute {
 public:
  // external: the stream to run on, owned by the caller (PyTorch's current stream, possibly the
  // legacy default stream 0); none: a stream of the backend's own.
  CudaCompute(int device, CudaPrecision precision,
              std::optional<cudaStream_t> external = std::nullopt)
      : device_(device), precision_(precision), owns_stream_(!external) {
    check(cudaSetDevice(device_), "cudaSetDevice", fmt::format("device {}", device_));
    cuda::cublas();  // loads cuBLAS (or throws) before anything needs releasing
    if (external) {
      stream_ = *external;
    } else {
      check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate", "");
    }
    const auto rc = cuda::cublas().create(&blas_);
    if (rc != CUBLAS_STATUS_SUCCESS) {
      if (owns_stream_) cudaStreamDestroy(stream_);
      check(rc, "cublasCreate", fmt::format("device {}", device_));
    }
    check(cuda::cublas().set_stream(blas_, stream_), "cublasSetStream", "");
    // Freed memory stays in the stream-ordered pool instead of going back to the driver at
    // every synchronisation, so that a workspace released and allocated again costs nothing.
    cudaMemPool_t pool = nullptr;
    check(cudaDeviceGetDefaultMemPool(&pool, device_), "cudaDeviceGetDefaultMemPool", "");
    std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
          "cudaMemPoolSetAttribute", "release threshold");
  }
  ~CudaCompute() override {
    // Errors are ignored: at process exit the CUDA runtime may already be gone.
    cudaStreamSynchronize(stream_);
    if (results_ != nullptr) cudaFree(results_);
    if (host_results_ != nullptr) cudaFreeHost(host_results_);
    if (norm_slot_ != nullptr) cudaFree(norm_slot_);
    for (auto& buf : bf16_) {
      if (buf.data != nullptr) cudaFreeAsync(buf.data, stream_);
    }
    cudaStreamSynchronize(stream_);
    cuda::cublas().destroy(blas_);
    if (owns_stream_) cudaStreamDestroy(stream_);
  }
  CudaCompute(const CudaCompute&) = delete;
  CudaCompute& operator=(const CudaCompute&) = delete;

  std::string name() const override {
    return fmt::format("cuda:{}-{}", device_, to_string(precision_));
  }
  MemoryKind memory() const override { return MemoryKind::kDevice; }
  cudaStream_t stream() const { return stream_; }

  void synchronize() override {
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", name());
  }

  void copy_from_host(ConstMatrixView host, MatrixView dst) override {
    check_memory("copy_from_host", "the host side", host, false);
    check_memory("copy_from_host", "the destination", dst, true);
    copy_2d("copy_from_host", host, dst, cudaMemcpyHostToDevice);
    synchronize();  // the caller may free or change host memory on return
  }
  void copy_to_host(ConstMatrixView src, MatrixView host) override {
    check_memory("copy_to_host", "the source", src, true);
    check_memory("copy_to_host", "the host side", host, false);
    copy_2d("copy_to_host", src, host, cudaMemcpyDeviceToHost);
    synchronize();
  }

  Communicator data_communicator(const Communicator& host) override {
    std::lock_guard lock(comm_mutex_);
    // One NCCL communicator per host group, made collectively the first time and kept while
    // any Communicator holds it (the key stays valid that long: the NCCL communicator keeps
    // its host communicator alive).
    std::erase_if(comms_, [](const auto& kv) { return kv.second.expired(); });
    auto& slot = comms_[host.impl_ptr().get()];
    std::shared_ptr<CommImpl> nccl = slot.lock();
    if (!nccl) {
      nccl = make_nccl_comm(host.impl_ptr(), stream_, device_);
      slot = nccl;
    }
    return host.with_data(std::move(nccl));
  }

  void gemm(Trans ta, Trans tb, float alpha, ConstMatrixView a, ConstMatrixView b, float beta,
            MatrixView c) override {
    const auto [m, n, k] = detail::check_gemm(ta, tb, a, b, c);
    if (m == 0 || n == 0) return;
    if (k == 0) {
      scale(c, beta);
      return;
    }
    if (precision_ == CudaPrecision::kBf16Operands) {
      const void* a16 = bf16_copy(0, a, "gemm");
      const void* b16 = b.data == a.data && b.ld == a.ld && b.rows == a.rows && b.cols == a.cols
                            ? a16
                            : bf16_copy(1, b, "gemm");
      bf16_gemm("gemm", ta, tb, m, n, k, alpha, a16, a.cols, b16, b.cols, beta, c);
      return;
    }
    gemm_ex("gemm", ta, tb, m, n, k, alpha, a, b, beta, c);
  }

  void syrk(Trans ta, float alpha, ConstMatrixView a, float beta, MatrixView c) override {
    const auto [n, k] = detail::check_syrk(ta, a, c);
    if (n == 0) return;
    if (k == 0) {
      scale(c, beta);
      return;
    }
    if (precision_ == CudaPrecision::kBf16Operands) {
      const void* a16 = bf16_copy(0, a, "syrk");  // one copy serves as both operands
      bf16_gemm("syrk", ta, ta == Trans::kYes ? Trans::kNo : Trans::kYes, n, n, k, alpha, a16,
                a.cols, a16, a.cols, beta, c);
      return;
    }
    if (precision_ != CudaPrecision::kFp32) {
      // cuBLAS's syrk has no tensor-core compute type: the full product at the chosen
      // precision writes both triangles directly.
      gemm_ex("syrk", ta, ta == Trans::kYes ? Trans::kNo : Trans::kYes, n, n, k, alpha, a, a, beta,
              c);
      return;
    }
    // Row-major a (n x k, or k x n when transposed) is column-major a^T: c = op(a) op(a)^T is
    // the column-major syrk of a^T with the other transposition. Column-major lower is
    // row-major upper, mirrored into the lower triangle afterwards.
    const auto context = [&] {
      return fmt::format("op(a) {}, c {}", shape_str(n, k), shape_str(n, n));
    };
    check(cuda::cublas().ssyrk(blas_, CUBLAS_FILL_MODE_LOWER,
                               ta == Trans::kYes ? CUBLAS_OP_N : CUBLAS_OP_T, blas_int("syrk", n),
                               blas_int("syrk", k), &alpha, a.data, blas_int("syrk", a.ld), &beta,
                               c.data, blas_int("syrk", c.ld)),
          "cublasSsyrk", context());
    check(cuda::mirror_upper(stream_, dev(c)), "mirror_upper kernel", context());
  }

  double sum_squares(ConstMatrixView a, bool in_double) override {
    double out = 0.0;
    sum_squares(std::span<const ConstMatrixView>(&a, 1), in_double, std::span<double>(&out, 1));
    return out;
  }
  void sum_squares(std::span<const ConstMatrixView> as, bool in_double,
                   std::span<double> out) override {
    DISTMUON_ASSERT(as.size() == out.size(), "one result per matrix");
    if (as.empty()) return;
    auto* slots = static_cast<double*>(results(as.size() * sizeof(double), 0));
    for (std::size_t i = 0; i < as.size(); ++i) {
      check(cuda::sum_squares(stream_, dev(as[i]), in_double, slots + i), "sum_squares kernel",
            shape_str(as[i]));
    }
    fetch_results(as.size() * sizeof(double), "sum_squares");
    const auto* host = static_cast<const double*>(host_results_);
    std::copy_n(host, as.size(), out.begin());
  }

  // The device form (compute.h): the sum of squares into norm_slot_, summed over the group's data
  // plane (NCCL on this stream), then the scale computed from it by a kernel. No host wait.
  std::optional<double> normalize(MatrixView x, double eps, bool in_double,
                                  const Communicator* group) override {
    if (norm_slot_ == nullptr) {
      check(cudaMalloc(reinterpret_cast<void**>(&norm_slot_), sizeof(double)), "cudaMalloc",
            "the normalisation slot");
    }
    check(cudaMemsetAsync(norm_slot_, 0, sizeof(double), stream_), "cudaMemsetAsync",
          "the normalisation slot");
    check(cuda::sum_squares(stream_, dev(ConstMatrixView(x)), in_double, norm_slot_),
          "sum_squares kernel", shape_str(x));
    if (group != nullptr) group->data().all_reduce(std::span<double>(norm_slot_, 1));
    check(cuda::scale_by_norm(stream_, dev(x), norm_slot_, eps), "scale_by_norm kernel",
          shape_str(x));
    return std::nullopt;
  }

  std::optional<MatrixIndex> find_non_finite(ConstMatrixView a) override {
    std::optional<MatrixIndex> out;
    find_non_finite(std::span<const ConstMatrixView>(&a, 1),
                    std::span<std::optional<MatrixIndex>>(&out, 1));
    return out;
  }
  void find_non_finite(std::span<const ConstMatrixView> as,
                       std::span<std::optional<MatrixIndex>> out) override {
    DISTMUON_ASSERT(as.size() == out.size(), "one result per matrix");
    if (as.empty()) return;
    using U = unsigned long long;
    auto* slots = static_cast<U*>(results(as.size() * sizeof(U), 0xff));  // all ones: none
    for (std::size_t i = 0; i < as.size(); ++i) {
      check(cuda::find_non_finite(stream_, dev(as[i]), slots + i), "find_non_finite kernel",
            shape_str(as[i]));
    }
    fetch_results(as.size() * sizeof(U), "find_non_finite");
    const auto* host = static_cast<const U*>(host_results_);
    for (std::size_t i = 0; i < as.size(); ++i) {
      if (host[i] == std::numeric_limits<U>::max()) {
        out[i] = std::nullopt;
      } else {
        const auto t = static_cast<Index>(host[i]);
        out[i] = MatrixIndex{t / as[i].cols, t % as[i].cols};
      }
    }
  }

  void scale(MatrixView a, float alpha) override {
    check(cuda::scale(stream_, dev(a), alpha), "scale kernel", shape_str(a.rows, a.cols));
  }
  void axpby(float alpha, ConstMatrixView x, float beta, MatrixView y) override {
    if (x.rows != y.rows || x.cols != y.cols) {
      throw Error(
          fmt::format("axpby: shape mismatch {} vs {}", shape_str(x), shape_str(y.rows, y.cols)));
    }
    check(cuda::axpby(stream_, alpha, dev(x), beta, dev(y)), "axpby kernel", shape_str(x));
  }
  void add_diagonal(MatrixView a, float alpha) override {
    if (a.rows != a.cols) {
      throw Error(fmt::format("add_diagonal: matrix {} is not square", shape_str(a.rows, a.cols)));
    }
    check(cuda::add_diagonal(stream_, dev(a), alpha), "add_diagonal kernel",
          shape_str(a.rows, a.cols));
  }
  void fill(MatrixView a, float value) override {
    check(cuda::fill(stream_, dev(a), value), "fill kernel", shape_str(a.rows, a.cols));
  }
  void copy(ConstMatrixView src, MatrixView dst) override {
    check_same("copy", "destination", dst, src);
    if (src.data == dst.data) return;
    copy_2d("copy", src, dst, cudaMemcpyDeviceToDevice);
  }

  void muon_momentum(const MomentumStep& k, ConstMatrixView g, ConstMatrixView w, MatrixView buf,
                     MatrixView u) override {
    check_same("muon_momentum", "weight", w, g);
    check_same("muon_momentum", "momentum", buf, g);
    check_same("muon_momentum", "update", u, g);
    check(cuda::muon_momentum(stream_, {k.momentum, k.l2, k.nesterov}, dev(g), dev(w), dev(buf),
                              dev(u)),
          "muon_momentum kernel", shape_str(g));
  }
  void adamw(const AdamWStep& k, ConstMatrixView g, MatrixView m, MatrixView v,
             MatrixView p) override {
    check_same("adamw", "first moment", m, g);
    check_same("adamw", "second moment", v, g);
    check_same("adamw", "parameter", p, g);
    check(cuda::adamw(stream_, {k.beta1, k.beta2, k.bias1, k.bias2_sqrt, k.decay, k.lr, k.eps},
                      dev(g), dev(m), dev(v), dev(p)),
          "adamw kernel", shape_str(g));
  }

 protected:
  float* do_allocate(std::size_t count) override {
    const std::size_t bytes = count * sizeof(float);
    void* p = nullptr;
    check(cudaMallocAsync(&p, bytes, stream_), "cudaMallocAsync",
          fmt::format("{} floats ({} bytes) on {}", count, bytes, name()));
    const auto rc = cudaMemsetAsync(p, 0, bytes, stream_);
    if (rc != cudaSuccess) {
      cudaFreeAsync(p, stream_);
      check(rc, "cudaMemsetAsync", fmt::format("zero-filling {} bytes", bytes));
    }
    return static_cast<float*>(p);
  }
  void do_release(float* data, std::size_t) noexcept override {
    // Stream-ordered: the memory is reused only by work queued after this point.
    cudaFreeAsync(data, stream_);
  }

 private:
  // Refuses host memory where device memory belongs and the reverse (managed memory is both),
  // as the opaque backend does, so that a mixed-up copy fails with a clear message.
  static void check_memory(const char* op, const char* name, ConstMatrixView v, bool device) {
    if (v.size() == 0) return;
    cudaPointerAttributes attr{};
    check(cudaPointerGetAttributes(&attr, v.data), "cudaPointerGetAttributes", op);
    if (attr.type == cudaMemoryTypeManaged) return;
    if ((attr.type == cudaMemoryTypeDevice) != device) {
      throw Error(fmt::format("{}: {} ({}) is {} memory, expected {} memory", op, name,
                              shape_str(v), device ? "host" : "device",
                              device ? "device" : "host"));
    }
  }

  // A strided 2-D copy of src into dst (same shapes, any leading dimensions).
  void copy_2d(const char* op, ConstMatrixView src, MatrixView dst, cudaMemcpyKind kind) {
    check_same(op, "destination", dst, src);
    check_ld(op, "source", src.cols, src.ld);
    check_ld(op, "destination", dst.cols, dst.ld);
    if (src.size() == 0) return;
    const std::size_t row = sizeof(float) * static_cast<std::size_t>(src.cols);
    check(cudaMemcpy2DAsync(dst.data, sizeof(float) * static_cast<std::size_t>(dst.ld), src.data,
                            sizeof(float) * static_cast<std::size_t>(src.ld), row,
                            static_cast<std::size_t>(src.rows), kind, stream_),
          "cudaMemcpy2DAsync",
          fmt::format("{}: {} (ld {}) to ld {}", op, shape_str(src), src.ld, dst.ld));
  }

  void gemm_ex(const char* op, Trans ta, Trans tb, Index m, Index n, Index k, float alpha,
               ConstMatrixView a, ConstMatrixView b, float beta, MatrixView c) {
    check(cuda::cublas().gemm_ex(blas_, cublas_op(tb), cublas_op(ta), blas_int(op, n),
                                 blas_int(op, m), blas_int(op, k), &alpha, b.data, CUDA_R_32F,
                                 blas_int(op, b.ld), a.data, CUDA_R_32F, blas_int(op, a.ld), &beta,
                                 c.data, CUDA_R_32F, blas_int(op, c.ld), compute_type(precision_),
                                 CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx",
          fmt::format("{} ({}): op(a) {} x op(b) {} into c {}", op, to_string(precision_),
                      shape_str(m, k), shape_str(k, n), shape_str(m, n)));
  }

  // A contiguous bf16 copy of a in scratch buffer `slot` (0 or 1), grown when needed. The
  // scratch is stream-ordered like everything else: a product queued later reuses it safely.
  const void* bf16_copy(int slot, ConstMatrixView a, const char* op) {
    const auto bytes = static_cast<std::size_t>(a.rows * a.cols) * 2;
    auto& buf = bf16_[slot];
    if (bytes > buf.bytes) {
      if (buf.data != nullptr) cudaFreeAsync(buf.data, stream_);
      buf = {};
      check(cudaMallocAsync(&buf.data, bytes, stream_), "cudaMallocAsync",
            fmt::format("{}: bf16 copy of {}", op, shape_str(a)));
      buf.bytes = bytes;
    }
    check(cuda::to_bf16(stream_, dev(a), buf.data), "to_bf16 kernel",
          fmt::format("{}: {}", op, shape_str(a)));
    return buf.data;
  }
  // c = alpha op(a) op(b) + beta c on contiguous bf16 copies (leading dimensions lda, ldb: the
  // original column counts), fp32 c and accumulation.
  void bf16_gemm(const char* op, Trans ta, Trans tb, Index m, Index n, Index k, float alpha,
                 const void* a, Index lda, const void* b, Index ldb, float beta, MatrixView c) {
    check(cuda::cublas().gemm_ex(blas_, cublas_op(tb), cublas_op(ta), blas_int(op, n),
                                 blas_int(op, m), blas_int(op, k), &alpha, b, CUDA_R_16BF,
                                 blas_int(op, std::max<Index>(1, ldb)), a, CUDA_R_16BF,
                                 blas_int(op, std::max<Index>(1, lda)), &beta, c.data, CUDA_R_32F,
                                 blas_int(op, c.ld), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx",
          fmt::format("{} (bf16 operands): op(a) {} x op(b) {} into c {}", op, shape_str(m, k),
                      shape_str(k, n), shape_str(m, n)));
  }

  // The device slots of a batched reduction (grown when needed, set to `byte`).
  void* results(std::size_t bytes, int byte) {
    if (bytes > results_bytes_) {
      check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", "growing the result slots");
      if (results_ != nullptr) cudaFree(results_);
      if (host_results_ != nullptr) cudaFreeHost(host_results_);
      results_ = nullptr;
      host_results_ = nullptr;
      results_bytes_ = 0;
      const std::size_t grow = std::max<std::size_t>(bytes, 4096);
      check(cudaMalloc(&results_, grow), "cudaMalloc", fmt::format("{} result bytes", grow));
      check(cudaMallocHost(&host_results_, grow), "cudaMallocHost",
            fmt::format("{} result bytes", grow));
      results_bytes_ = grow;
    }
    check(cudaMemsetAsync(results_, byte, bytes, stream_), "cudaMemsetAsync", "result slots");
    return results_;
  }
  // One transfer of the batch's results to the pinned host slots, then a synchronisation.
  void fetch_results(std::size_t bytes, const char* op) {
    check(cudaMemcpyAsync(host_results_, results_, bytes, cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync", fmt::format("{} results", op));
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", op);
  }

  int device_;
  CudaPrecision precision_;
  bool owns_stream_ = true;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* results_ = nullptr;
  void* host_results_ = nullptr;
  std::size_t results_bytes_ = 0;
  double* norm_slot_ = nullptr;  // normalize's sum of squares (device memory, made on first use)
  struct Scratch {
    void* data = nullptr;
    std::size_t bytes = 0;
  };
  Scratch bf16_[2];  // kBf16Operands: the bf16 copies of a product's operands
  std::mutex comm_mutex_;
  std::map<const CommImpl*, std::weak_ptr<CommImpl>> comms_;
};

int current_device() {
  const int count = cuda_device_count();
  if (count == 0) {
    int n = 0;
    const cudaError_t rc = cudaGetDeviceCount(&n);
    throw Error(fmt::format("device cuda: no CUDA device ({})",
                            rc == cudaSuccess
                                ? "cudaGetDeviceCount found none"
                                : fmt::format("cudaGetDeviceCount: {}", cudaGetErrorString(rc))));
  }
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice", "");
  return device;
}

}  // namespace

std::unique_ptr<Compute> make_cuda_compute(CudaPrecision precision) {
  return std::make_unique<CudaCompute>(current_device(), precision);
}

Compute& cuda_compute() {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<Compute>> instances;
  const int device = current_device();
  std::lock_guard lock(mutex);
  auto& slot = instances[device];
  if (!slot) slot = std::make_unique<CudaCompute>(device, cuda_precision_from_env());
  return *slot;
}

Compute& cuda_compute_of_this_rank() {
  current_device();  // throws when there is none
  const int count = cuda_device_count();
  int device = detail::node_local_rank() % count;
  if (const char* v = std::getenv("DISTMUON_CUDA_DEVICE"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const long d = std::strtol(v, &end, 10);
    if (*end != '\0' || d < 0 || d >= count) {
      throw Error(
          fmt::format("device cuda: DISTMUON_CUDA_DEVICE={} is not a device of this node "
                      "(0 to {})",
                      v, count - 1));
    }
    device = static_cast<int>(d);
  }
  check(cudaSetDevice(device), "cudaSetDevice", fmt::format("device {}", device));
  return cuda_compute();
}

std::unique_ptr<Compute> make_cuda_compute_on_stream(int device, cudaStream_t stream,
                                                     CudaPrecision precision) {
  const int count = cuda_device_count();
  if (device < 0 || device >= count) {
    throw Error(fmt::format("device cuda:{}: not a CUDA device of this process ({} device(s))",
                            device, count));
  }
  return std::make_unique<CudaCompute>(device, precision, stream);
}

Compute& cuda_compute_on_stream(int device, std::uintptr_t stream) {
  static std::mutex mutex;
  static std::map<std::pair<int, std::uintptr_t>, std::unique_ptr<Compute>> instances;
  std::lock_guard lock(mutex);
  auto& slot = instances[{device, stream}];
  if (!slot) {
    slot = make_cuda_compute_on_stream(device, reinterpret_cast<cudaStream_t>(stream),
                                       cuda_precision_from_env());
  }
  return *slot;
}

cudaStream_t cuda_stream(Compute& compute) {
  auto* cuda = dynamic_cast<CudaCompute*>(&compute);
  if (cuda == nullptr) {
    throw Error(fmt::format("cuda_stream: {} is not a CUDA backend", compute.name()));
  }
  return cuda->stream();
}

}  // namespace distmuon
