#pragma once
// The small compute interface that Newton-Schulz, the tensor-parallel orchestration and the
// optimizer are written against, and the memory it computes on. Every matrix an algorithm works
// on lives in its backend's memory: allocated by the backend (DeviceMatrix), read and written only
// through the backend's methods, and moved between ranks only by the backend's data communicator.
// Backends: cpu (src/compute/cpu, CBLAS on host memory), opaque (src/compute/opaque, a test
// backend whose memory the host cannot address) and cuda (src/compute/cuda, cuBLAS on device
// memory, one stream per backend). docs/architecture.md and docs/gpu.md describe the rules.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "distmuon/comm.h"
#include "distmuon/matrix.h"
#include "distmuon/precision.h"

namespace distmuon {

enum class Trans { kNo, kYes };

// An element's position in a matrix.
struct MatrixIndex {
  Index row = 0, col = 0;
};

// The per-element constants of one Muon momentum step (muon.h).
struct MomentumStep {
  float momentum = 0.0f;  // mu
  float l2 = 0.0f;        // L2 weight decay added to the gradient (0 for the other methods)
  bool nesterov = true;
};

// One stepping Muon parameter of Compute::muon_directions: its gradient, weight and momentum
// (read only) and the direction written from them.
struct MuonDirection {
  ConstMatrixView g, w, buf;
  MatrixView u;            // muon_momentum's u from g, w and a copy of buf
  Index checked_rows = 0;  // g's, w's and buf's first checked_rows rows are checked finite
  bool sums = false;       // also w's and u's sums of squares (in double, every row)
  // With sums: u is not read after this call (only its sum is), so a backend may leave it
  // unwritten (the CPU backend does: one write pass fewer); the sums are the same either way.
  bool sums_only = false;
};

// The per-element constants of one AdamW step at step t (adamw.h).
struct AdamWStep {
  float beta1 = 0.0f, beta2 = 0.0f;
  float bias1 = 1.0f;       // 1 - beta1^t
  float bias2_sqrt = 1.0f;  // sqrt(1 - beta2^t)
  float decay = 1.0f;       // 1 - lr wd
  float lr = 0.0f, eps = 0.0f;
};

// The coefficients of one Newton-Schulz step: X' = a X + (b A + c A^2) X with A = X X^T.
struct NsStep {
  float a = 0.0f, b = 0.0f, c = 0.0f;
};

// The floats of scratch Compute::newton_schulz_bf16 needs for `count` matrices of rows x cols
// whose Gram matrix is X X^T (gram_of_rows) or X^T X.
Index ns_bf16_scratch_floats(Index count, Index rows, Index cols, bool gram_of_rows);

// Where a backend's memory lives.
enum class MemoryKind {
  kHost,    // host memory: the caller may read and write it directly (cpu)
  kDevice,  // not addressable by host code: only the backend's methods touch it (cuda, opaque)
};

// What a backend has allocated so far (every allocation, whatever its size).
struct MemoryStats {
  std::size_t allocations = 0;  // allocate() calls
  std::size_t releases = 0;     // release() calls
  std::size_t live_bytes = 0;   // allocated and not released
  std::size_t peak_bytes = 0;   // the largest live_bytes seen
};

// Times intervals of a backend's queued work where it runs (Compute::stream_timer): on a device
// backend an operation returns once queued, so the host clock would time its enqueue only.
class StreamTimer {
 public:
  virtual ~StreamTimer() = default;
  // Mark an interval's start and end on the backend's stream, after the work queued so far.
  virtual void start() = 0;
  virtual void stop() = 0;
  // The sum of the intervals marked since the last seconds() or clear(), in seconds; waits for
  // their work to complete. Throws distmuon::Error when the device reports a failure.
  virtual double seconds() = 0;
  // Forgets the intervals marked so far without reading them.
  virtual void clear() noexcept = 0;
};

class Compute {
 public:
  virtual ~Compute() = default;
  virtual std::string name() const = 0;
  virtual MemoryKind memory() const = 0;

  // Memory. allocate returns `count` zero-filled floats in this backend's memory (nullptr for
  // 0), throws distmuon::Error when it cannot; release returns them. Both are counted in
  // memory_stats(). Prefer DeviceMatrix, which releases itself.
  float* allocate(std::size_t count);
  void release(float* data, std::size_t count) noexcept;
  MemoryStats memory_stats() const;
  // Waits for every operation queued on the backend's stream (a no-op on the CPU). Results read
  // through copy_to_host are already complete.
  virtual void synchronize() {}
  // A timer of intervals on this backend's stream (CUDA events on cuda, the host clock inside
  // the backend on opaque), or nullptr where every operation has completed when it returns
  // (cpu): the host clock then times it. Muon's step statistics time the data plane with it.
  virtual std::unique_ptr<StreamTimer> stream_timer() { return nullptr; }
  // Host <-> backend copies (same shapes, any leading dimensions): `host` is ordinary host memory
  // (a Matrix, a NumPy array), the other side is this backend's memory.
  virtual void copy_from_host(ConstMatrixView host, MatrixView dst) = 0;
  virtual void copy_to_host(ConstMatrixView src, MatrixView host) = 0;
  // The communicator that moves this backend's memory between the ranks of `host`: its data
  // plane (data()) carries shards and Gram matrices, its control plane stays `host` (hashes,
  // agreement, scalars). cpu: host itself; opaque: a translating wrapper; cuda: NCCL, created
  // once per group (collective over host's ranks, bootstrapped over host) and cached.
  virtual Communicator data_communicator(const Communicator& host) { return host; }

  // c = alpha * op(a) * op(b) + beta * c, the operands rounded to `precision` (precision.h),
  // accumulated and stored in fp32.
  void gemm(Trans ta, Trans tb, float alpha, ConstMatrixView a, ConstMatrixView b, float beta,
            MatrixView c, Precision precision = Precision::kFp32) {
    gemm_calls_.fetch_add(1, std::memory_order_relaxed);
    do_gemm(ta, tb, alpha, a, b, beta, c, precision);
  }
  // c = alpha * op(a) * op(a)^T + beta * c for a symmetric c; both triangles of c are written.
  void syrk(Trans ta, float alpha, ConstMatrixView a, float beta, MatrixView c,
            Precision precision = Precision::kFp32) {
    syrk_calls_.fetch_add(1, std::memory_order_relaxed);
    do_syrk(ta, alpha, a, beta, c, precision);
  }
  // Batched products: the same product on each of count equal-shaped operand sets (batched
  // Newton-Schulz: one call per NS product for a batch of equal shapes, e.g. a layer's experts):
  //   gemm_batched: c[i] = alpha op(a[i]) op(b[i]) + beta c[i];
  //   syrk_batched: c[i] = alpha op(a[i]) op(a[i])^T + beta c[i], both triangles written.
  // a, b and c hold one view per matrix (same count, every a[i] of one shape, likewise b, c).
  // Each c[i] gets the bits its own gemm/syrk would give on the cpu and opaque backends (the
  // default runs them in turn); cuda multiplies equally strided batches as one strided-batched
  // product (cublasGemmStridedBatchedEx), at the same precision, and others in turn.
  void gemm_batched(Trans ta, Trans tb, float alpha, std::span<const ConstMatrixView> a,
                    std::span<const ConstMatrixView> b, float beta, std::span<const MatrixView> c,
                    Precision precision = Precision::kFp32);
  void syrk_batched(Trans ta, float alpha, std::span<const ConstMatrixView> a, float beta,
                    std::span<const MatrixView> c, Precision precision = Precision::kFp32);
  // Whether the optimizer runs a batch of equal-shaped Newton-Schulz iterations through the
  // batched products (one call per NS product for the whole batch: a device launches once for
  // it; the default, opaque's and cuda's) or each matrix's whole NS in turn (cpu: measured
  // faster there, each matrix's working set staying in cache; docs/data-parallel.md, "Batched
  // experts"). Either gives the same bits.
  virtual bool batches_newton_schulz() const { return true; }
  // Calls of the product entries so far (gemm, syrk, and the batched ones with the matrices
  // they multiplied): what a test counts to see that a batch went through one call per product.
  struct ProductCalls {
    std::size_t gemm = 0, syrk = 0;    // single products
    std::size_t batched_calls = 0;     // gemm_batched and syrk_batched calls
    std::size_t batched_matrices = 0;  // matrices those calls multiplied
  };
  ProductCalls product_calls() const;
  // The precision Newton-Schulz runs at on this backend when the caller leaves it to the backend
  // (MuonOptions::precision unset, the CLI's and Python's default): fp32 on the CPU backends,
  // whose tf32 and bf16 are an emulation for tests (slower than fp32); bf16 on CUDA
  // (docs/precision.md says why).
  virtual Precision default_precision() const { return Precision::kFp32; }
  // Sum of squares of all elements, accumulated in double (or in float when in_double is false).
  virtual double sum_squares(ConstMatrixView a, bool in_double) = 0;
  // Batched: out[i] = sum_squares(as[i]) with one result transfer for the whole batch on a
  // device backend (the default loops over sum_squares).
  virtual void sum_squares(std::span<const ConstMatrixView> as, bool in_double,
                           std::span<double> out);
  // Newton-Schulz's normalisation: x /= max(||x||_F, eps), the squares summed in double (float
  // when in_double is false) and, with a group, over the group. The default (cpu) reads the sum
  // on the host: sum_squares, a control-plane all_reduce of the double over the group, x scaled
  // by float(1 / max(sqrt(sum), eps)) only when the sum is finite; it returns the sum, which the
  // caller checks. A device backend (memory() kDevice: cuda, opaque) keeps the sum in a slot of
  // its own memory, all-reduces it over group->data(), scales by the same float factor computed
  // from the slot, writes NaN into every element of x when the sum is not finite, and returns
  // nullopt: no host read (the caller checks the result later, batched).
  virtual std::optional<double> normalize(MatrixView x, double eps, bool in_double,
                                          const Communicator* group);
  // a *= alpha.
  virtual void scale(MatrixView a, float alpha) = 0;
  // y = alpha * x + beta * y (same shapes).
  virtual void axpby(float alpha, ConstMatrixView x, float beta, MatrixView y) = 0;
  // a(i, i) += alpha for a square a.
  virtual void add_diagonal(MatrixView a, float alpha) = 0;
  // Newton-Schulz's polynomial aI + bA + cA^2 from p = cA^2 (square, the shape of gram):
  // p = (b * gram + p) + a on the diagonal, each element rounded in that order in fp32 without
  // fused multiply-adds. The default is that order as two passes, axpby(b, gram, 1, p) then
  // add_diagonal(p, a) (src/compute/ns_polynomial.cpp: the CPU's emulation of the CUDA backend's
  // one fused kernel, which gives the same bits).
  virtual void ns_polynomial(float a, float b, ConstMatrixView gram, MatrixView p);
  // Newton-Schulz's steps with the iterate stored in bf16, the order of torch.optim.Muon's NS, on
  // each x of xs (equal shapes, normalised already) in place. With s the Gram side (rows: A is
  // X X^T, s = rows; else X^T X) and bf16(v) the rounding of fp32 to bf16 (round_to):
  //   X = bf16(x)  once;  per step, every product accumulated in fp32 and written in bf16:
  //   A = bf16(X X^T);  B = bf16(c A A + b A) (c = 0: B = A, scaled by b below);
  //   X = bf16(s_b B X + a X)  (s_b = 1, or b when c = 0; X B on the column side);
  //   x = X  once at the end (exact).
  // The sums alpha * product + beta * C are fp32 (the products' epilogue), rounded once.
  // use_syrk: A and A A may be computed as the upper triangle and mirrored (same values).
  // scratch: contiguous, at least ns_bf16_scratch_floats(xs.size(), x rows, x cols, rows) floats of
  // this backend's memory, contents unspecified. The default (cpu, opaque) runs each x in turn as
  // gemm/syrk at Precision::kBf16 (fp32 output) followed by round: the emulation of the cuda
  // backend, which keeps X, A and B in bf16 in the scratch and multiplies equal shapes as one
  // strided-batched product (docs/precision.md, "bf16 storage").
  virtual void newton_schulz_bf16(std::span<const MatrixView> xs, bool rows,
                                  std::span<const NsStep> steps, bool use_syrk, MatrixView scratch);
  // Every element of a rounded to `precision`'s operand format, kept in fp32 (round_to in
  // precision.h); nothing for fp32. Newton-Schulz rounds its Gram matrix so, so that both of
  // its uses in the polynomial see the same matrix (docs/precision.md).
  virtual void round(MatrixView a, Precision precision) = 0;
  // The bf16 wire of replicated weights (MuonOptions::replica_wire): a's elements rounded to bf16
  // (to nearest even, as round rounds them) and packed in row-major order into dst, two values
  // per float of this backend's memory (ceil(rows cols / 2) floats); unpack_bf16 writes such
  // values back into a, exactly. Default: distmuon::Error (a backend without a bf16 wire); an
  // empty a packs nothing on a backend that has it (Muon asks so before any collective).
  virtual void pack_bf16(ConstMatrixView a, float* dst);
  virtual void unpack_bf16(const float* src, MatrixView a);

  // Elementwise operations on matrices in the backend's memory; shapes must match (any leading
  // dimensions), else distmuon::Error.
  // a = value.
  virtual void fill(MatrixView a, float value) = 0;
  // dst = src. dst may be src itself (the same data and ld): nothing to do (owner mode's
  // exchange copies a home's result onto itself when it was computed in the send staging).
  virtual void copy(ConstMatrixView src, MatrixView dst) = 0;
  // The first non-finite element of a in row-major order, or nothing when all are finite.
  virtual std::optional<MatrixIndex> find_non_finite(ConstMatrixView a) = 0;
  // Batched: out[i] = find_non_finite(as[i]), one result transfer for the batch (default: loop).
  virtual void find_non_finite(std::span<const ConstMatrixView> as,
                               std::span<std::optional<MatrixIndex>> out);
  // Muon's momentum step, per element with mu = k.momentum:
  //   g' = g + k.l2 w;  buf = mu buf + (1 - mu) g';  u = nesterov ? (1 - mu) g' + mu buf : buf.
  // u may be buf itself (each element is read before it is written): buf then ends as u.
  virtual void muon_momentum(const MomentumStep& k, ConstMatrixView g, ConstMatrixView w,
                             MatrixView buf, MatrixView u) = 0;
  // Muon's compute phase up to its checks (Muon::step), in one call:
  //   found: find_non_finite of, in order, each direction's g, w and buf (their first
  //     checked_rows rows), then of each of `others` (3 dirs.size() + others.size() results);
  //   each direction's u = muon_momentum's u from g, w and a copy of buf (buf is not written);
  //   sums: for each direction that asks, in order, sum_squares(w, true) then sum_squares(u, true)
  //     of the u just written (2 per such direction).
  // The default runs exactly that: one batched find_non_finite, per direction copy(buf, u) and
  // muon_momentum(k, g, w, u, u), then one batched sum_squares when a direction asks. The CPU
  // backend reads each direction's g, w and buf once for its checks, its u and its sums, with
  // the same results bit for bit.
  virtual void muon_directions(const MomentumStep& k, std::span<const MuonDirection> dirs,
                               std::span<const ConstMatrixView> others,
                               std::span<std::optional<MatrixIndex>> found, std::span<double> sums);
  // Muon's apply phase for one parameter, per element: buf advanced as muon_momentum advances it
  // (from g and w, both before the step), then w = -lr u + decay w (decay = 1: no decay), with
  // each operation rounded as below. The default runs muon_momentum(k without Nesterov, g, w,
  // buf, buf), scale(w, decay) unless decay is 1, axpby(-lr, u, 1, w); the CPU backend reads
  // and writes each element once, with the same results bit for bit.
  virtual void muon_apply(const MomentumStep& k, ConstMatrixView g, MatrixView w, MatrixView buf,
                          ConstMatrixView u, float decay, float lr);
  // AdamW's step, per element:
  //   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
  //   p = p decay - lr (m / bias1) / (sqrt(v) / bias2_sqrt + eps).
  virtual void adamw(const AdamWStep& k, ConstMatrixView g, MatrixView m, MatrixView v,
                     MatrixView p) = 0;

 protected:
  // The backend's allocation and release (allocate/release count around them).
  virtual float* do_allocate(std::size_t count) = 0;
  virtual void do_release(float* data, std::size_t count) noexcept = 0;
  // The backend's products (gemm and syrk forward to them).
  virtual void do_gemm(Trans ta, Trans tb, float alpha, ConstMatrixView a, ConstMatrixView b,
                       float beta, MatrixView c, Precision precision) = 0;
  virtual void do_syrk(Trans ta, float alpha, ConstMatrixView a, float beta, MatrixView c,
                       Precision precision) = 0;
  // The batched products (shapes checked by the callers above). Default: do_gemm / do_syrk on
  // each matrix in turn.
  virtual void do_gemm_batched(Trans ta, Trans tb, float alpha, std::span<const ConstMatrixView> a,
                               std::span<const ConstMatrixView> b, float beta,
                               std::span<const MatrixView> c, Precision precision);
  virtual void do_syrk_batched(Trans ta, float alpha, std::span<const ConstMatrixView> a,
                               float beta, std::span<const MatrixView> c, Precision precision);

 private:
  std::atomic<std::size_t> allocations_{0}, releases_{0}, live_bytes_{0}, peak_bytes_{0};
  std::atomic<std::size_t> gemm_calls_{0}, syrk_calls_{0}, batched_calls_{0}, batched_matrices_{0};
};

// An owning, contiguous (ld == cols), zero-initialised row-major matrix in a backend's memory.
// Move-only; releases its memory to the backend that allocated it. Its elements are read and
// written only through that backend (Compute's methods, its data communicator, copy_to_host).
class DeviceMatrix {
 public:
  DeviceMatrix() = default;
  DeviceMatrix(Compute& compute, Index rows, Index cols);
  ~DeviceMatrix() { reset(); }
  DeviceMatrix(DeviceMatrix&& o) noexcept;
  DeviceMatrix& operator=(DeviceMatrix&& o) noexcept;
  DeviceMatrix(const DeviceMatrix&) = delete;
  DeviceMatrix& operator=(const DeviceMatrix&) = delete;

  Index rows() const { return rows_; }
  Index cols() const { return cols_; }
  Index size() const { return rows_ * cols_; }
  Compute* compute() const { return compute_; }
  MatrixView view() { return {data_, rows_, cols_, cols_}; }
  ConstMatrixView view() const { return {data_, rows_, cols_, cols_}; }
  operator MatrixView() { return view(); }
  operator ConstMatrixView() const { return view(); }

  // Makes this a rows x cols matrix of compute's memory, reallocating only when the shape or
  // the backend differs (a workspace kept across calls); the contents are then unspecified.
  void ensure(Compute& compute, Index rows, Index cols);
  void reset() noexcept;

 private:
  Compute* compute_ = nullptr;
  float* data_ = nullptr;
  Index rows_ = 0, cols_ = 0;
};

// Host <-> backend copies of a whole matrix.
DeviceMatrix to_device(Compute& compute, ConstMatrixView host);
Matrix to_host(Compute& compute, ConstMatrixView src);

// The process-wide CPU (CBLAS) backend.
Compute& cpu_compute();
// A backend by name: "cpu", "opaque" (the process-wide opaque test backend) or "cuda" (the
// process-wide CUDA backend of this rank's GPU: DISTMUON_CUDA_DEVICE, else the node-local rank
// modulo the node's GPU count). Throws distmuon::Error naming the built
// backends when `name` is unknown, not built, or has no device.
Compute& compute_backend(std::string_view name);
// The CUDA backend of CUDA device `device` running on `stream`, a cudaStream_t given as an integer
// that the caller owns and keeps alive (PyTorch's current stream; 0 is the legacy default
// stream): its work is ordered with the caller's on that stream, with no host synchronisation.
// One per (device, stream), kept for the process, at DISTMUON_CUDA_PRECISION. Throws
// distmuon::Error in a build without CUDA or when device is not a CUDA device.
Compute& cuda_compute_on_stream(int device, std::uintptr_t stream);
// The backends this build has ("cpu", "opaque", and "cuda" when built with CUDA).
std::vector<std::string> compute_backend_names();
// A new opaque test backend (its own memory and statistics): its memory is a range of host
// addresses that are never mapped, translated to its private storage inside its own methods, so
// any host access from algorithm code faults; a view that is not its memory is refused with
// distmuon::Error. Results are bit-equal to cpu_compute(), which it runs on that storage.
std::unique_ptr<Compute> make_opaque_compute();

// BLAS threads per process. distmuon sets 1 on first use unless DISTMUON_BLAS_THREADS is set,
// since ranks share the cores.
void set_blas_threads(int threads);
int blas_threads();

}  // namespace distmuon
