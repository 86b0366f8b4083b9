// The emulated link decorator (comm.h: emulated_link_communicator): every collective lasts at
// least latency + bytes / bandwidth from its start; a started all_to_all_v's time runs while the
// caller computes and is waited out in its wait().
#include <chrono>
#include <memory>
#include <thread>

#include "comm/forwarding_comm.h"
#include "distmuon/comm.h"
#include "distmuon/error.h"

namespace distmuon {
namespace {

using Clock = std::chrono::steady_clock;

class EmulatedLink final : public detail::ForwardingComm {
 public:
  EmulatedLink(std::shared_ptr<CommImpl> inner, LinkModel link)
      : ForwardingComm(std::move(inner)), link_(link) {}
  void all_gather(const void* send, void* recv, std::size_t count, DType t) override {
    const auto end = deadline(count * static_cast<std::size_t>(size()) * dtype_size(t));
    inner().all_gather(send, recv, count, t);
    std::this_thread::sleep_until(end);
  }
  void all_reduce(void* buf, std::size_t count, DType t, ReduceOp op) override {
    const auto end = deadline(count * dtype_size(t));
    inner().all_reduce(buf, count, t, op);
    std::this_thread::sleep_until(end);
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType t,
                      ReduceOp op) override {
    const auto end = deadline(count * static_cast<std::size_t>(size()) * dtype_size(t));
    inner().reduce_scatter(send, recv, count, t, op);
    std::this_thread::sleep_until(end);
  }
  void broadcast(void* buf, std::size_t count, DType t, int root) override {
    const auto end = deadline(count * dtype_size(t));
    inner().broadcast(buf, count, t, root);
    std::this_thread::sleep_until(end);
  }
  void all_to_all_v(const void* send, const std::size_t* send_counts,
                    const std::size_t* send_displs, void* recv, const std::size_t* recv_counts,
                    const std::size_t* recv_displs, DType t) override {
    const auto end = deadline(sent_bytes(send_counts, t));
    inner().all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
    std::this_thread::sleep_until(end);
  }
  std::unique_ptr<CommRequest> start_all_to_all_v(const void* send, const std::size_t* send_counts,
                                                  const std::size_t* send_displs, void* recv,
                                                  const std::size_t* recv_counts,
                                                  const std::size_t* recv_displs,
                                                  DType t) override {
    struct Request final : CommRequest {
      std::unique_ptr<CommRequest> inner;
      Clock::time_point end;
      void wait() override {
        inner->wait();
        std::this_thread::sleep_until(end);
      }
    };
    auto out = std::make_unique<Request>();
    out->end = deadline(sent_bytes(send_counts, t));
    out->inner = inner().start_all_to_all_v(send, send_counts, send_displs, recv, recv_counts,
                                            recv_displs, t);
    return out;
  }
  void barrier() override {
    const auto end = deadline(0);
    inner().barrier();
    std::this_thread::sleep_until(end);
  }
  std::shared_ptr<CommImpl> split(int color, int key) override {
    return std::make_shared<EmulatedLink>(inner_split(color, key), link_);
  }

 private:
  std::size_t sent_bytes(const std::size_t* counts, DType t) const {
    std::size_t sent = 0;
    for (int r = 0; r < size(); ++r)
      sent += counts[r];
    return sent * dtype_size(t);
  }
  // When a collective of `bytes` started now ends on the emulated link (a group of one: now).
  Clock::time_point deadline(std::size_t bytes) const {
    const auto now = Clock::now();
    if (size() <= 1) return now;
    double s = link_.latency_s;
    if (link_.bytes_per_s > 0) s += static_cast<double>(bytes) / link_.bytes_per_s;
    return now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }
  LinkModel link_;
};

}  // namespace

Communicator emulated_link_communicator(const Communicator& inner, LinkModel link) {
  if (!(link.latency_s >= 0) || !(link.bytes_per_s >= 0)) {
    throw Error("emulated link: latency and bandwidth must be >= 0");
  }
  Communicator out(std::make_shared<EmulatedLink>(inner.impl_ptr(), link));
  if (!inner.has_data_plane()) return out;
  return out.with_data(std::make_shared<EmulatedLink>(inner.data().impl_ptr(), link));
}

}  // namespace distmuon
