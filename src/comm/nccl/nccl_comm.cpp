// NCCL communicator on device memory (nccl_comm.h): collectives, grouped send/recv for
// all_to_all_v, the unique id bootstrapped over the host communicator.
#include "comm/nccl/nccl_comm.h"

#include <fmt/format.h>
#include <nccl.h>

#include <string_view>

#include "distmuon/error.h"

namespace distmuon {
namespace {

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
    ncclUniqueId id{};
    // Rank 0's id travels to every rank even when making it failed there, so that no rank waits
    // in the broadcast; the failure is then agreed over the host group.
    ncclResult_t id_rc = ncclSuccess;
    if (rank_ == 0) id_rc = ncclGetUniqueId(&id);
    host_->broadcast(&id, sizeof(id), DType::kU8, 0);
    int id_ok = id_rc == ncclSuccess ? 1 : 0;
    host_->broadcast(&id_ok, 1, DType::kI32, 0);
    if (id_ok == 0) {
      throw Error(fmt::format("nccl: ncclGetUniqueId failed on rank 0{}",
                              rank_ == 0 ? fmt::format(": {}", ncclGetErrorString(id_rc)) : ""));
    }
    if (const auto rc = cudaSetDevice(device_); rc != cudaSuccess) {
      throw Error(fmt::format("nccl: cudaSetDevice({}) failed on rank {}: {}", device_, rank_,
                              cudaGetErrorString(rc)));
    }
    check(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank",
          fmt::format("{} ranks, device {}", size_, device_));
  }
  ~NcclComm() override {
    if (comm_ != nullptr) {
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
    }
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  std::string backend() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_gather(const void* send, void* recv, std::size_t count, DType t) override {
    check(ncclAllGather(send, recv, count, nccl_type(t), comm_, stream_), "ncclAllGather",
          counted(count, t));
  }
  void all_reduce(void* buf, std::size_t count, DType t, ReduceOp op) override {
    check(ncclAllReduce(buf, buf, count, nccl_type(t), nccl_op(op), comm_, stream_),
          "ncclAllReduce", counted(count, t));
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType t,
                      ReduceOp op) override {
    check(ncclReduceScatter(send, recv, count, nccl_type(t), nccl_op(op), comm_, stream_),
          "ncclReduceScatter", counted(count, t));
  }
  void broadcast(void* buf, std::size_t count, DType t, int root) override {
    check(ncclBroadcast(buf, buf, count, nccl_type(t), root, comm_, stream_), "ncclBroadcast",
          fmt::format("{}, root {}", counted(count, t), root));
  }
  void all_to_all_v(const void* send, const std::size_t* send_counts,
                    const std::size_t* send_displs, void* recv, const std::size_t* recv_counts,
                    const std::size_t* recv_displs, DType t) override {
    const std::size_t elem = dtype_size(t);
    const auto* s = static_cast<const char*>(send);
    auto* r = static_cast<char*>(recv);
    check(ncclGroupStart(), "ncclGroupStart", "all_to_all_v");
    ncclResult_t rc = ncclSuccess;
    const char* failed = nullptr;
    for (int peer = 0; peer < size_ && rc == ncclSuccess; ++peer) {
      if (send_counts[peer] > 0) {
        rc = ncclSend(s + send_displs[peer] * elem, send_counts[peer], nccl_type(t), peer, comm_,
                      stream_);
        failed = "ncclSend";
      }
      if (rc == ncclSuccess && recv_counts[peer] > 0) {
        rc = ncclRecv(r + recv_displs[peer] * elem, recv_counts[peer], nccl_type(t), peer, comm_,
                      stream_);
        failed = "ncclRecv";
      }
    }
    const ncclResult_t end = ncclGroupEnd();  // always closes the group
    if (rc != ncclSuccess) check(rc, failed, "all_to_all_v");
    check(end, "ncclGroupEnd", "all_to_all_v");
  }
  // Everything queued so far has completed on this rank, then every rank meets on the host.
  void barrier() override {
    if (const auto rc = cudaStreamSynchronize(stream_); rc != cudaSuccess) {
      throw Error(fmt::format("nccl barrier: cudaStreamSynchronize failed on rank {}: {}", rank_,
                              cudaGetErrorString(rc)));
    }
    check(ncclCommGetAsyncError(comm_, &async_), "ncclCommGetAsyncError", "barrier");
    check(async_, "an earlier NCCL operation", "barrier");
    host_->barrier();
  }
  std::shared_ptr<CommImpl> split(int color, int key) override {
    return std::make_shared<NcclComm>(host_->split(color, key), stream_, device_);
  }
  void abort(int code) override {
    ncclCommAbort(comm_);
    comm_ = nullptr;
    host_->abort(code);
  }

 private:
  std::string counted(std::size_t count, DType t) const {
    return fmt::format("{} x {}", count, dtype_name(t));
  }
  // Throws on a failed call, and on an error NCCL reports asynchronously for this communicator.
  void check(ncclResult_t rc, std::string_view call, std::string_view context) {
    if (rc == ncclSuccess && comm_ != nullptr &&
        ncclCommGetAsyncError(comm_, &async_) == ncclSuccess && async_ != ncclSuccess &&
        async_ != ncclInProgress) {
      rc = async_;
    }
    if (rc != ncclSuccess && rc != ncclInProgress) {
      const char* last = comm_ != nullptr ? ncclGetLastError(comm_) : nullptr;
      throw Error(fmt::format(
          "nccl: {} failed on rank {} of {}: {}{} [{}]", call, rank_, size_, ncclGetErrorString(rc),
          last != nullptr && *last != '\0' ? fmt::format(" ({})", last) : "", context));
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
