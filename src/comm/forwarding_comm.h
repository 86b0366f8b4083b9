#pragma once
// The base of a communicator decorator that observes collectives without changing their
// buffers (counting, emulated link, timing): every operation goes to the wrapped communicator,
// so that a decorator overrides only what it changes and every other operation, the side
// channels (notices, the step gate) included, reaches the communicator underneath. split()
// stays for each decorator to wrap. Not for a data plane that translates buffers (the opaque
// and CUDA staged ones): an operation it did not override would reach the host communicator
// with untranslated pointers.

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "distmuon/comm.h"

namespace distmuon::detail {

class ForwardingComm : public CommImpl {
 public:
  explicit ForwardingComm(std::shared_ptr<CommImpl> inner) : inner_(std::move(inner)) {}
  std::string backend() const override { return inner_->backend(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void all_gather(const void* send, void* recv, std::size_t count, DType t) override {
    inner_->all_gather(send, recv, count, t);
  }
  void all_reduce(void* buf, std::size_t count, DType t, ReduceOp op) override {
    inner_->all_reduce(buf, count, t, op);
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType t,
                      ReduceOp op) override {
    inner_->reduce_scatter(send, recv, count, t, op);
  }
  void broadcast(void* buf, std::size_t count, DType t, int root) override {
    inner_->broadcast(buf, count, t, root);
  }
  void all_to_all_v(const void* send, const std::size_t* send_counts,
                    const std::size_t* send_displs, void* recv, const std::size_t* recv_counts,
                    const std::size_t* recv_displs, DType t) override {
    inner_->all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
  }
  std::unique_ptr<CommRequest> start_all_to_all_v(const void* send, const std::size_t* send_counts,
                                                  const std::size_t* send_displs, void* recv,
                                                  const std::size_t* recv_counts,
                                                  const std::size_t* recv_displs,
                                                  DType t) override {
    return inner_->start_all_to_all_v(send, send_counts, send_displs, recv, recv_counts,
                                      recv_displs, t);
  }
  void barrier() override { inner_->barrier(); }
  void abort(int code) override { inner_->abort(code); }
  GroupPlacement placement() const override { return inner_->placement(); }
  void post_notice(const std::string& text) override { inner_->post_notice(text); }
  std::optional<std::pair<int, std::string>> poll_notice() override {
    return inner_->poll_notice();
  }
  bool has_gate() const override { return inner_->has_gate(); }
  void post_gate(int to, const std::string& text) override { inner_->post_gate(to, text); }
  std::optional<std::string> poll_gate(int from) override { return inner_->poll_gate(from); }

 protected:
  CommImpl& inner() const { return *inner_; }
  // The wrapped communicator split as split(color, key) asks, for a decorator to wrap again.
  std::shared_ptr<CommImpl> inner_split(int color, int key) { return inner_->split(color, key); }

 private:
  std::shared_ptr<CommImpl> inner_;
};

}  // namespace distmuon::detail
