// The NCCL communicator (nccl_comm.h): collectives, grouped send/recv for all_to_all_v (also
// started without waiting: start_all_to_all_v's requests), the unique id bootstrapped over the
// host communicator, non-blocking init and split, and every host wait bounded by a deadline that
// ends in the failure protocol (fail()).
#include "comm/nccl/nccl_comm.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "comm/nccl/nccl_api.h"
#include "comm/nccl/nccl_verdict.h"
#include "core/fault.h"
#include "distmuon/agreement.h"
#include "distmuon/error.h"

namespace distmuon {
namespace {

using nccl_detail::nccl;
using Clock = std::chrono::steady_clock;

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
    case DType::kBf16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
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

// A failure notice's kind (its first character; nccl_verdict.h).
using nccl_detail::kOwnError, nccl_detail::kStopped, nccl_detail::kTimedOut;

class NcclComm;

// The communicators queueing on each device (nccl_wait polls them).
struct Registry {
  std::mutex mutex;
  std::map<const NcclDevice*, std::vector<std::weak_ptr<NcclComm>>> comms;
};
Registry& registry() {
  static auto* r = new Registry;  // never destroyed: communicators may outlive static destruction
  return *r;
}

class NcclComm final : public CommImpl, public std::enable_shared_from_this<NcclComm> {
 public:
  NcclComm(std::shared_ptr<CommImpl> host, std::shared_ptr<NcclDevice> device)
      : host_(std::move(host)), device_(std::move(device)), timeout_(nccl_timeout_seconds()) {
    rank_ = host_->rank();
    size_ = host_->size();
  }
  ~NcclComm() override {
    if (comm_ == nullptr) return;
    // Destroyed only when its work completed and nothing failed; else aborted (ncclCommDestroy
    // would wait for a peer that may never come).
    ncclResult_t state = ncclInProgress;
    bool idle = false;
    try {
      device_->make_current("destroy");
      idle = device_->idle();
    } catch (const Error&) {
    }
    if (idle && nccl().comm_get_async_error(comm_, &state) == ncclSuccess && state == ncclSuccess) {
      nccl().comm_destroy(comm_);
    } else {
      nccl().comm_abort(comm_);
    }
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  std::string backend() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_gather(const void* send, void* recv, std::size_t count, DType t) override {
    run("all_gather", counted(count, t), [&](ncclComm_t c, cudaStream_t s) {
      return nccl().all_gather(send, recv, count, nccl_type(t), c, s);
    });
  }
  void all_reduce(void* buf, std::size_t count, DType t, ReduceOp op) override {
    run("all_reduce", counted(count, t), [&](ncclComm_t c, cudaStream_t s) {
      return nccl().all_reduce(buf, buf, count, nccl_type(t), nccl_op(op), c, s);
    });
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType t,
                      ReduceOp op) override {
    run("reduce_scatter", counted(count, t), [&](ncclComm_t c, cudaStream_t s) {
      return nccl().reduce_scatter(send, recv, count, nccl_type(t), nccl_op(op), c, s);
    });
  }
  void broadcast(void* buf, std::size_t count, DType t, int root) override {
    if (root < 0 || root >= size_) {
      throw Error(fmt::format("nccl broadcast: root {} outside a group of {}", root, size_));
    }
    run("broadcast", fmt::format("{}, root {}", counted(count, t), root),
        [&](ncclComm_t c, cudaStream_t s) {
          return nccl().broadcast(buf, buf, count, nccl_type(t), root, c, s);
        });
  }
  void all_to_all_v(const void* send, const std::size_t* send_counts,
                    const std::size_t* send_displs, void* recv, const std::size_t* recv_counts,
                    const std::size_t* recv_displs, DType t) override {
    run("all_to_all_v", dtype_name(t), [&](ncclComm_t c, cudaStream_t stream) {
      return exchange(send, send_counts, send_displs, recv, recv_counts, recv_displs, t, c, stream);
    });
  }
  // The same exchange queued without waiting for it (nccl_comm.h): the request's wait() orders
  // the compute stream after it (CUDA) or waits for it within the deadline (host memory).
  std::unique_ptr<CommRequest> start_all_to_all_v(const void* send, const std::size_t* send_counts,
                                                  const std::size_t* send_displs, void* recv,
                                                  const std::size_t* recv_counts,
                                                  const std::size_t* recv_displs,
                                                  DType t) override {
    auto done = enqueue("all_to_all_v", fmt::format("{} (started)", dtype_name(t)), true,
                        [&](ncclComm_t c, cudaStream_t stream) {
                          return exchange(send, send_counts, send_displs, recv, recv_counts,
                                          recv_displs, t, c, stream);
                        });
    return std::make_unique<Request>(shared_from_this(), std::move(done));
  }
  // Everything queued so far has completed on this rank (within the deadline), then every rank
  // meets on the host.
  void barrier() override {
    throw_if_failed();
    device_->make_current("barrier");
    if (comm_ != nullptr) wait("barrier", false);
    host_->barrier();
  }
  // ncclCommSplit of this communicator (connected first), the host group split alongside: the
  // same ranks in the same order (by key, then rank).
  std::shared_ptr<CommImpl> split(int color, int key) override {
    throw_if_failed();
    auto sub = std::make_shared<NcclComm>(host_->split(color, key), device_);
    register_comm(sub);
    ncclComm_t parent = comm();
    device_->make_current("ncclCommSplit");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t rc = nccl().comm_split(parent, color, key, &sub->comm_, &config);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      fail("ncclCommSplit", kOwnError, describe(rc, "ncclCommSplit"));
    }
    wait("ncclCommSplit", true);
    if (sub->comm_ != nullptr) sub->wait("ncclCommSplit", true);
    return sub;
  }
  GroupPlacement placement() const override { return host_->placement(); }
  void abort(int code) override {
    if (comm_ != nullptr) nccl().comm_abort(comm_);
    comm_ = nullptr;
    host_->abort(code);
  }

  // nccl_wait's poll: throws through fail() on this communicator's error or a peer's notice.
  // True while NCCL still reports work in progress.
  bool poll(const char* what) {
    throw_if_failed();
    if (comm_ == nullptr) return false;
    const ncclResult_t state = async_state();
    if (state != ncclSuccess && state != ncclInProgress) {
      fail(what, kOwnError, describe(state, what));
    }
    if (auto notice = poll_notice_safely()) stop_after(what, *notice);
    return state == ncclInProgress;
  }
  [[noreturn]] void timed_out(const char* what) {
    fail(what, kTimedOut,
         fmt::format("rank {} waited {} s for {} to complete", rank_, timeout_, what));
  }
  double timeout() const { return timeout_; }

  static void register_comm(const std::shared_ptr<NcclComm>& c) {
    Registry& r = registry();
    const std::lock_guard lock(r.mutex);
    auto& list = r.comms[c->device_.get()];
    std::erase_if(list, [](const auto& w) { return w.expired(); });
    list.push_back(c);
  }

 private:
  // A started exchange (start_all_to_all_v): waited once, by wait() or the destructor.
  class Request final : public CommRequest {
   public:
    Request(std::shared_ptr<NcclComm> comm, std::unique_ptr<NcclDevice::Completion> done)
        : comm_(std::move(comm)), done_(std::move(done)) {}
    ~Request() override {
      if (waited_) return;
      try {
        wait();
      } catch (const std::exception&) {  // CommRequest: errors of an unwaited request are lost
      }
    }
    Request(const Request&) = delete;
    Request& operator=(const Request&) = delete;
    void wait() override {
      if (std::exchange(waited_, true)) return;
      comm_->finish("all_to_all_v", *done_);
    }

   private:
    std::shared_ptr<NcclComm> comm_;  // declared first: outlives done_, whose device it holds
    std::unique_ptr<NcclDevice::Completion> done_;
    bool waited_ = false;
  };

  // all_to_all_v's group call: an ncclSend and an ncclRecv per peer with a non-empty chunk.
  ncclResult_t exchange(const void* send, const std::size_t* send_counts,
                        const std::size_t* send_displs, void* recv, const std::size_t* recv_counts,
                        const std::size_t* recv_displs, DType t, ncclComm_t c,
                        cudaStream_t stream) const {
    const std::size_t elem = dtype_size(t);
    const auto* s = static_cast<const char*>(send);
    auto* r = static_cast<char*>(recv);
    ncclResult_t rc = nccl().group_start();
    if (rc != ncclSuccess) return rc;
    for (int peer = 0; peer < size_ && (rc == ncclSuccess || rc == ncclInProgress); ++peer) {
      if (send_counts[peer] > 0) {
        rc = nccl().send(s + send_displs[peer] * elem, send_counts[peer], nccl_type(t), peer, c,
                         stream);
      }
      if ((rc == ncclSuccess || rc == ncclInProgress) && recv_counts[peer] > 0) {
        rc = nccl().recv(r + recv_displs[peer] * elem, recv_counts[peer], nccl_type(t), peer, c,
                         stream);
      }
    }
    const ncclResult_t end = nccl().group_end();  // always closes the group
    return rc == ncclSuccess || rc == ncclInProgress ? end : rc;
  }

  // One operation, waited for on host memory (the caller reads it on return).
  template <typename Call>
  void run(const char* op, std::string_view detail, Call&& call) {
    enqueue(op, detail, false, std::forward<Call>(call));
    if (device_->waits_each_operation()) wait(op, false);
  }

  // Queues one operation: the fault hook, the connection, the call on the device's stream
  // (after the compute stream's work queued so far); when NCCL reports the enqueue in progress
  // (a non-blocking communicator: the work reaches the stream only once it is done), the bounded
  // wait for the enqueue; then the compute stream ordered after it, or, started, the completion
  // that orders it later.
  template <typename Call>
  std::unique_ptr<NcclDevice::Completion> enqueue(const char* op, std::string_view detail,
                                                  bool started, Call&& call) {
    throw_if_failed();
    if (detail::fault_watching()) {
      detail::fault_point("nccl", fmt::format("{} {} over {} ranks", op, detail, size_));
    }
    ncclComm_t c = comm();
    device_->make_current(op);
    auto* stream = static_cast<cudaStream_t>(device_->begin_operation(op));
    const ncclResult_t rc = call(c, stream);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      fail(op, kOwnError, describe(rc, fmt::format("{} {}", op, detail)));
    }
    if (rc == ncclInProgress) wait(op, true);
    // The operation is queued: a device error from here on leaves the peers in it, so it ends
    // in the failure protocol.
    try {
      if (started) return device_->end_started_operation(op);
      device_->end_operation(op);
    } catch (const Error& e) {
      fail(op, kOwnError, fmt::format("rank {}: {}", rank_, e.what()));
    }
    return nullptr;
  }

  // A started operation's wait (Request::wait): on host memory the bounded wait until NCCL
  // reports the communicator's queued work done; on a device a check of NCCL's asynchronous error
  // and the peers' notices without waiting, then the compute stream ordered after the operation.
  void finish(const char* op, NcclDevice::Completion& done) {
    throw_if_failed();
    device_->make_current(op);
    if (device_->waits_each_operation()) {
      wait(op, false);
    } else {
      poll(op);
    }
    try {
      done.join(op);
    } catch (const Error& e) {
      fail(op, kOwnError, fmt::format("rank {}: {}", rank_, e.what()));
    }
  }

  // Polls until NCCL reports no work in progress (enqueued: the call's enqueue only) and, unless
  // enqueued, the device is idle; the failure protocol on an error, a notice or the deadline.
  void wait(const char* op, bool enqueued) {
    const auto limit = Clock::now() + std::chrono::duration<double>(timeout_);
    auto pause = std::chrono::microseconds(1);
    for (;;) {
      const ncclResult_t state = async_state();
      if (state != ncclSuccess && state != ncclInProgress) fail(op, kOwnError, describe(state, op));
      if (auto notice = poll_notice_safely()) stop_after(op, *notice);
      if (state == ncclSuccess) {
        bool idle = enqueued;
        if (!idle) {
          try {
            idle = device_->idle();
          } catch (const Error& e) {
            fail(op, kOwnError, fmt::format("rank {}: {}", rank_, e.what()));
          }
        }
        if (idle) return;
      }
      if (Clock::now() > limit) timed_out(op);
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  ncclResult_t async_state() {
    ncclResult_t state = ncclSuccess;
    if (comm_ == nullptr) return state;
    const ncclResult_t rc = nccl().comm_get_async_error(comm_, &state);
    return rc != ncclSuccess ? rc : state;
  }
  std::optional<std::pair<int, std::string>> poll_notice_safely() {
    try {
      return host_->poll_notice();
    } catch (const Error&) {
      return std::nullopt;  // no side channel: the deadline still bounds the wait
    }
  }
  [[noreturn]] void stop_after(const char* op, const std::pair<int, std::string>& notice) {
    fail(op, kStopped, fmt::format("rank {} stopped after rank {}'s notice", rank_, notice.first),
         notice);
  }

  // The failure protocol: post this rank's notice, abort NCCL, collect the other ranks' notices
  // for a grace period, then throw naming the failing ranks: those that reported their own error,
  // else those that did not answer (stalled or dead). Every later operation throws the same.
  [[noreturn]] void fail(const char* op, char kind, const std::string& text,
                         std::optional<std::pair<int, std::string>> first = std::nullopt) {
    if (!failed_.empty()) throw Error(failed_);
    try {
      host_->post_notice(std::string(1, kind) + text);
    } catch (const Error&) {  // no side channel: the peers' deadlines end them
    }
    if (comm_ != nullptr) nccl().comm_abort(comm_);
    comm_ = nullptr;
    std::map<int, std::string> answers;
    answers[rank_] = std::string(1, kind) + text;
    if (first) answers[first->first] = first->second;
    const auto grace = Clock::now() + std::chrono::duration<double>(std::min(2.0, timeout_ / 2));
    while (static_cast<int>(answers.size()) < size_ && Clock::now() < grace) {
      if (auto n = poll_notice_safely()) {
        answers[n->first] = n->second;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    const nccl_detail::FailureVerdict verdict =
        nccl_detail::failure_verdict(op, answers, size_, timeout_);
    failed_ = verdict.message;
    if (verdict.agreed) throw CollectiveError(failed_, Communicator(host_).error_scope());
    throw Error(verdict.thrown);
  }
  void throw_if_failed() const {
    if (!failed_.empty()) throw Error(failed_);
  }

  std::string describe(ncclResult_t rc, std::string_view context) const {
    const char* last = comm_ != nullptr ? nccl().get_last_error(comm_) : nullptr;
    return fmt::format("{} on rank {}{} [{}]", nccl().get_error_string(rc), rank_,
                       last != nullptr && *last != '\0' ? fmt::format(" ({})", last) : "", context);
  }

  // The NCCL communicator, made at the first collective (collective over the host group, in the
  // order the ranks reach their collectives), so that attaching the data plane
  // (Compute::data_communicator, Muon::add_parameter) stays rank-local.
  ncclComm_t comm() {
    if (comm_ == nullptr) connect();
    return comm_;
  }
  void connect();

  std::string counted(std::size_t count, DType t) const {
    return fmt::format("{} x {}", count, dtype_name(t));
  }

  std::shared_ptr<CommImpl> host_;
  std::shared_ptr<NcclDevice> device_;
  double timeout_;
  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  std::string failed_;  // set by fail(): every later operation throws it
};

void NcclComm::connect() {
  // Every rank loads NCCL, then the ranks agree on it before the first collective of the
  // bootstrap, so that a rank without the library fails the others instead of leaving them
  // waiting.
  const Communicator host(host_);
  std::string load_error;
  try {
    nccl();
  } catch (const Error& e) {
    load_error = e.what();
  }
  agree_or_throw(host, load_error.empty(), "nccl: loading NCCL", load_error);
  ncclUniqueId id{};
  // Rank 0's id travels to every rank even when making it failed there, so that no rank waits
  // in the broadcast; the failure is then agreed over the host group.
  ncclResult_t id_rc = ncclSuccess;
  if (rank_ == 0) id_rc = nccl().get_unique_id(&id);
  host_->broadcast(&id, sizeof(id), DType::kU8, 0);
  agree_or_throw(host, id_rc == ncclSuccess, "nccl: ncclGetUniqueId on rank 0",
                 id_rc == ncclSuccess ? "" : nccl().get_error_string(id_rc));
  // Making the device current, then starting ncclCommInitRankConfig (non-blocking), each agreed
  // over the host group: a rank whose device fails does not enter NCCL's bootstrap. The bootstrap
  // itself runs in NCCL's threads; its wait is bounded like every other (wait()).
  std::string why;
  try {
    device_->make_current("ncclCommInitRankConfig");
  } catch (const Error& e) {
    why = e.what();
  }
  agree_or_throw(host, why.empty(), "nccl: making the device current before ncclCommInit", why);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t rc = nccl().comm_init_rank_config(&comm_, size_, id, rank_, &config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    why = fmt::format("ncclCommInitRankConfig failed on rank {} of {} ({}): {}", rank_, size_,
                      device_->name(), nccl().get_error_string(rc));
  }
  try {
    agree_or_throw(host, why.empty(), "nccl: ncclCommInitRankConfig", why);
  } catch (const Error&) {
    if (comm_ != nullptr) nccl().comm_abort(comm_);
    comm_ = nullptr;
    throw;
  }
  wait("ncclCommInitRankConfig", true);
}

}  // namespace

std::shared_ptr<CommImpl> make_nccl_comm(std::shared_ptr<CommImpl> host,
                                         std::shared_ptr<NcclDevice> device) {
  auto c = std::make_shared<NcclComm>(std::move(host), std::move(device));
  NcclComm::register_comm(c);
  return c;
}

void nccl_wait(NcclDevice& device, const char* what) {
  std::vector<std::shared_ptr<NcclComm>> comms;
  {
    Registry& r = registry();
    const std::lock_guard lock(r.mutex);
    for (const auto& w : r.comms[&device])
      if (auto c = w.lock()) comms.push_back(std::move(c));
  }
  if (comms.empty()) {
    while (!device.idle())
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    return;
  }
  const auto limit = Clock::now() + std::chrono::duration<double>(comms.front()->timeout());
  auto pause = std::chrono::microseconds(1);
  for (;;) {
    bool busy = false;
    for (const auto& c : comms)
      busy = c->poll(what) || busy;
    if (!busy && device.idle()) return;
    if (Clock::now() > limit) comms.front()->timed_out(what);
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

bool nccl_built() {
  return true;
}

}  // namespace distmuon
