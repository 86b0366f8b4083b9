// The host-staged data plane of the CUDA backend (cuda_staged_comm.h).
#include "compute/cuda/cuda_staged_comm.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "compute/cuda/cuda_check.h"
#include "distmuon/error.h"

namespace distmuon::cuda {
namespace {

class StagedComm final : public CommImpl {
 public:
  StagedComm(std::shared_ptr<CommImpl> host, int device, cudaStream_t stream)
      : host_(std::move(host)), device_(device), stream_(stream) {}

  std::string backend() const override { return "staged+" + host_->backend(); }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }

  void all_gather(const void* send, void* recv, std::size_t count, DType t) override {
    const std::size_t bytes = count * dtype_size(t);
    std::vector<char> s = in(send, bytes, "all_gather"), r(bytes * n());
    host_->all_gather(s.data(), r.data(), count, t);
    out(r, recv, "all_gather");
  }
  void all_reduce(void* buf, std::size_t count, DType t, ReduceOp op) override {
    std::vector<char> b = in(buf, count * dtype_size(t), "all_reduce");
    host_->all_reduce(b.data(), count, t, op);
    out(b, buf, "all_reduce");
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType t,
                      ReduceOp op) override {
    const std::size_t bytes = count * dtype_size(t);
    std::vector<char> s = in(send, bytes * n(), "reduce_scatter"), r(bytes);
    host_->reduce_scatter(s.data(), r.data(), count, t, op);
    out(r, recv, "reduce_scatter");
  }
  void broadcast(void* buf, std::size_t count, DType t, int root) override {
    std::vector<char> b = in(buf, count * dtype_size(t), "broadcast");
    host_->broadcast(b.data(), count, t, root);
    out(b, buf, "broadcast");
  }
  void all_to_all_v(const void* send, const std::size_t* send_counts,
                    const std::size_t* send_displs, void* recv, const std::size_t* recv_counts,
                    const std::size_t* recv_displs, DType t) override {
    const std::size_t elem = dtype_size(t);
    std::vector<char> s = in(send, extent(send_counts, send_displs) * elem, "all_to_all_v");
    std::vector<char> r(extent(recv_counts, recv_displs) * elem);
    host_->all_to_all_v(s.data(), send_counts, send_displs, r.data(), recv_counts, recv_displs, t);
    out(r, recv, "all_to_all_v");
  }
  void barrier() override {
    sync("barrier");
    host_->barrier();
  }
  std::shared_ptr<CommImpl> split(int color, int key) override {
    return std::make_shared<StagedComm>(host_->split(color, key), device_, stream_);
  }
  void abort(int code) override { host_->abort(code); }
  GroupPlacement placement() const override { return host_->placement(); }

 private:
  std::size_t n() const { return static_cast<std::size_t>(host_->size()); }
  std::size_t extent(const std::size_t* counts, const std::size_t* displs) const {
    std::size_t e = 0;
    for (std::size_t r = 0; r < n(); ++r)
      if (counts[r] > 0) e = std::max(e, displs[r] + counts[r]);
    return e;
  }
  void sync(const char* op) {
    make_current(device_, op);
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", op);
  }
  // The device bytes at p, on the host, after everything queued before them.
  std::vector<char> in(const void* p, std::size_t bytes, const char* op) {
    sync(op);
    std::vector<char> h(bytes);
    if (bytes > 0) check(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy", op);
    return h;
  }
  void out(const std::vector<char>& h, void* p, const char* op) {
    if (!h.empty())
      check(cudaMemcpy(p, h.data(), h.size(), cudaMemcpyHostToDevice), "cudaMemcpy", op);
  }

  std::shared_ptr<CommImpl> host_;
  int device_;
  cudaStream_t stream_;
};

}  // namespace

std::shared_ptr<CommImpl> make_staged_comm(std::shared_ptr<CommImpl> host, int device,
                                           cudaStream_t stream) {
  return std::make_shared<StagedComm>(std::move(host), device, stream);
}

bool staged_data_plane() {
  const char* env = std::getenv("DISTMUON_CUDA_DATA_PLANE");
  const std::string plane = env != nullptr ? env : "";
  if (plane.empty() || plane == "nccl") return false;
  if (plane == "host") return true;
  throw Error(fmt::format("DISTMUON_CUDA_DATA_PLANE='{}': expected nccl or host", plane));
}

}  // namespace distmuon::cuda
