// NCCL communicator on device memory (nccl_comm.h): collectives, grouped send/recv for
// all_to_all_v, the unique id bootstrapped over the host communicator.
#include "comm/nccl/nccl_comm.h"

#include <fmt/format.h>
#include <nccl.h>

#include <string_view>

#include "core/dynamic_library.h"
#include "distmuon/agreement.h"
#include "distmuon/error.h"

#ifndef DISTMUON_NCCL_DIR
#define DISTMUON_NCCL_DIR ""
#endif

namespace distmuon {
namespace {

// The NCCL functions distmuon calls, from libnccl.so.<NCCL_MAJOR> opened at the first NCCL
// communicator (core/dynamic_library.h: nothing links against NCCL).
struct NcclApi {
  decltype(&::ncclGetUniqueId) get_unique_id;
  decltype(&::ncclCommInitRank) comm_init_rank;
  decltype(&::ncclCommDestroy) comm_destroy;
  decltype(&::ncclCommAbort) comm_abort;
  decltype(&::ncclCommGetAsyncError) comm_get_async_error;
  decltype(&::ncclGetErrorString) get_error_string;
  decltype(&::ncclGetLastError) get_last_error;
  decltype(&::ncclAllGather) all_gather;
  decltype(&::ncclAllReduce) all_reduce;
  decltype(&::ncclReduceScatter) reduce_scatter;
  decltype(&::ncclBroadcast) broadcast;
  decltype(&::ncclSend) send;
  decltype(&::ncclRecv) recv;
  decltype(&::ncclGroupStart) group_start;
  decltype(&::ncclGroupEnd) group_end;
};

using cuda::resolve;

NcclApi load_nccl() {
  const std::string soname = fmt::format("libnccl.so.{}", NCCL_MAJOR);
  void* lib = cuda::open_library(soname, DISTMUON_NCCL_DIR, "install NCCL or set LD_LIBRARY_PATH");
  NcclApi api{};
  resolve(api.get_unique_id, lib, soname, "ncclGetUniqueId");
  resolve(api.comm_init_rank, lib, soname, "ncclCommInitRank");
  resolve(api.comm_destroy, lib, soname, "ncclCommDestroy");
  resolve(api.comm_abort, lib, soname, "ncclCommAbort");
  resolve(api.comm_get_async_error, lib, soname, "ncclCommGetAsyncError");
  resolve(api.get_error_string, lib, soname, "ncclGetErrorString");
  resolve(api.get_last_error, lib, soname, "ncclGetLastError");
  resolve(api.all_gather, lib, soname, "ncclAllGather");
  resolve(api.all_reduce, lib, soname, "ncclAllReduce");
  resolve(api.reduce_scatter, lib, soname, "ncclReduceScatter");
  resolve(api.broadcast, lib, soname, "ncclBroadcast");
  resolve(api.send, lib, soname, "ncclSend");
  resolve(api.recv, lib, soname, "ncclRecv");
  resolve(api.group_start, lib, soname, "ncclGroupStart");
  resolve(api.group_end, lib, soname, "ncclGroupEnd");
  return api;
}

// NCCL, loaded on the first call (thread-safe; a failed load throws and the next call tries
// again).
const NcclApi& nccl() {
  static const NcclApi api = load_nccl();
  return api;
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU8:
      return ncclUint8;
  }
  throw Error("nccl: unknown element type");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  throw Error("nccl: unknown reduction");
}

class NcclComm final : public CommImpl {
 public:
  NcclComm(std::shared_ptr<CommImpl> host, cudaStream_t stream, int device)
      : host_(std::move(host)), stream_(stream), device_(device) {
    rank_ = host_->rank();
    size_ = host_->size();
  }
  ~NcclComm() override {
    if (comm_ != nullptr) {
      cudaSetDevice(device_);  // errors ignored: at process exit the runtime may be gone
      cudaStreamSynchronize(stream_);
      nccl().comm_destroy(comm_);
    }
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  std::string backend() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_gather(const void* send, void* recv, std::size_t count, DType t) override {
    make_current("all_gather");
    check(nccl().all_gather(send, recv, count, nccl_type(t), comm(), stream_), "ncclAllGather",
          counted(count, t));
  }
  void all_reduce(void* buf, std::size_t count, DType t, ReduceOp op) override {
    make_current("all_reduce");
    check(nccl().all_reduce(buf, buf, count, nccl_type(t), nccl_op(op), comm(), stream_),
          "ncclAllReduce", counted(count, t));
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType t,
                      ReduceOp op) override {
    make_current("reduce_scatter");
    check(nccl().reduce_scatter(send, recv, count, nccl_type(t), nccl_op(op), comm(), stream_),
          "ncclReduceScatter", counted(count, t));
  }
  void broadcast(void* buf, std::size_t count, DType t, int root) override {
    make_current("broadcast");
    check(nccl().broadcast(buf, buf, count, nccl_type(t), root, comm(), stream_), "ncclBroadcast",
          fmt::format("{}, root {}", counted(count, t), root));
  }
  void all_to_all_v(const void* send, const std::size_t* send_counts,
                    const std::size_t* send_displs, void* recv, const std::size_t* recv_counts,
                    const std::size_t* recv_displs, DType t) override {
    make_current("all_to_all_v");
    const std::size_t elem = dtype_size(t);
    const auto* s = static_cast<const char*>(send);
    auto* r = static_cast<char*>(recv);
    ncclComm_t c = comm();
    check(nccl().group_start(), "ncclGroupStart", "all_to_all_v");
    ncclResult_t rc = ncclSuccess;
    const char* failed = nullptr;
    for (int peer = 0; peer < size_ && rc == ncclSuccess; ++peer) {
      if (send_counts[peer] > 0) {
        rc = nccl().send(s + send_displs[peer] * elem, send_counts[peer], nccl_type(t), peer, c,
                         stream_);
        failed = "ncclSend";
      }
      if (rc == ncclSuccess && recv_counts[peer] > 0) {
        rc = nccl().recv(r + recv_displs[peer] * elem, recv_counts[peer], nccl_type(t), peer, c,
                         stream_);
        failed = "ncclRecv";
      }
    }
    const ncclResult_t end = nccl().group_end();  // always closes the group
    if (rc != ncclSuccess) check(rc, failed, "all_to_all_v");
    check(end, "ncclGroupEnd", "all_to_all_v");
  }
  // Everything queued so far has completed on this rank, then every rank meets on the host.
  void barrier() override {
    make_current("barrier");
    if (const auto rc = cudaStreamSynchronize(stream_); rc != cudaSuccess) {
      throw Error(fmt::format("nccl barrier: cudaStreamSynchronize failed on rank {}: {}", rank_,
                              cudaGetErrorString(rc)));
    }
    if (comm_ != nullptr) {
      check(nccl().comm_get_async_error(comm_, &async_), "ncclCommGetAsyncError", "barrier");
      check(async_, "an earlier NCCL operation", "barrier");
    }
    host_->barrier();
  }
  std::shared_ptr<CommImpl> split(int color, int key) override {
    return std::make_shared<NcclComm>(host_->split(color, key), stream_, device_);
  }
  GroupPlacement placement() const override { return host_->placement(); }
  void abort(int code) override {
    if (comm_ != nullptr) nccl().comm_abort(comm_);
    comm_ = nullptr;
    host_->abort(code);
  }

 private:
  // The NCCL communicator, made at the first collective (collective over the host group, in the
  // order the ranks reach their collectives), so that attaching the data plane
  // (Compute::data_communicator, Muon::add_parameter) stays rank-local.
  ncclComm_t comm() {
    if (comm_ == nullptr) connect();
    return comm_;
  }
  void connect() {
    // Every rank loads NCCL, then the ranks agree on it before the first collective of the
    // bootstrap, so that a rank without the library fails the others instead of leaving them
    // waiting.
    std::string load_error;
    try {
      nccl();
    } catch (const Error& e) {
      load_error = e.what();
    }
    int loaded = load_error.empty() ? 1 : 0;
    host_->all_reduce(&loaded, 1, DType::kI32, ReduceOp::kMin);
    if (loaded == 0) {
      throw Error(!load_error.empty()
                      ? load_error
                      : fmt::format("nccl: another rank could not load NCCL (rank {} did; the "
                                    "other rank's error names the library)",
                                    rank_));
    }
    ncclUniqueId id{};
    // Rank 0's id travels to every rank even when making it failed there, so that no rank waits
    // in the broadcast; the failure is then agreed over the host group.
    ncclResult_t id_rc = ncclSuccess;
    if (rank_ == 0) id_rc = nccl().get_unique_id(&id);
    host_->broadcast(&id, sizeof(id), DType::kU8, 0);
    int id_ok = id_rc == ncclSuccess ? 1 : 0;
    host_->broadcast(&id_ok, 1, DType::kI32, 0);
    if (id_ok == 0) {
      throw Error(
          fmt::format("nccl: ncclGetUniqueId failed on rank 0{}",
                      rank_ == 0 ? fmt::format(": {}", nccl().get_error_string(id_rc)) : ""));
    }
    // Making the device current, then ncclCommInitRank, each agreed over the host group: a rank
    // whose device fails does not enter NCCL's bootstrap (the others would wait there for it),
    // and when the init fails on some ranks, every rank drops its communicator and throws. (A
    // rank that fails inside NCCL's bootstrap, after the others joined it, is NCCL's to end.)
    const Communicator host(host_);
    std::string why;
    try {
      make_current("ncclCommInitRank");
    } catch (const Error& e) {
      why = e.what();
    }
    agree_or_throw(host, why.empty(), "nccl: making the device current before ncclCommInitRank",
                   why);
    try {
      check(nccl().comm_init_rank(&comm_, size_, id, rank_), "ncclCommInitRank",
            fmt::format("{} ranks, device {}", size_, device_));
    } catch (const Error& e) {
      why = e.what();
    }
    try {
      agree_or_throw(host, why.empty(), "nccl: ncclCommInitRank", why);
    } catch (const Error&) {
      if (comm_ != nullptr) nccl().comm_abort(comm_);
      comm_ = nullptr;
      throw;
    }
  }
  // The communicator's device, current on the calling thread (any thread may call).
  void make_current(const char* op) const {
    int current = -1;
    cudaError_t rc = cudaGetDevice(&current);
    if (rc == cudaSuccess && current == device_) return;
    if (rc == cudaSuccess) rc = cudaSetDevice(device_);
    if (rc != cudaSuccess) {
      throw Error(fmt::format("nccl: {}: making device {} current failed on rank {} of {}: {}", op,
                              device_, rank_, size_, cudaGetErrorString(rc)));
    }
  }
  std::string counted(std::size_t count, DType t) const {
    return fmt::format("{} x {}", count, dtype_name(t));
  }
  // Throws on a failed call, and on an error NCCL reports asynchronously for this communicator.
  void check(ncclResult_t rc, std::string_view call, std::string_view context) {
    if (rc == ncclSuccess && comm_ != nullptr &&
        nccl().comm_get_async_error(comm_, &async_) == ncclSuccess && async_ != ncclSuccess &&
        async_ != ncclInProgress) {
      rc = async_;
    }
    if (rc != ncclSuccess && rc != ncclInProgress) {
      const char* last = comm_ != nullptr ? nccl().get_last_error(comm_) : nullptr;
      throw Error(fmt::format("nccl: {} failed on rank {} of {}: {}{} [{}]", call, rank_, size_,
                              nccl().get_error_string(rc),
                              last != nullptr && *last != '\0' ? fmt::format(" ({})", last) : "",
                              context));
    }
  }

  std::shared_ptr<CommImpl> host_;
  cudaStream_t stream_;
  int device_;
  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  ncclResult_t async_ = ncclSuccess;
};

}  // namespace

std::shared_ptr<CommImpl> make_nccl_comm(std::shared_ptr<CommImpl> host, cudaStream_t stream,
                                         int device) {
  return std::make_shared<NcclComm>(std::move(host), stream, device);
}

}  // namespace distmuon
