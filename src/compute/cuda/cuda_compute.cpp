// The CUDA compute backend: cuBLAS for gemm and syrk, the kernels of cuda_kernels.cu for the
// rest, on device memory and one stream per backend. Row-major views map onto cuBLAS's
// column-major convention as their transposes: c = op(a) op(b) is c^T = op(b)^T op(a)^T.
#include "compute/cuda/cuda_compute.h"

#include <cublas_v2.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/nccl/nccl_comm.h"
#include "compute/cuda/cuda_check.h"
#include "compute/cuda/cuda_graphs.h"
#include "compute/cuda/cuda_kernels.h"
#include "compute/cuda/cuda_libraries.h"
#include "compute/cuda/cuda_nccl_device.h"
#include "compute/cuda/cuda_products.h"
#include "compute/cuda/cuda_staged_comm.h"
#include "compute/cuda/cuda_stream_timer.h"
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

using cuda::blas_int;

// The compute type of an fp32-operand product (bf16 runs on bf16 copies instead: bf16_gemm).
cublasComputeType_t compute_type(Precision p) {
  return p == Precision::kTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

class CudaCompute final : public Compute {
 public:
  // external: the stream to run on, owned by the caller (PyTorch's current stream, possibly the
  // legacy default stream 0); none: a stream of the backend's own.
  CudaCompute(int device, std::optional<Precision> override,
              std::optional<cudaStream_t> external = std::nullopt)
      : device_(device), override_(override), owns_stream_(!external) {
    const bool graphs = cuda::cuda_graphs_option();  // throws on a bad value before anything
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
    make_pool();
    if (graphs) {
      try {
        set_graphs(true);
      } catch (...) {  // the destructor does not run: release what is made
        release_scratch(blas_workspace_);
        cudaStreamSynchronize(stream_);
        cudaMemPoolDestroy(pool_);
        cuda::cublas().destroy(blas_);
        if (owns_stream_) cudaStreamDestroy(stream_);
        throw;
      }
    }
  }
  ~CudaCompute() override {
    // Errors are ignored: at process exit the CUDA runtime may already be gone.
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    graphs_.clear();  // before the memory they use goes
    if (host_results_ != nullptr) cudaFreeHost(host_results_);
    release_scratch(results_);
    release_scratch(norm_slot_);
    release_scratch(block_pointers_);
    for (auto& buf : bf16_)
      release_scratch(buf);
    release_scratch(blas_workspace_);
    cudaStreamSynchronize(stream_);
    // Memory still allocated from the pool (a DeviceMatrix outliving its backend) keeps it
    // until released (cudaMemPoolDestroy defers).
    cudaMemPoolDestroy(pool_);
    cuda::cublas().destroy(blas_);
    if (owns_stream_) cudaStreamDestroy(stream_);
  }
  CudaCompute(const CudaCompute&) = delete;
  CudaCompute& operator=(const CudaCompute&) = delete;

  std::string name() const override {
    return override_ ? fmt::format("cuda:{}-{}", device_, to_string(*override_))
                     : fmt::format("cuda:{}", device_);
  }
  MemoryKind memory() const override { return MemoryKind::kDevice; }
  // bf16 on tensor cores, as PyTorch's, Keller Jordan's and Megatron's Muon run NS on GPUs
  // (docs/precision.md); the override when one is set.
  Precision default_precision() const override { return override_.value_or(Precision::kBf16); }
  cudaStream_t stream() const { return stream_; }

  // A host wait: bounded by the NCCL deadline while this backend has NCCL communicators
  // (nccl_wait: a collective waiting for a peer that stalled or died ends in their failure
  // protocol instead of hanging), else cudaStreamSynchronize.
  void synchronize() override {
    make_current("synchronize");
    if (nccl_device_) {
      nccl_wait(*nccl_device_, "synchronize");
    } else {
      check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", name());
    }
    check_released();
  }

  std::unique_ptr<StreamTimer> stream_timer() override;

  void copy_from_host(ConstMatrixView host, MatrixView dst) override {
    make_current("copy_from_host");
    check_memory("copy_from_host", "the host side", host, false);
    check_memory("copy_from_host", "the destination", dst, true);
    copy_2d("copy_from_host", host, dst, cudaMemcpyHostToDevice);
    synchronize();  // the caller may free or change host memory on return
  }
  void copy_to_host(ConstMatrixView src, MatrixView host) override {
    make_current("copy_to_host");
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
    if (!nccl && cuda::staged_data_plane()) {
      nccl = cuda::make_staged_comm(host.impl_ptr(), device_, stream_);  // no NCCL: via the host
      slot = nccl;
    } else if (!nccl) {
      if (!nccl_device_) nccl_device_ = cuda::make_cuda_nccl_device(device_, stream_);
      nccl = make_nccl_comm(host.impl_ptr(), nccl_device_);
      slot = nccl;
    }
    return host.with_data(std::move(nccl));
  }

  void do_gemm(Trans ta, Trans tb, float alpha, ConstMatrixView a, ConstMatrixView b, float beta,
               MatrixView c, Precision requested) override {
    const auto [m, n, k] = detail::check_gemm(ta, tb, a, b, c);
    make_current("gemm");
    if (m == 0 || n == 0) return;
    if (k == 0) {
      scale(c, beta);
      return;
    }
    const Precision precision = override_.value_or(requested);
    if (precision == Precision::kBf16) {
      const void* a16 = bf16_copy(0, a, "gemm");
      const void* b16 = b.data == a.data && b.ld == a.ld && b.rows == a.rows && b.cols == a.cols
                            ? a16
                            : bf16_copy(1, b, "gemm");
      bf16_gemm("gemm", ta, tb, m, n, k, alpha, a16, a.cols, b16, b.cols, beta, c);
      return;
    }
    gemm_ex("gemm", precision, ta, tb, m, n, k, alpha, a, b, beta, c);
  }

  void do_syrk(Trans ta, float alpha, ConstMatrixView a, float beta, MatrixView c,
               Precision requested) override {
    const auto [n, k] = detail::check_syrk(ta, a, c);
    make_current("syrk");
    if (n == 0) return;
    if (k == 0) {
      scale(c, beta);
      return;
    }
    // cuBLAS's syrk has no tensor-core compute type: at a reduced precision the blocks on and
    // above the diagonal are products of their own (upper_triangle_product).
    const Precision precision = override_.value_or(requested);
    if (precision == Precision::kBf16) {
      const void* a16 = bf16_copy(0, a, "syrk");  // one copy serves as both operands
      upper_triangle_product(precision, ta, n, k, alpha, a16, CUDA_R_16BF, a.cols, beta, c,
                             CUBLAS_COMPUTE_32F);
      return;
    }
    if (precision != Precision::kFp32) {
      upper_triangle_product(precision, ta, n, k, alpha, a.data, CUDA_R_32F, a.ld, beta, c,
                             compute_type(precision));
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

  // Batched products (compute.h): one cublasGemmStridedBatchedEx when the batch is equally
  // strided (a stacked parameter's slices, the batched NS workspaces) at fp32 or tf32; otherwise
  // (bf16 operand copies, scattered views) each product in turn. syrk's batch is a batch of full
  // products (both triangles computed), cuBLAS having no batched syrk.
  void do_gemm_batched(Trans ta, Trans tb, float alpha, std::span<const ConstMatrixView> a,
                       std::span<const ConstMatrixView> b, float beta,
                       std::span<const MatrixView> c, Precision requested) override {
    const Precision precision = override_.value_or(requested);
    std::vector<ConstMatrixView> cc(c.begin(), c.end());
    const auto sa = detail::batch_stride(a), sb = detail::batch_stride(b),
               sc = detail::batch_stride(cc);
    if (c.size() < 2 || precision == Precision::kBf16 || !sa || !sb || !sc) {
      Compute::do_gemm_batched(ta, tb, alpha, a, b, beta, c, precision);
      return;
    }
    strided_gemm("gemm_batched", precision, ta, tb, alpha, a[0], *sa, b[0], *sb, beta, c[0], *sc,
                 c.size());
  }
  void do_syrk_batched(Trans ta, float alpha, std::span<const ConstMatrixView> a, float beta,
                       std::span<const MatrixView> c, Precision requested) override {
    const Precision precision = override_.value_or(requested);
    std::vector<ConstMatrixView> cc(c.begin(), c.end());
    const auto sa = detail::batch_stride(a), sc = detail::batch_stride(cc);
    if (c.size() < 2 || precision == Precision::kBf16 || !sa || !sc) {
      Compute::do_syrk_batched(ta, alpha, a, beta, c, precision);
      return;
    }
    strided_gemm("syrk_batched", precision, ta, ta == Trans::kNo ? Trans::kYes : Trans::kNo, alpha,
                 a[0], *sa, a[0], *sa, beta, c[0], *sc, c.size());
  }
  // c_i = alpha op(a_i) op(b_i) + beta c_i for count matrices `stride` floats apart (fp32 data).
  void strided_gemm(const char* op, Precision precision, Trans ta, Trans tb, float alpha,
                    ConstMatrixView a, Index stride_a, ConstMatrixView b, Index stride_b,
                    float beta, MatrixView c, Index stride_c, std::size_t count) {
    const auto [m, n, k] = detail::check_gemm(ta, tb, a, b, c);
    make_current(op);
    if (m == 0 || n == 0 || k == 0) {
      // Nothing to multiply (k = 0: c = beta c): the products in turn handle it.
      for (std::size_t i = 0; i < count; ++i) {
        const auto at = static_cast<Index>(i);
        do_gemm(ta, tb, alpha, {a.data + at * stride_a, a.rows, a.cols, a.ld},
                {b.data + at * stride_b, b.rows, b.cols, b.ld}, beta,
                {c.data + at * stride_c, c.rows, c.cols, c.ld}, precision);
      }
      return;
    }
    check(
        cuda::cublas().gemm_strided_batched_ex(
            blas_, cublas_op(tb), cublas_op(ta), blas_int(op, n), blas_int(op, m), blas_int(op, k),
            &alpha, b.data, CUDA_R_32F, blas_int(op, b.ld), stride_b, a.data, CUDA_R_32F,
            blas_int(op, a.ld), stride_a, &beta, c.data, CUDA_R_32F, blas_int(op, c.ld), stride_c,
            blas_int(op, static_cast<Index>(count)), compute_type(precision), CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx",
        fmt::format("{} ({}): {} products of op(a) {} x op(b) {} into c {}", op,
                    to_string(precision), count, shape_str(m, k), shape_str(k, n),
                    shape_str(m, n)));
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
    make_current("sum_squares");
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
    make_current("normalize");
    auto* slot =
        static_cast<double*>(scratch(norm_slot_, sizeof(double), "the normalisation slot"));
    check(cudaMemsetAsync(slot, 0, sizeof(double), stream_), "cudaMemsetAsync",
          "the normalisation slot");
    check(cuda::sum_squares(stream_, dev(ConstMatrixView(x)), in_double, slot),
          "sum_squares kernel", shape_str(x));
    if (group != nullptr) group->data().all_reduce(std::span<double>(slot, 1));
    check(cuda::scale_by_norm(stream_, dev(x), slot, eps), "scale_by_norm kernel", shape_str(x));
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
    make_current("find_non_finite");
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
    make_current("scale");
    check(cuda::scale(stream_, dev(a), alpha), "scale kernel", shape_str(a.rows, a.cols));
  }
  void axpby(float alpha, ConstMatrixView x, float beta, MatrixView y) override {
    make_current("axpby");
    if (x.rows != y.rows || x.cols != y.cols) {
      throw Error(
          fmt::format("axpby: shape mismatch {} vs {}", shape_str(x), shape_str(y.rows, y.cols)));
    }
    check(cuda::axpby(stream_, alpha, dev(x), beta, dev(y)), "axpby kernel", shape_str(x));
  }
  void ns_polynomial(float a, float b, ConstMatrixView gram, MatrixView p) override {
    make_current("ns_polynomial");
    if (gram.rows != gram.cols || p.rows != gram.rows || p.cols != gram.cols) {
      Compute::ns_polynomial(a, b, gram, p);  // throws the shape error
      return;
    }
    check(cuda::ns_polynomial(stream_, a, b, dev(gram), dev(p)), "ns_polynomial kernel",
          shape_str(p.rows, p.cols));
  }
  void add_diagonal(MatrixView a, float alpha) override {
    make_current("add_diagonal");
    if (a.rows != a.cols) {
      throw Error(fmt::format("add_diagonal: matrix {} is not square", shape_str(a.rows, a.cols)));
    }
    check(cuda::add_diagonal(stream_, dev(a), alpha), "add_diagonal kernel",
          shape_str(a.rows, a.cols));
  }
  void pack_bf16(ConstMatrixView a, float* dst) override {
    check(cuda::to_bf16(stream_, dev(a), dst), "to_bf16 kernel", shape_str(a.rows, a.cols));
  }
  void unpack_bf16(const float* src, MatrixView a) override {
    check(cuda::from_bf16(stream_, src, dev(a)), "from_bf16 kernel", shape_str(a.rows, a.cols));
  }
  void round(MatrixView a, Precision precision) override {
    make_current("round");
    if (precision == Precision::kFp32) return;
    check(cuda::round(stream_, dev(a), precision == Precision::kBf16), "round kernel",
          fmt::format("{} at {}", shape_str(a.rows, a.cols), to_string(precision)));
  }
  // bf16 storage, bf16 outputs and the polynomial in the products' epilogues
  // (cuda::newton_schulz_bf16). With DISTMUON_CUDA_PRECISION set to another precision, the
  // default's order with the products at that precision.
  void newton_schulz_bf16(std::span<const MatrixView> xs, bool rows, std::span<const NsStep> steps,
                          bool use_syrk, MatrixView work) override {
    make_current("newton_schulz_bf16");
    if (override_ && *override_ != Precision::kBf16) {
      Compute::newton_schulz_bf16(xs, rows, steps, use_syrk, work);
      return;
    }
    void** pointers = block_pointers();
    const auto plain = [&] {
      cuda::newton_schulz_bf16({blas_, stream_}, pointers, xs, rows, steps, use_syrk, work);
    };
    // The graph path (DISTMUON_CUDA_GRAPHS=1): argument errors thrown before any capture.
    detail::check_ns_bf16_args("newton_schulz_bf16", xs, rows, work);
    if (!graphs_on_ || xs.empty() || xs[0].size() == 0 ||
        !graphs_.run(
            stream_,
            cuda::ns_graph_key(xs, rows, steps, use_syrk, Precision::kBf16, work, pointers), plain,
            "newton_schulz_bf16")) {
      plain();
    }
  }
  cuda::GraphStats graph_stats() const { return graphs_.stats(); }
  // Graph capture on or off; on: cuBLAS gets its workspace of this backend first (once, kept
  // for the backend's life), so that nothing in a capture allocates one. cublasSetStream would
  // reset it to cuBLAS's own pool: the handle's stream is set once, in the constructor, before.
  void set_graphs(bool on) {
    make_current("set_cuda_graphs");
    if (on && blas_workspace_.data == nullptr) {
      int major = 0;
      check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_),
            "cudaDeviceGetAttribute", "the compute capability");
      const std::size_t bytes = cuda::graph_blas_workspace_bytes(major);
      void* ws = scratch(blas_workspace_, bytes, "the cuBLAS workspace of CUDA graphs");
      check(cuda::cublas().set_workspace(blas_, ws, bytes), "cublasSetWorkspace",
            fmt::format("{} bytes", bytes));
    }
    graphs_on_ = on;
  }
  void fill(MatrixView a, float value) override {
    make_current("fill");
    check(cuda::fill(stream_, dev(a), value), "fill kernel", shape_str(a.rows, a.cols));
  }
  void copy(ConstMatrixView src, MatrixView dst) override {
    check_same("copy", "destination", dst, src);
    if (src.data == dst.data) return;
    make_current("copy");
    copy_2d("copy", src, dst, cudaMemcpyDeviceToDevice);
  }

  void muon_momentum(const MomentumStep& k, ConstMatrixView g, ConstMatrixView w, MatrixView buf,
                     MatrixView u) override {
    check_same("muon_momentum", "weight", w, g);
    check_same("muon_momentum", "momentum", buf, g);
    check_same("muon_momentum", "update", u, g);
    make_current("muon_momentum");
    check(cuda::muon_momentum(stream_, {k.momentum, k.l2, k.nesterov}, dev(g), dev(w), dev(buf),
                              dev(u)),
          "muon_momentum kernel", shape_str(g));
  }
  void adamw(const AdamWStep& k, ConstMatrixView g, MatrixView m, MatrixView v,
             MatrixView p) override {
    check_same("adamw", "first moment", m, g);
    check_same("adamw", "second moment", v, g);
    check_same("adamw", "parameter", p, g);
    make_current("adamw");
    check(cuda::adamw(stream_, {k.beta1, k.beta2, k.bias1, k.bias2_sqrt, k.decay, k.lr, k.eps},
                      dev(g), dev(m), dev(v), dev(p)),
          "adamw kernel", shape_str(g));
  }

 protected:
  float* do_allocate(std::size_t count) override {
    make_current("allocate");
    const std::size_t bytes = count * sizeof(float);
    void* p = nullptr;
    check(cudaMallocFromPoolAsync(&p, bytes, pool_, stream_), "cudaMallocFromPoolAsync",
          fmt::format("{} floats ({} bytes) on {}", count, bytes, name()));
    const auto rc = cudaMemsetAsync(p, 0, bytes, stream_);
    if (rc != cudaSuccess) {
      cudaFreeAsync(p, stream_);
      check(rc, "cudaMemsetAsync", fmt::format("zero-filling {} bytes", bytes));
    }
    return static_cast<float*>(p);
  }
  void do_release(float* data, std::size_t) noexcept override {
    // Stream-ordered: the memory is reused only by work queued after this point. A failure
    // cannot throw here: it is kept and thrown by the next synchronize().
    cudaError_t rc = cudaSetDevice(device_);
    if (rc == cudaSuccess) rc = cudaFreeAsync(data, stream_);
    if (rc != cudaSuccess) {
      cudaError_t none = cudaSuccess;
      release_error_.compare_exchange_strong(none, rc);
    }
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

  // c = alpha op(a) op(a)^T + beta c for a symmetric fp32 c at a reduced precision
  // (cuda::upper_triangle_product; `a` holds op(a)'s operand of `type`, leading dimension lda).
  void upper_triangle_product(Precision precision, Trans ta, Index n, Index k, float alpha,
                              const void* a, cudaDataType type, Index lda, float beta, MatrixView c,
                              cublasComputeType_t ct) {
    const std::string what = fmt::format("syrk at {}", to_string(precision));
    cuda::upper_triangle_product({blas_, stream_}, block_pointers(), what.c_str(), ta, n, k, alpha,
                                 a, type, lda, beta, c.data, CUDA_R_32F, c.ld, ct);
  }
  void** block_pointers() {
    return static_cast<void**>(scratch(block_pointers_,
                                       3 * cuda::kMaxTriangleBlocks * sizeof(void*),
                                       "the block pointers of a syrk"));
  }

  void gemm_ex(const char* op, Precision precision, Trans ta, Trans tb, Index m, Index n, Index k,
               float alpha, ConstMatrixView a, ConstMatrixView b, float beta, MatrixView c) {
    check(cuda::cublas().gemm_ex(blas_, cublas_op(tb), cublas_op(ta), blas_int(op, n),
                                 blas_int(op, m), blas_int(op, k), &alpha, b.data, CUDA_R_32F,
                                 blas_int(op, b.ld), a.data, CUDA_R_32F, blas_int(op, a.ld), &beta,
                                 c.data, CUDA_R_32F, blas_int(op, c.ld), compute_type(precision),
                                 CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx",
          fmt::format("{} ({}): op(a) {} x op(b) {} into c {}", op, to_string(precision),
                      shape_str(m, k), shape_str(k, n), shape_str(m, n)));
  }

  // A contiguous bf16 copy of a in scratch buffer `slot` (0 or 1), grown when needed. The
  // scratch is stream-ordered like everything else: a product queued later reuses it safely.
  const void* bf16_copy(int slot, ConstMatrixView a, const char* op) {
    const auto bytes = static_cast<std::size_t>(a.rows * a.cols) * 2;
    void* buf = scratch(bf16_[slot], bytes, "the bf16 operand copy");
    check(cuda::to_bf16(stream_, dev(a), buf), "to_bf16 kernel",
          fmt::format("{}: {}", op, shape_str(a)));
    return buf;
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

  // The device slots of a batched reduction (scratch grown when needed, set to `byte`), and
  // their pinned host twin (grown with them; host memory, so not in memory_stats()).
  void* results(std::size_t bytes, int byte) {
    if (bytes > results_.bytes) {
      const std::size_t grow = std::max<std::size_t>(bytes, 4096);
      // The old pinned slots may still be the target of a queued copy.
      synchronize();              // bounded while NCCL work may be queued
      release_scratch(results_);  // both or neither: a failure below leaves them to regrow
      if (host_results_ != nullptr) {
        check(cudaFreeHost(host_results_), "cudaFreeHost", "the old pinned result slots");
        host_results_ = nullptr;
      }
      check(cudaMallocHost(&host_results_, grow), "cudaMallocHost",
            fmt::format("{} pinned result bytes", grow));
      scratch(results_, grow, "the result slots");
    }
    check(cudaMemsetAsync(results_.data, byte, bytes, stream_), "cudaMemsetAsync", "result slots");
    return results_.data;
  }
  // One transfer of the batch's results to the pinned host slots, then a synchronisation.
  void fetch_results(std::size_t bytes, const char* op) {
    check(cudaMemcpyAsync(host_results_, results_.data, bytes, cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync", fmt::format("{} results", op));
    synchronize();  // bounded while NCCL work may be queued
    check_released();
  }

  struct Scratch {
    void* data = nullptr;
    std::size_t bytes = 0;
  };
  // A scratch buffer of at least `bytes` in this backend's memory, through allocate() (so that
  // memory_stats() counts it) and kept across calls: it grows, never shrinks, so steady-state
  // calls allocate nothing. Stream-ordered like everything else: work queued later reuses it.
  void* scratch(Scratch& s, std::size_t bytes, const char* what) {
    if (bytes <= s.bytes) return s.data;
    const std::size_t floats = (bytes + sizeof(float) - 1) / sizeof(float);
    float* grown = nullptr;
    try {
      grown = allocate(floats);
    } catch (const Error& e) {
      throw Error(fmt::format("{}: {}", what, e.what()));
    }
    release_scratch(s);
    s = {grown, floats * sizeof(float)};
    return grown;
  }
  void release_scratch(Scratch& s) noexcept {
    release(static_cast<float*>(s.data), s.bytes / sizeof(float));
    s = {};
  }

  void make_current(const char* op) const { cuda::make_current(device_, op); }
  // Throws the first release failure do_release kept (it cannot throw itself).
  void check_released() {
    const cudaError_t rc = release_error_.exchange(cudaSuccess);
    check(rc, "cudaFreeAsync", fmt::format("an earlier release on {}", name()));
  }
  // The backend's own stream-ordered pool: freed memory stays in it instead of going back to the
  // driver at every synchronisation, so a workspace released and allocated again costs nothing.
  // The process's default pool (PyTorch's, other libraries') is left as it is.
  void make_pool() {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device_;
    cudaError_t rc = cudaMemPoolCreate(&pool_, &props);
    if (rc == cudaSuccess) {
      std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
      rc = cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep);
      if (rc != cudaSuccess) cudaMemPoolDestroy(pool_);
    }
    if (rc != cudaSuccess) {  // the constructor throws: nothing else releases these
      cuda::cublas().destroy(blas_);
      if (owns_stream_) cudaStreamDestroy(stream_);  // never the caller's stream
      check(rc, "cudaMemPoolCreate", fmt::format("the memory pool of device {}", device_));
    }
  }

  int device_;
  std::optional<Precision> override_;  // DISTMUON_CUDA_PRECISION: replaces each call's precision
  bool owns_stream_ = true;            // false: the caller's stream (make_cuda_compute_on_stream)
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cudaMemPool_t pool_ = nullptr;  // every allocation of this backend (make_pool)
  std::atomic<cudaError_t> release_error_{cudaSuccess};
  Scratch results_;               // the batched reductions' device slots
  void* host_results_ = nullptr;  // their pinned host twin, results_.bytes long
  Scratch norm_slot_;             // normalize's sum of squares (one double, made on first use)
  Scratch block_pointers_;        // upper_triangle_product's pointer arrays (made on first use)
  Scratch bf16_[2];               // Precision::kBf16: the bf16 copies of a product's operands
  Scratch blas_workspace_;        // cuBLAS's workspace once graphs were on (set_graphs)
  bool graphs_on_ = false;        // DISTMUON_CUDA_GRAPHS=1: newton_schulz_bf16 captured
  cuda::NsGraphs graphs_;         // its graphs (cuda_graphs.h)
  std::mutex comm_mutex_;
  std::map<const CommImpl*, std::weak_ptr<CommImpl>> comms_;
  std::shared_ptr<NcclDevice> nccl_device_;  // its NCCL communicators' (made with the first)
};

std::unique_ptr<StreamTimer> CudaCompute::stream_timer() {
  return make_cuda_stream_timer(device_, stream_);
}

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

std::unique_ptr<Compute> make_cuda_compute(std::optional<Precision> override) {
  return std::make_unique<CudaCompute>(current_device(), override);
}

Compute& cuda_compute() {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<Compute>> instances;
  const int device = current_device();
  std::lock_guard lock(mutex);
  auto& slot = instances[device];
  if (!slot) slot = std::make_unique<CudaCompute>(device, cuda_precision_override());
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
                                                     std::optional<Precision> override) {
  const int count = cuda_device_count();
  if (device < 0 || device >= count) {
    throw Error(fmt::format("device cuda:{}: not a CUDA device of this process ({} device(s))",
                            device, count));
  }
  return std::make_unique<CudaCompute>(device, override, stream);
}

Compute& cuda_compute_on_stream(int device, std::uintptr_t stream) {
  static std::mutex mutex;
  static std::map<std::pair<int, std::uintptr_t>, std::unique_ptr<Compute>> instances;
  std::lock_guard lock(mutex);
  auto& slot = instances[{device, stream}];
  if (!slot) {
    slot = make_cuda_compute_on_stream(device, reinterpret_cast<cudaStream_t>(stream),
                                       cuda_precision_override());
  }
  return *slot;
}

namespace {
CudaCompute& as_cuda(Compute& compute, const char* op) {
  auto* cuda = dynamic_cast<CudaCompute*>(&compute);
  if (cuda == nullptr) throw Error(fmt::format("{}: {} is not a CUDA backend", op, compute.name()));
  return *cuda;
}
}  // namespace

cudaStream_t cuda_stream(Compute& compute) {
  return as_cuda(compute, "cuda_stream").stream();
}

cuda::GraphStats cuda_graph_stats(Compute& compute) {
  return as_cuda(compute, "cuda_graph_stats").graph_stats();
}

void set_cuda_graphs(Compute& compute, bool on) {
  as_cuda(compute, "set_cuda_graphs").set_graphs(on);
}

}  // namespace distmuon
