// A communicator decorator that adds the time of every collective to a shared counter, so the
// optimizer can split a step into computation and communication: host wall time, or intervals
// on a device backend's stream for its data plane (timed_comm.h).
#include "optim/timed_comm.h"

#include <chrono>

#include "comm/forwarding_comm.h"

namespace distmuon::detail {
namespace {

class TimedComm final : public ForwardingComm {
 public:
  TimedComm(std::shared_ptr<CommImpl> inner, std::shared_ptr<double> seconds, StreamTimer* device)
      : ForwardingComm(std::move(inner)), seconds_(std::move(seconds)), device_(device) {}
  void all_gather(const void* send, void* recv, std::size_t count, DType t) override {
    timed([&] { inner().all_gather(send, recv, count, t); });
  }
  void all_reduce(void* buf, std::size_t count, DType t, ReduceOp op) override {
    timed([&] { inner().all_reduce(buf, count, t, op); });
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType t,
                      ReduceOp op) override {
    timed([&] { inner().reduce_scatter(send, recv, count, t, op); });
  }
  void broadcast(void* buf, std::size_t count, DType t, int root) override {
    timed([&] { inner().broadcast(buf, count, t, root); });
  }
  void all_to_all_v(const void* send, const std::size_t* send_counts,
                    const std::size_t* send_displs, void* recv, const std::size_t* recv_counts,
                    const std::size_t* recv_displs, DType t) override {
    timed([&] {
      inner().all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
    });
  }
  std::unique_ptr<CommRequest> start_all_to_all_v(const void* send, const std::size_t* send_counts,
                                                  const std::size_t* send_displs, void* recv,
                                                  const std::size_t* recv_counts,
                                                  const std::size_t* recv_displs,
                                                  DType t) override {
    // Its start and its wait are timed; the time between them is the caller's.
    struct Timed final : CommRequest {
      std::unique_ptr<CommRequest> inner;
      TimedComm* comm;
      void wait() override {
        comm->timed([&] { inner->wait(); });
      }
    };
    auto out = std::make_unique<Timed>();
    out->comm = this;
    timed([&] {
      out->inner = inner().start_all_to_all_v(send, send_counts, send_displs, recv, recv_counts,
                                              recv_displs, t);
    });
    return out;
  }
  void barrier() override {
    host_timed([&] { inner().barrier(); });  // waits on the host, whatever the plane
  }
  std::shared_ptr<CommImpl> split(int color, int key) override {
    return std::make_shared<TimedComm>(inner_split(color, key), seconds_, device_);
  }

 private:
  template <typename F>
  void timed(F&& f) {
    if (device_ == nullptr) {
      host_timed(f);
      return;
    }
    device_->start();
    f();
    device_->stop();
  }
  template <typename F>
  void host_timed(F&& f) {
    const auto start = std::chrono::steady_clock::now();
    f();
    *seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  std::shared_ptr<double> seconds_;
  StreamTimer* device_;  // the data plane of a device backend: intervals on its stream
};

}  // namespace

Communicator timed_communicator(const Communicator& inner, std::shared_ptr<double> seconds,
                                StreamTimer* device) {
  Communicator timed(std::make_shared<TimedComm>(inner.impl_ptr(), seconds, nullptr));
  if (!inner.has_data_plane()) return timed;
  return timed.with_data(
      std::make_shared<TimedComm>(inner.data().impl_ptr(), std::move(seconds), device));
}

}  // namespace distmuon::detail
