#pragma once
// Communicators: a small value type (Communicator) over a shared implementation (CommImpl).
// Backends: "local" (one rank, collectives are real no-ops), "mpi" (OpenMPI), and a counting
// decorator for tests. The interface speaks in buffers, counts and element types so that a
// device backend (NCCL) can implement it on device memory.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "distmuon/error.h"

namespace distmuon {

// kBf16, kF16: 16-bit floating point on a device data plane (NCCL's ncclBfloat16, ncclFloat16;
// the host backends move them as bytes and refuse to reduce them).
enum class DType { kF32, kF64, kI32, kI64, kU8, kBf16, kF16 };
std::size_t dtype_size(DType t);
const char* dtype_name(DType t);

// A bf16 value's bits, moved as they are (DType::kBf16): the bf16 wire's element.
struct Bf16Bits {
  std::uint16_t bits;
};

template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::kF32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::kF64;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return DType::kI32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return DType::kI64;
  else if constexpr (std::is_same_v<T, Bf16Bits>)
    return DType::kBf16;
  else {
    static_assert(std::is_same_v<T, std::uint8_t> || std::is_same_v<T, char>,
                  "unsupported element type");
    return DType::kU8;
  }
}

enum class ReduceOp { kSum, kMax, kMin };

// Where a group sits in its world (MPI: MPI_COMM_WORLD): the world ranks of its ranks, in group
// order, and the world's size. Empty ranks and world_size 0: not known.
struct GroupPlacement {
  std::vector<int> ranks;
  int world_size = 0;
};

// A collective started without waiting (CommImpl::start_all_to_all_v): its buffers stay in use
// until wait() returns. wait() is called once; a request destroyed unwaited waits in its
// destructor (errors there are swallowed: call wait()).
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
};

class CommImpl {
 public:
  virtual ~CommImpl() = default;
  virtual std::string backend() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // recv[r * count + i] = send_of_rank_r[i]; recv holds size() * count elements.
  virtual void all_gather(const void* send, void* recv, std::size_t count, DType t) = 0;
  // In-place reduction of count elements across all ranks.
  virtual void all_reduce(void* buf, std::size_t count, DType t, ReduceOp op) = 0;
  // recv (count elements) = reduction over ranks of send[rank * count, (rank + 1) * count).
  virtual void reduce_scatter(const void* send, void* recv, std::size_t count, DType t,
                              ReduceOp op) = 0;
  virtual void broadcast(void* buf, std::size_t count, DType t, int root) = 0;
  // Personalised exchange: send_counts[r] elements at send + send_displs[r] go to rank r, and
  // recv_counts[r] elements from rank r land at recv + recv_displs[r] (counts, displacements in
  // elements; every array holds size() entries). send_counts[r] on this rank must equal
  // recv_counts[this rank] on rank r.
  virtual void all_to_all_v(const void* send, const std::size_t* send_counts,
                            const std::size_t* send_displs, void* recv,
                            const std::size_t* recv_counts, const std::size_t* recv_displs,
                            DType t) = 0;
  // all_to_all_v started without waiting (MPI_Ialltoallv): the exchange proceeds while the caller
  // computes, and the returned request's wait() completes it. Every rank starts the same
  // collectives in the same order. Default: the blocking all_to_all_v, returning a completed
  // request (a backend without non-blocking collectives overlaps nothing and stays correct).
  virtual std::unique_ptr<CommRequest> start_all_to_all_v(
      const void* send, const std::size_t* send_counts, const std::size_t* send_displs, void* recv,
      const std::size_t* recv_counts, const std::size_t* recv_displs, DType t);
  virtual void barrier() = 0;
  // Ranks with the same color form a new communicator, ordered by (key, old rank).
  virtual std::shared_ptr<CommImpl> split(int color, int key) = 0;
  // Aborts every process of the job (used by the CLI after an unrecoverable rank-local error).
  virtual void abort(int code) = 0;
  // This group's place in its world (errors name it: ErrorScope). Default: not known.
  virtual GroupPlacement placement() const { return {}; }
  // A side channel for a data plane's failures (the NCCL communicator's deadline protocol,
  // docs/gpu.md "Deadlines"): post_notice sends `text` to every other rank of this group without
  // waiting for them; poll_notice returns a notice another rank posted, (its rank, the text), when
  // one has arrived, and never waits. Default: no side channel (nothing sent, nothing arrives).
  virtual void post_notice(const std::string& text) { (void)text; }
  virtual std::optional<std::pair<int, std::string>> poll_notice() { return std::nullopt; }
};

class Communicator {
 public:
  explicit Communicator(std::shared_ptr<CommImpl> impl);

  int rank() const { return impl_->rank(); }
  int size() const { return impl_->size(); }
  std::string backend() const { return impl_->backend(); }
  CommImpl& impl() const { return *impl_; }
  const std::shared_ptr<CommImpl>& impl_ptr() const { return impl_; }

  // Two planes. This communicator is the control plane: host memory only (hashes, agreement,
  // plan broadcasts, scalars). data() is the data plane that moves a compute backend's memory
  // (shards, Gram matrices): the same communicator unless with_data attached another over the
  // same ranks (Compute::data_communicator does: NCCL for cuda). split() keeps only the control
  // plane.
  Communicator data() const { return data_ ? Communicator(data_) : Communicator(impl_); }
  bool has_data_plane() const { return data_ != nullptr; }
  // This communicator with `data` as its data plane; throws distmuon::Error when `data` has
  // another rank or size.
  Communicator with_data(std::shared_ptr<CommImpl> data) const;

  // Typed helpers; sizes are checked (recv.size() == size() * send.size()).
  template <typename T>
  void all_gather(std::span<const T> send, std::span<T> recv) const {
    check_gather(send.size(), recv.size());
    impl_->all_gather(send.data(), recv.data(), send.size(), dtype_of<T>());
  }
  template <typename T>
  std::vector<T> all_gather(const T& value) const {
    std::vector<T> out(static_cast<std::size_t>(size()));
    impl_->all_gather(&value, out.data(), 1, dtype_of<T>());
    return out;
  }
  template <typename T>
  void all_reduce(std::span<T> buf, ReduceOp op = ReduceOp::kSum) const {
    impl_->all_reduce(buf.data(), buf.size(), dtype_of<T>(), op);
  }
  template <typename T>
  T all_reduce(T value, ReduceOp op = ReduceOp::kSum) const {
    impl_->all_reduce(&value, 1, dtype_of<T>(), op);
    return value;
  }
  template <typename T>
  void reduce_scatter(std::span<const T> send, std::span<T> recv,
                      ReduceOp op = ReduceOp::kSum) const {
    check_gather(recv.size(), send.size());
    impl_->reduce_scatter(send.data(), recv.data(), recv.size(), dtype_of<T>(), op);
  }
  template <typename T>
  void broadcast(std::span<T> buf, int root) const {
    impl_->broadcast(buf.data(), buf.size(), dtype_of<T>(), root);
  }
  // all_to_all_v with packed buffers: the chunk for (from) rank r follows those of ranks < r.
  // Checked: both count lists hold size() entries and sum to the buffer sizes.
  template <typename T>
  void all_to_all_v(std::span<const T> send, std::span<const std::size_t> send_counts,
                    std::span<T> recv, std::span<const std::size_t> recv_counts) const {
    all_to_all_v_packed(send.data(), send.size(), send_counts, recv.data(), recv.size(),
                        recv_counts, dtype_of<T>());
  }
  // The same, started without waiting (CommImpl::start_all_to_all_v): send and recv stay in use
  // until the request's wait() returns.
  template <typename T>
  std::unique_ptr<CommRequest> start_all_to_all_v(std::span<const T> send,
                                                  std::span<const std::size_t> send_counts,
                                                  std::span<T> recv,
                                                  std::span<const std::size_t> recv_counts) const {
    return all_to_all_v_packed(send.data(), send.size(), send_counts, recv.data(), recv.size(),
                               recv_counts, dtype_of<T>(), true);
  }
  // Broadcasts a string of any length from root.
  std::string broadcast_string(const std::string& s, int root) const;
  void barrier() const { impl_->barrier(); }
  Communicator split(int color, int key) const;
  [[noreturn]] void abort(int code) const;

  // The scope of an error agreed over this group (CollectiveError::scope).
  ErrorScope error_scope() const;
  // The ranks in `world` of this group's ranks, in group order, found without communicating: the
  // identity when this is world, this rank's when the group has one rank, else from both
  // communicators' placements (CommImpl::placement). Empty when they are not known or a rank of
  // this group is not in world.
  std::vector<int> ranks_in(const Communicator& world) const;

 private:
  void check_gather(std::size_t send, std::size_t recv) const;
  // start: non-blocking (returns its request), else blocking (returns nullptr).
  std::unique_ptr<CommRequest> all_to_all_v_packed(const void* send, std::size_t send_size,
                                                   std::span<const std::size_t> send_counts,
                                                   void* recv, std::size_t recv_size,
                                                   std::span<const std::size_t> recv_counts,
                                                   DType t, bool start = false) const;
  std::shared_ptr<CommImpl> impl_;
  std::shared_ptr<CommImpl> data_;  // nullptr: impl_ carries the data too
};

// A single-rank communicator whose collectives are copies or no-ops.
Communicator local_communicator();

// MPI. MpiRuntime initialises MPI (if not yet initialised) and finalises it on destruction
// when it did the initialisation. mpi_world() requires an initialised MPI.
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
  static bool available();  // built with MPI support
 private:
  bool owns_ = false;
};
Communicator mpi_world();
// A communicator over an existing MPI communicator owned by the caller (e.g. mpi4py's
// MPI.COMM_WORLD or one of its splits): `mpi_comm` points to an MPI_Comm (kept opaque so that
// this header needs no mpi.h). The communicator is duplicated (collective over its ranks), so
// distmuon's messages never mix with the caller's; the duplicate is freed with the last copy.
// Requires an initialised MPI; never initialises or finalises it.
Communicator mpi_communicator(const void* mpi_comm);
// True when this process was launched by mpirun/mpiexec (so MPI should be initialised).
bool launched_by_mpi();
// The world communicator a program should use: MPI's when launched by mpirun, else local.
Communicator world_communicator();

// Counting decorator: forwards to an inner communicator and records, per operation, how many
// calls were made and how many bytes this rank contributed (the payload size per call, as the
// cost model counts it: all_gather = count * size * elem, all_reduce = count * elem,
// all_to_all = the elements this rank sends, its own chunk included, times elem).
struct CommStats {
  struct Op {
    std::size_t calls = 0;
    std::size_t bytes = 0;
  };
  Op all_gather, all_reduce, reduce_scatter, broadcast, all_to_all, barrier;
  void reset() { *this = CommStats{}; }
};
Communicator counting_communicator(Communicator inner, std::shared_ptr<CommStats> stats);

// A decorator that emulates a slower link for tests and benchmarks: every collective of this
// rank takes at least latency_s + bytes / bytes_per_s, counted from its start (bytes: the
// payload CommStats counts), by sleeping after the inner collective when it was faster. A
// started all_to_all_v's time runs while the caller computes and is waited out in wait(), so
// communication hidden behind computation is measurable on one machine. The data plane, when
// inner has one, is wrapped the same way.
struct LinkModel {
  double latency_s = 0;
  double bytes_per_s = 0;  // 0: no bandwidth term
};
Communicator emulated_link_communicator(const Communicator& inner, LinkModel link);

}  // namespace distmuon
