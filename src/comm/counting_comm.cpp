// Counting decorator used by tests to check what each mode sends.
#include "comm/forwarding_comm.h"
#include "distmuon/comm.h"

namespace distmuon {
namespace {

class CountingComm final : public detail::ForwardingComm {
 public:
  CountingComm(std::shared_ptr<CommImpl> inner, std::shared_ptr<CommStats> stats)
      : ForwardingComm(std::move(inner)), stats_(std::move(stats)) {}
  std::string backend() const override { return "counting(" + inner().backend() + ")"; }
  void all_gather(const void* send, void* recv, std::size_t count, DType t) override {
    record(stats_->all_gather, count * static_cast<std::size_t>(size()) * dtype_size(t));
    inner().all_gather(send, recv, count, t);
  }
  void all_reduce(void* buf, std::size_t count, DType t, ReduceOp op) override {
    record(stats_->all_reduce, count * dtype_size(t));
    inner().all_reduce(buf, count, t, op);
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType t,
                      ReduceOp op) override {
    record(stats_->reduce_scatter, count * static_cast<std::size_t>(size()) * dtype_size(t));
    inner().reduce_scatter(send, recv, count, t, op);
  }
  void broadcast(void* buf, std::size_t count, DType t, int root) override {
    record(stats_->broadcast, count * dtype_size(t));
    inner().broadcast(buf, count, t, root);
  }
  void all_to_all_v(const void* send, const std::size_t* send_counts,
                    const std::size_t* send_displs, void* recv, const std::size_t* recv_counts,
                    const std::size_t* recv_displs, DType t) override {
    std::size_t sent = 0;
    for (int r = 0; r < size(); ++r)
      sent += send_counts[r];
    record(stats_->all_to_all, sent * dtype_size(t));
    inner().all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
  }
  std::unique_ptr<CommRequest> start_all_to_all_v(const void* send, const std::size_t* send_counts,
                                                  const std::size_t* send_displs, void* recv,
                                                  const std::size_t* recv_counts,
                                                  const std::size_t* recv_displs,
                                                  DType t) override {
    std::size_t sent = 0;
    for (int r = 0; r < size(); ++r)
      sent += send_counts[r];
    record(stats_->all_to_all, sent * dtype_size(t));
    return inner().start_all_to_all_v(send, send_counts, send_displs, recv, recv_counts,
                                      recv_displs, t);
  }
  void barrier() override {
    record(stats_->barrier, 0);
    inner().barrier();
  }
  std::shared_ptr<CommImpl> split(int color, int key) override {
    return std::make_shared<CountingComm>(inner_split(color, key), stats_);
  }

 private:
  static void record(CommStats::Op& op, std::size_t bytes) {
    ++op.calls;
    op.bytes += bytes;
  }
  std::shared_ptr<CommStats> stats_;
};

}  // namespace

Communicator counting_communicator(Communicator inner, std::shared_ptr<CommStats> stats) {
  return Communicator(std::make_shared<CountingComm>(inner.impl_ptr(), std::move(stats)));
}

}  // namespace distmuon
