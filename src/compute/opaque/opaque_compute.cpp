// The opaque test backend: memory the host cannot address. Its allocations are addresses inside a
// reserved, never-accessible (PROT_NONE) range of the address space; the real storage is private
// to the backend, and every method translates the views it is given before running the CPU
// backend's code on that storage. Algorithm code that reads or writes its memory directly faults;
// a view that is not its memory (host memory passed where backend memory belongs) is refused.
// Results are bit-equal to the CPU backend's: the arithmetic is the same code.
#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/nccl/nccl_comm.h"
#include "distmuon/compute.h"
#include "distmuon/error.h"

namespace distmuon {
namespace {

class OpaqueCompute;

// The data plane of a communicator for opaque memory: translates the buffers, then runs the
// host communicator on the backend's storage (what NCCL does with device pointers).
class OpaqueDataComm final : public CommImpl {
 public:
  OpaqueDataComm(std::shared_ptr<CommImpl> inner, OpaqueCompute* owner)
      : inner_(std::move(inner)), owner_(owner) {}
  std::string backend() const override { return "opaque+" + inner_->backend(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void all_gather(const void* send, void* recv, std::size_t count, DType t) override;
  void all_reduce(void* buf, std::size_t count, DType t, ReduceOp op) override;
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType t,
                      ReduceOp op) override;
  void broadcast(void* buf, std::size_t count, DType t, int root) override;
  void all_to_all_v(const void* send, const std::size_t* send_counts,
                    const std::size_t* send_displs, void* recv, const std::size_t* recv_counts,
                    const std::size_t* recv_displs, DType t) override;
  // The inner communicator's start on the translated buffers (MPI_Ialltoallv, or the NCCL
  // communicator's queued exchange): the storage stays the backend's until the request is waited.
  std::unique_ptr<CommRequest> start_all_to_all_v(const void* send, const std::size_t* send_counts,
                                                  const std::size_t* send_displs, void* recv,
                                                  const std::size_t* recv_counts,
                                                  const std::size_t* recv_displs, DType t) override;
  void barrier() override { inner_->barrier(); }
  std::shared_ptr<CommImpl> split(int color, int key) override {
    return std::make_shared<OpaqueDataComm>(inner_->split(color, key), owner_);
  }
  GroupPlacement placement() const override { return inner_->placement(); }
  void abort(int code) override { inner_->abort(code); }

 private:
  std::shared_ptr<CommImpl> inner_;
  OpaqueCompute* owner_;
};

class OpaqueCompute final : public Compute {
 public:
  OpaqueCompute() : nccl_plane_(nccl_data_plane()) {
    void* p =
        mmap(nullptr, kReserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      throw Error(fmt::format("opaque backend: reserving {} bytes of address space: {}", kReserve,
                              std::strerror(errno)));
    }
    base_ = reinterpret_cast<std::uintptr_t>(p);
  }
  ~OpaqueCompute() override {
    release(reinterpret_cast<float*>(slot_), kSlotFloats);
    munmap(reinterpret_cast<void*>(base_), kReserve);
  }

  std::string name() const override { return "opaque"; }
  MemoryKind memory() const override { return MemoryKind::kDevice; }

  void copy_from_host(ConstMatrixView host, MatrixView dst) override {
    check_host("copy_from_host", host);
    cpu().copy(host, mine("copy_from_host", dst));
  }
  void copy_to_host(ConstMatrixView src, MatrixView host) override {
    check_host("copy_to_host", host);
    cpu().copy(mine("copy_to_host", src), host);
  }
  // The host communicator on the backend's storage, or (DISTMUON_OPAQUE_DATA_PLANE=nccl) an NCCL
  // communicator on host memory, one per host group as the CUDA backend keeps them: the stand-in
  // NCCL of the tests (docs/gpu.md, "Testing without GPUs").
  Communicator data_communicator(const Communicator& host) override {
    if (!nccl_plane_) {
      return host.with_data(std::make_shared<OpaqueDataComm>(host.impl_ptr(), this));
    }
    std::lock_guard lock(comm_mutex_);
    std::erase_if(comms_, [](const auto& kv) { return kv.second.expired(); });
    auto& slot = comms_[host.impl_ptr().get()];
    std::shared_ptr<CommImpl> data = slot.lock();
    if (!data) {
      data = std::make_shared<OpaqueDataComm>(make_nccl_comm(host.impl_ptr(), host_nccl_device()),
                                              this);
      slot = data;
    }
    return host.with_data(std::move(data));
  }
  // Its operations complete before they return, so the host clock inside the backend times them;
  // the intervals are kept and summed later, as a device backend's events are.
  std::unique_ptr<StreamTimer> stream_timer() override;

  // Every precision as the CPU backend emulates it (its rounded copies are its own scratch).
  void do_gemm(Trans ta, Trans tb, float alpha, ConstMatrixView a, ConstMatrixView b, float beta,
               MatrixView c, Precision precision) override {
    cpu().gemm(ta, tb, alpha, mine("gemm", a), mine("gemm", b), beta, mine("gemm", c), precision);
  }
  void do_syrk(Trans ta, float alpha, ConstMatrixView a, float beta, MatrixView c,
               Precision precision) override {
    cpu().syrk(ta, alpha, mine("syrk", a), beta, mine("syrk", c), precision);
  }
  // The batched entries: one call of the CPU backend's batched products on the translated views.
  void do_gemm_batched(Trans ta, Trans tb, float alpha, std::span<const ConstMatrixView> a,
                       std::span<const ConstMatrixView> b, float beta,
                       std::span<const MatrixView> c, Precision precision) override {
    cpu().gemm_batched(ta, tb, alpha, mine_all("gemm_batched", a), mine_all("gemm_batched", b),
                       beta, mine_all("gemm_batched", c), precision);
  }
  void do_syrk_batched(Trans ta, float alpha, std::span<const ConstMatrixView> a, float beta,
                       std::span<const MatrixView> c, Precision precision) override {
    cpu().syrk_batched(ta, alpha, mine_all("syrk_batched", a), beta, mine_all("syrk_batched", c),
                       precision);
  }
  double sum_squares(ConstMatrixView a, bool in_double) override {
    return cpu().sum_squares(mine("sum_squares", a), in_double);
  }
  // The device form (compute.h): the sum of squares into the slot, the slot all-reduced over the
  // data plane, then the scale computed from the slot (NaN when the sum is not finite), all on
  // the backend's storage, as a device's kernels would; nothing comes back to the caller.
  std::optional<double> normalize(MatrixView x, double eps, bool in_double,
                                  const Communicator* group) override {
    // The slot: one double of this backend's memory, counted, made on first use and kept.
    if (slot_ == nullptr) slot_ = reinterpret_cast<double*>(allocate(kSlotFloats));
    double& sum = *static_cast<double*>(storage(slot_, sizeof(double), "normalize"));
    sum = cpu().sum_squares(mine("normalize", ConstMatrixView(x)), in_double);
    if (group != nullptr) group->data().all_reduce(std::span<double>(slot_, 1));
    const MatrixView v = mine("normalize", x);
    if (std::isfinite(sum)) {
      cpu().scale(v, static_cast<float>(1.0 / std::max(std::sqrt(sum), eps)));
    } else {
      cpu().fill(v, std::numeric_limits<float>::quiet_NaN());
    }
    return std::nullopt;
  }
  void scale(MatrixView a, float alpha) override { cpu().scale(mine("scale", a), alpha); }
  void axpby(float alpha, ConstMatrixView x, float beta, MatrixView y) override {
    cpu().axpby(alpha, mine("axpby", x), beta, mine("axpby", y));
  }
  void add_diagonal(MatrixView a, float alpha) override {
    cpu().add_diagonal(mine("add_diagonal", a), alpha);
  }
  void round(MatrixView a, Precision precision) override {
    cpu().round(mine("round", a), precision);
  }
  // One call of the CPU backend's (the emulation) on the translated views.
  void newton_schulz_bf16(std::span<const MatrixView> xs, bool rows, std::span<const NsStep> steps,
                          bool use_syrk, MatrixView scratch) override {
    std::vector<MatrixView> own;
    own.reserve(xs.size());
    for (const MatrixView& x : xs)
      own.push_back(mine("newton_schulz_bf16", x));
    cpu().newton_schulz_bf16(own, rows, steps, use_syrk, mine("newton_schulz_bf16", scratch));
  }
  void fill(MatrixView a, float value) override { cpu().fill(mine("fill", a), value); }
  void pack_bf16(ConstMatrixView a, float* dst) override {
    cpu().pack_bf16(mine("pack_bf16", a), packed("pack_bf16", dst, a.size()));
  }
  void unpack_bf16(const float* src, MatrixView a) override {
    cpu().unpack_bf16(packed("unpack_bf16", src, a.size()), mine("unpack_bf16", a));
  }
  void copy(ConstMatrixView src, MatrixView dst) override {
    cpu().copy(mine("copy", src), mine("copy", dst));
  }
  std::optional<MatrixIndex> find_non_finite(ConstMatrixView a) override {
    return cpu().find_non_finite(mine("find_non_finite", a));
  }
  void muon_momentum(const MomentumStep& k, ConstMatrixView g, ConstMatrixView w, MatrixView buf,
                     MatrixView u) override {
    cpu().muon_momentum(k, mine("muon_momentum", g), mine("muon_momentum", w),
                        mine("muon_momentum", buf), mine("muon_momentum", u));
  }
  // The CPU backend's fused passes on the translated views.
  void muon_directions(const MomentumStep& k, std::span<const MuonDirection> dirs,
                       std::span<const ConstMatrixView> others,
                       std::span<std::optional<MatrixIndex>> found,
                       std::span<double> sums) override {
    const char* op = "muon_directions";
    std::vector<MuonDirection> own(dirs.begin(), dirs.end());
    for (MuonDirection& d : own) {
      d.g = mine(op, d.g);
      d.w = mine(op, d.w);
      d.buf = mine(op, d.buf);
      d.u = mine(op, d.u);
    }
    std::vector<ConstMatrixView> own_others;
    own_others.reserve(others.size());
    for (const ConstMatrixView& o : others)
      own_others.push_back(mine(op, o));
    cpu().muon_directions(k, own, own_others, found, sums);
  }
  void muon_apply(const MomentumStep& k, ConstMatrixView g, MatrixView w, MatrixView buf,
                  ConstMatrixView u, float decay, float lr) override {
    const char* op = "muon_apply";
    cpu().muon_apply(k, mine(op, g), mine(op, w), mine(op, buf), mine(op, u), decay, lr);
  }
  void adamw(const AdamWStep& k, ConstMatrixView g, MatrixView m, MatrixView v,
             MatrixView p) override {
    cpu().adamw(k, mine("adamw", g), mine("adamw", m), mine("adamw", v), mine("adamw", p));
  }

  // The storage behind [p, p + bytes) of this backend's memory; throws when the range is not
  // inside one allocation.
  void* storage(const void* p, std::size_t bytes, const char* op) const {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard lock(mutex_);
    auto it = blocks_.upper_bound(a);
    if (it != blocks_.begin()) {
      --it;
      const Block& b = it->second;
      if (a >= it->first && a + bytes <= it->first + b.bytes)
        return reinterpret_cast<char*>(b.real.get()) + (a - it->first);
    }
    throw Error(fmt::format(
        "opaque backend: {}: {} bytes at {} are not memory of this backend (host memory, or "
        "memory of another backend, where backend memory belongs)",
        op, bytes, p));
  }

 protected:
  float* do_allocate(std::size_t count) override {
    const std::size_t bytes = count * sizeof(float);
    const std::size_t span = (bytes + 2 * kAlign - 1) / kAlign * kAlign;  // a gap after each
    std::lock_guard lock(mutex_);
    std::uintptr_t at = 0;
    if (auto f = free_.find(span); f != free_.end()) {
      at = f->second;
      free_.erase(f);
    } else {
      if (next_ + span > kReserve) return nullptr;
      at = base_ + next_;
      next_ += span;
    }
    Block b{bytes, span, std::unique_ptr<float[]>(new (std::nothrow) float[count]())};
    if (!b.real) {
      free_.emplace(span, at);
      return nullptr;
    }
    blocks_.emplace(at, std::move(b));
    return reinterpret_cast<float*>(at);
  }
  void do_release(float* data, std::size_t) noexcept override {
    std::lock_guard lock(mutex_);
    const auto it = blocks_.find(reinterpret_cast<std::uintptr_t>(data));
    if (it == blocks_.end()) return;
    free_.emplace(it->second.span, it->first);
    blocks_.erase(it);
  }

 private:
  static constexpr std::size_t kReserve = std::size_t{1} << 36;  // 64 GiB of addresses
  static constexpr std::size_t kAlign = 64;
  static constexpr std::size_t kSlotFloats = sizeof(double) / sizeof(float);
  struct Block {
    std::size_t bytes = 0, span = 0;
    std::unique_ptr<float[]> real;
  };

  static Compute& cpu() { return cpu_compute(); }

  ConstMatrixView mine(const char* op, ConstMatrixView v) const {
    if (v.rows == 0 || v.cols == 0) return {nullptr, v.rows, v.cols, v.ld};
    const auto bytes = static_cast<std::size_t>((v.rows - 1) * v.ld + v.cols) * sizeof(float);
    return {static_cast<const float*>(storage(v.data, bytes, op)), v.rows, v.cols, v.ld};
  }
  MatrixView mine(const char* op, MatrixView v) const {
    const ConstMatrixView c = mine(op, ConstMatrixView(v));
    return {const_cast<float*>(c.data), c.rows, c.cols, c.ld};
  }
  template <class View>
  std::vector<View> mine_all(const char* op, std::span<const View> views) const {
    std::vector<View> out;
    out.reserve(views.size());
    for (const View& v : views)
      out.push_back(mine(op, v));
    return out;
  }
  // The storage of a packed bf16 buffer of n values (ceil(n / 2) floats).
  float* packed(const char* op, const float* p, Index n) const {
    if (n == 0) return nullptr;
    const auto bytes = static_cast<std::size_t>((n + 1) / 2) * sizeof(float);
    return static_cast<float*>(storage(p, bytes, op));
  }
  void check_host(const char* op, ConstMatrixView host) const {
    const auto a = reinterpret_cast<std::uintptr_t>(host.data);
    if (host.size() > 0 && a >= base_ && a < base_ + kReserve) {
      throw Error(fmt::format(
          "opaque backend: {}: the host side is this backend's memory, not host memory", op));
    }
  }

  static bool nccl_data_plane() {
    const char* env = std::getenv("DISTMUON_OPAQUE_DATA_PLANE");
    const std::string plane = env != nullptr ? env : "";
    if (plane.empty() || plane == "host") return false;
    if (plane == "nccl") return true;
    throw Error(fmt::format("DISTMUON_OPAQUE_DATA_PLANE='{}': expected host or nccl", plane));
  }

  bool nccl_plane_;  // DISTMUON_OPAQUE_DATA_PLANE=nccl when made
  std::uintptr_t base_ = 0;
  double* slot_ = nullptr;
  std::mutex comm_mutex_;
  std::map<const CommImpl*, std::weak_ptr<CommImpl>>
      comms_;  // NCCL data planes by host group  // normalize's sum, in this backend's memory
  std::size_t next_ = 0;
  std::map<std::uintptr_t, Block> blocks_;           // by address
  std::multimap<std::size_t, std::uintptr_t> free_;  // released address ranges by span
  mutable std::mutex mutex_;
};

std::size_t extent(const std::size_t* counts, const std::size_t* displs, int n) {
  std::size_t e = 0;
  for (int r = 0; r < n; ++r)
    if (counts[r] > 0) e = std::max(e, displs[r] + counts[r]);
  return e;
}

void* at(OpaqueCompute* owner, const void* p, std::size_t count, DType t, const char* op) {
  return count == 0 ? nullptr : owner->storage(p, count * dtype_size(t), op);
}

void OpaqueDataComm::all_gather(const void* send, void* recv, std::size_t count, DType t) {
  inner_->all_gather(at(owner_, send, count, t, "all_gather"),
                     at(owner_, recv, count * static_cast<std::size_t>(size()), t, "all_gather"),
                     count, t);
}
void OpaqueDataComm::all_reduce(void* buf, std::size_t count, DType t, ReduceOp op) {
  inner_->all_reduce(at(owner_, buf, count, t, "all_reduce"), count, t, op);
}
void OpaqueDataComm::reduce_scatter(const void* send, void* recv, std::size_t count, DType t,
                                    ReduceOp op) {
  inner_->reduce_scatter(
      at(owner_, send, count * static_cast<std::size_t>(size()), t, "reduce_scatter"),
      at(owner_, recv, count, t, "reduce_scatter"), count, t, op);
}
void OpaqueDataComm::broadcast(void* buf, std::size_t count, DType t, int root) {
  inner_->broadcast(at(owner_, buf, count, t, "broadcast"), count, t, root);
}
void OpaqueDataComm::all_to_all_v(const void* send, const std::size_t* send_counts,
                                  const std::size_t* send_displs, void* recv,
                                  const std::size_t* recv_counts, const std::size_t* recv_displs,
                                  DType t) {
  const int n = size();
  inner_->all_to_all_v(at(owner_, send, extent(send_counts, send_displs, n), t, "all_to_all_v"),
                       send_counts, send_displs,
                       at(owner_, recv, extent(recv_counts, recv_displs, n), t, "all_to_all_v"),
                       recv_counts, recv_displs, t);
}

std::unique_ptr<CommRequest> OpaqueDataComm::start_all_to_all_v(
    const void* send, const std::size_t* send_counts, const std::size_t* send_displs, void* recv,
    const std::size_t* recv_counts, const std::size_t* recv_displs, DType t) {
  const int n = size();
  return inner_->start_all_to_all_v(
      at(owner_, send, extent(send_counts, send_displs, n), t, "start_all_to_all_v"), send_counts,
      send_displs, at(owner_, recv, extent(recv_counts, recv_displs, n), t, "start_all_to_all_v"),
      recv_counts, recv_displs, t);
}

class OpaqueStreamTimer final : public StreamTimer {
 public:
  void start() override { start_ = Clock::now(); }
  void stop() override { pending_ += std::chrono::duration<double>(Clock::now() - start_).count(); }
  double seconds() override { return std::exchange(pending_, 0.0); }
  void clear() noexcept override { pending_ = 0.0; }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_{};
  double pending_ = 0.0;
};

std::unique_ptr<StreamTimer> OpaqueCompute::stream_timer() {
  return std::make_unique<OpaqueStreamTimer>();
}

}  // namespace

std::unique_ptr<Compute> make_opaque_compute() {
  return std::make_unique<OpaqueCompute>();
}

}  // namespace distmuon
