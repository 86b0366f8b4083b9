// MPI backend (OpenMPI). Every call's return code is checked; errors become distmuon::Error with
// the MPI error string, the operation and the rank.
#include <fmt/format.h>
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include "core/fault.h"
#include "distmuon/comm.h"
#include "distmuon/error.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace distmuon {
namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kF64:
      return MPI_DOUBLE;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kI64:
      return MPI_INT64_T;
    case DType::kU8:
      return MPI_UINT8_T;
    case DType::kBf16:
    case DType::kF16:
      return MPI_UINT16_T;  // moved as bits; reductions refuse them (reducible)
  }
  DISTMUON_ASSERT(false, "unknown dtype");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  DISTMUON_ASSERT(false, "unknown reduce op");
}

int world_rank_or_minus_one() {
  int init = 0;
  if (MPI_Initialized(&init) != MPI_SUCCESS || !init) return -1;
  int r = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

void check_mpi(int rc, const char* op, const std::string& detail = {}) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(fmt::format("MPI {}{}{} failed on world rank {}: {}", op, detail.empty() ? "" : " ",
                          detail, world_rank_or_minus_one(),
                          std::string(msg, static_cast<std::size_t>(len))));
}

// MPI has no 16-bit floating-point type: those are moved as bits, never reduced.
MPI_Datatype reducible(DType t, const char* op) {
  if (t == DType::kBf16 || t == DType::kF16) {
    throw Error(
        fmt::format("MPI {}: {} cannot be reduced by the MPI backend (a device data plane "
                    "reduces it: NCCL)",
                    op, dtype_name(t)));
  }
  return mpi_type(t);
}

// The tag of the failure notices (CommImpl::post_notice); collectives never use tags.
constexpr int kNoticeTag = 7301;
// The tag of the step gate's messages (CommImpl::post_gate).
constexpr int kGateTag = 7302;

int checked_count(std::size_t count, const char* op) {
  if (count > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw Error(fmt::format("MPI {}: {} elements exceed MPI's int count", op, count));
  }
  return static_cast<int>(count);
}

// n elements of type t at data become NaN (floating-point types; others are left as they are).
void fill_nan(void* data, std::size_t n, DType t) {
  if (t == DType::kF32) {
    std::fill_n(static_cast<float*>(data), n, std::numeric_limits<float>::quiet_NaN());
  } else if (t == DType::kF64) {
    std::fill_n(static_cast<double*>(data), n, std::numeric_limits<double>::quiet_NaN());
  } else if (t == DType::kBf16 || t == DType::kF16) {  // their quiet NaNs' bits
    std::fill_n(static_cast<std::uint16_t*>(data), n,
                static_cast<std::uint16_t>(t == DType::kBf16 ? 0x7FC0 : 0x7E00));
  }
}

// A started MPI collective and the arrays it reads until it completes.
struct MpiRequest final : CommRequest {
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<int> sc, sd, rc, rd;
  std::string detail;
  DType type = DType::kF32;
  std::vector<std::pair<void*, std::size_t>> poison;  // a fault's NaN chunks (core/fault.h)
  void wait() override;
  ~MpiRequest() override {
    if (request != MPI_REQUEST_NULL) MPI_Wait(&request, MPI_STATUS_IGNORE);  // best effort
  }
};

void MpiRequest::wait() {
  check_mpi(MPI_Wait(&request, MPI_STATUS_IGNORE), "Ialltoallv (wait)", detail);
  for (const auto& [data, n] : poison)
    fill_nan(data, n, type);
}

class MpiComm final : public CommImpl {
 public:
  MpiComm(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(comm_, &rank_), "Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "Comm_size");
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // A gate message still in flight (to a rank that never received it) keeps its text.
    for (auto& send : gate_sends_) {
      int done = 0;
      if (!finalized && MPI_Test(&send->request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS &&
          done == 0 && MPI_Request_free(&send->request) == MPI_SUCCESS) {
        (void)send.release();
      }
    }
    if (owned_ && !finalized) MPI_Comm_free(&comm_);  // best effort in a destructor
  }

  std::string backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_gather(const void* send, void* recv, std::size_t count, DType t) override {
    const int n = checked_count(count, "Allgather");
    const void* src = send == recv ? MPI_IN_PLACE : send;
    if (send == recv) {
      // In place: our chunk must already sit at recv[rank * count]; move it there.
      std::memmove(
          static_cast<char*>(recv) + static_cast<std::size_t>(rank_) * count * dtype_size(t), send,
          count * dtype_size(t));
    }
    const bool poison = fault("all_gather", count, t);
    check_mpi(MPI_Allgather(src, n, mpi_type(t), recv, n, mpi_type(t), comm_), "Allgather",
              detail(count, t));
    if (poison) make_nan(recv, count * static_cast<std::size_t>(size_), t);
  }
  void all_reduce(void* buf, std::size_t count, DType t, ReduceOp op) override {
    const bool poison = fault("all_reduce", count, t);
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, buf, checked_count(count, "Allreduce"),
                            reducible(t, "Allreduce"), mpi_op(op), comm_),
              "Allreduce", detail(count, t));
    if (poison) make_nan(buf, count, t);
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType t,
                      ReduceOp op) override {
    const bool poison = fault("reduce_scatter", count, t);
    check_mpi(MPI_Reduce_scatter_block(send, recv, checked_count(count, "Reduce_scatter_block"),
                                       reducible(t, "Reduce_scatter_block"), mpi_op(op), comm_),
              "Reduce_scatter_block", detail(count, t));
    if (poison) make_nan(recv, count, t);
  }
  void broadcast(void* buf, std::size_t count, DType t, int root) override {
    if (root < 0 || root >= size_) {
      throw Error(fmt::format("MPI Bcast: root {} outside a group of {}", root, size_));
    }
    const bool poison = fault("broadcast", count, t);
    check_mpi(MPI_Bcast(buf, checked_count(count, "Bcast"), mpi_type(t), root, comm_), "Bcast",
              detail(count, t));
    if (poison) make_nan(buf, count, t);
  }
  void all_to_all_v(const void* send, const std::size_t* send_counts,
                    const std::size_t* send_displs, void* recv, const std::size_t* recv_counts,
                    const std::size_t* recv_displs, DType t) override {
    const auto n = static_cast<std::size_t>(size_);
    std::vector<int> sc(n), sd(n), rc(n), rd(n);
    std::size_t sent = 0, received = 0;
    for (std::size_t r = 0; r < n; ++r) {
      // Counts and the end of each chunk must fit MPI's int (displacements included).
      sc[r] = checked_count(send_counts[r], "Alltoallv");
      sd[r] = checked_count(send_displs[r], "Alltoallv");
      rc[r] = checked_count(recv_counts[r], "Alltoallv");
      rd[r] = checked_count(recv_displs[r], "Alltoallv");
      checked_count(send_displs[r] + send_counts[r], "Alltoallv");
      checked_count(recv_displs[r] + recv_counts[r], "Alltoallv");
      sent += send_counts[r];
      received += recv_counts[r];
    }
    const bool poison = fault("all_to_all_v", received, t);
    check_mpi(MPI_Alltoallv(send, sc.data(), sd.data(), mpi_type(t), recv, rc.data(), rd.data(),
                            mpi_type(t), comm_),
              "Alltoallv",
              fmt::format("(sends {}, receives {} x {} on rank {} of {})", sent, received,
                          dtype_name(t), rank_, size_));
    if (poison) {
      for (std::size_t r = 0; r < n; ++r)
        make_nan(static_cast<char*>(recv) + recv_displs[r] * dtype_size(t), recv_counts[r], t);
    }
  }
  std::unique_ptr<CommRequest> start_all_to_all_v(const void* send, const std::size_t* send_counts,
                                                  const std::size_t* send_displs, void* recv,
                                                  const std::size_t* recv_counts,
                                                  const std::size_t* recv_displs,
                                                  DType t) override {
    // The count arrays must outlive the collective: the request holds them.
    auto req = std::make_unique<MpiRequest>();
    const auto n = static_cast<std::size_t>(size_);
    req->sc.resize(n);
    req->sd.resize(n);
    req->rc.resize(n);
    req->rd.resize(n);
    std::size_t sent = 0, received = 0;
    for (std::size_t r = 0; r < n; ++r) {
      req->sc[r] = checked_count(send_counts[r], "Ialltoallv");
      req->sd[r] = checked_count(send_displs[r], "Ialltoallv");
      req->rc[r] = checked_count(recv_counts[r], "Ialltoallv");
      req->rd[r] = checked_count(recv_displs[r], "Ialltoallv");
      checked_count(send_displs[r] + send_counts[r], "Ialltoallv");
      checked_count(recv_displs[r] + recv_counts[r], "Ialltoallv");
      sent += send_counts[r];
      received += recv_counts[r];
    }
    req->detail = fmt::format("(sends {}, receives {} x {} on rank {} of {})", sent, received,
                              dtype_name(t), rank_, size_);
    if (fault("all_to_all_v", received, t)) {
      for (std::size_t r = 0; r < n; ++r)
        req->poison.emplace_back(static_cast<char*>(recv) + recv_displs[r] * dtype_size(t),
                                 recv_counts[r]);
    }
    req->type = t;
    check_mpi(MPI_Ialltoallv(send, req->sc.data(), req->sd.data(), mpi_type(t), recv,
                             req->rc.data(), req->rd.data(), mpi_type(t), comm_, &req->request),
              "Ialltoallv", req->detail);
    return req;
  }
  void barrier() override {
    fault("barrier", 0, DType::kU8);
    check_mpi(MPI_Barrier(comm_), "Barrier");
  }
  std::shared_ptr<CommImpl> split(int color, int key) override {
    if (color < 0) throw Error(fmt::format("MPI Comm_split: color {} must be non-negative", color));
    fault("split", 0, DType::kU8);
    MPI_Comm out = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(comm_, color, key, &out), "Comm_split",
              fmt::format("(color {}, key {})", color, key));
    return std::make_shared<MpiComm>(out, true);
  }
  void abort(int code) override { MPI_Abort(MPI_COMM_WORLD, code); }
  // Point-to-point messages on the notice tag, sent without waiting (the texts stay alive here
  // until this communicator goes: a send may complete after post_notice returns).
  void post_notice(const std::string& text) override {
    const std::lock_guard lock(notice_mutex_);
    notices_.push_back(text);
    const std::string& kept = notices_.back();
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      MPI_Request req = MPI_REQUEST_NULL;
      check_mpi(MPI_Isend(kept.data(), checked_count(kept.size(), "Isend"), MPI_CHAR, q, kNoticeTag,
                          comm_, &req),
                "Isend", "(a failure notice)");
      check_mpi(MPI_Request_free(&req), "Request_free");
    }
  }
  std::optional<std::pair<int, std::string>> poll_notice() override {
    const std::lock_guard lock(notice_mutex_);
    int flag = 0;
    MPI_Status st;
    check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, kNoticeTag, comm_, &flag, &st), "Iprobe");
    if (!flag) return std::nullopt;
    int n = 0;
    check_mpi(MPI_Get_count(&st, MPI_CHAR, &n), "Get_count");
    std::string text(static_cast<std::size_t>(n), '\0');
    check_mpi(
        MPI_Recv(text.data(), n, MPI_CHAR, st.MPI_SOURCE, kNoticeTag, comm_, MPI_STATUS_IGNORE),
        "Recv", "(a failure notice)");
    return std::make_pair(st.MPI_SOURCE, std::move(text));
  }
  // The step gate's messages: sent without waiting, each text kept with its request until the
  // send completes (tested at the next post; a send to a rank that stopped stays pending).
  bool has_gate() const override { return true; }
  void post_gate(int to, const std::string& text) override {
    std::erase_if(gate_sends_, [](const std::unique_ptr<GateSend>& s) {
      int done = 0;
      check_mpi(MPI_Test(&s->request, &done, MPI_STATUS_IGNORE), "Test", "(a step gate message)");
      return done != 0;
    });
    auto& s = gate_sends_.emplace_back(std::make_unique<GateSend>());
    s->text = text;
    check_mpi(MPI_Isend(s->text.data(), checked_count(s->text.size(), "Isend"), MPI_CHAR, to,
                        kGateTag, comm_, &s->request),
              "Isend", "(a step gate message)");
  }
  std::optional<std::string> poll_gate(int from) override {
    int flag = 0;
    MPI_Status st;
    check_mpi(MPI_Iprobe(from, kGateTag, comm_, &flag, &st), "Iprobe", "(a step gate message)");
    if (!flag) return std::nullopt;
    int n = 0;
    check_mpi(MPI_Get_count(&st, MPI_CHAR, &n), "Get_count");
    std::string text(static_cast<std::size_t>(n), '\0');
    check_mpi(MPI_Recv(text.data(), n, MPI_CHAR, from, kGateTag, comm_, MPI_STATUS_IGNORE), "Recv",
              "(a step gate message)");
    return text;
  }
  // Called while an error is being built: a failed MPI call gives "not known" instead of a
  // second error that would hide the first.
  GroupPlacement placement() const override {
    MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    GroupPlacement at;
    std::vector<int> local(static_cast<std::size_t>(size_)), ranks(local.size());
    for (std::size_t i = 0; i < local.size(); ++i)
      local[i] = static_cast<int>(i);
    if (MPI_Comm_size(MPI_COMM_WORLD, &at.world_size) == MPI_SUCCESS &&
        MPI_Comm_group(comm_, &mine) == MPI_SUCCESS &&
        MPI_Comm_group(MPI_COMM_WORLD, &world) == MPI_SUCCESS &&
        MPI_Group_translate_ranks(mine, size_, local.data(), world, ranks.data()) == MPI_SUCCESS) {
      at.ranks = std::move(ranks);
    } else {
      at.world_size = 0;
    }
    if (mine != MPI_GROUP_NULL) MPI_Group_free(&mine);
    if (world != MPI_GROUP_NULL) MPI_Group_free(&world);
    return at;
  }

 private:
  // The fault hook of every collective (core/fault.h, docs/reliability.md): a thrown fault leaves
  // before the collective; true for a nan fault, whose caller then makes this rank's result NaN.
  bool fault(const char* op, std::size_t count, DType t) const {
    if (!::distmuon::detail::fault_watching()) return false;
    return ::distmuon::detail::fault_point(
        "collective", fmt::format("{} {} x {} over {} ranks", op, count, dtype_name(t), size_));
  }
  // n elements of type t at data become NaN (floating-point types; others are left as they are).
  static void make_nan(void* data, std::size_t n, DType t) { fill_nan(data, n, t); }
  std::string detail(std::size_t count, DType t) const {
    return fmt::format("({} x {} on rank {} of {})", count, dtype_name(t), rank_, size_);
  }
  MPI_Comm comm_;
  bool owned_;
  std::mutex notice_mutex_;
  std::deque<std::string> notices_;  // posted notices (their sends may still be in flight)
  struct GateSend {
    MPI_Request request = MPI_REQUEST_NULL;
    std::string text;
  };
  // Step gate messages whose sends may be in flight (the text must stay where it is: pointers).
  std::vector<std::unique_ptr<GateSend>> gate_sends_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int init = 0;
  check_mpi(MPI_Initialized(&init), "Initialized");
  if (!init) {
    check_mpi(MPI_Init(argc, argv), "Init");
    owns_ = true;
  }
}

MpiRuntime::~MpiRuntime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

bool MpiRuntime::available() {
  return true;
}

Communicator mpi_world() {
  int init = 0;
  check_mpi(MPI_Initialized(&init), "Initialized");
  if (!init) throw Error("mpi_world: MPI is not initialised (create a distmuon::MpiRuntime first)");
  return Communicator(std::make_shared<MpiComm>(MPI_COMM_WORLD, false));
}

Communicator mpi_communicator(const void* mpi_comm) {
  if (mpi_comm == nullptr) throw Error("mpi_communicator: null MPI_Comm handle");
  int init = 0, finalized = 0;
  check_mpi(MPI_Initialized(&init), "Initialized");
  check_mpi(MPI_Finalized(&finalized), "Finalized");
  if (!init || finalized) {
    throw Error("mpi_communicator: MPI is not initialised (or already finalised)");
  }
  const MPI_Comm comm = *static_cast<const MPI_Comm*>(mpi_comm);
  if (comm == MPI_COMM_NULL) throw Error("mpi_communicator: MPI_COMM_NULL");
  MPI_Comm dup = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(comm, &dup), "Comm_dup");
  return Communicator(std::make_shared<MpiComm>(dup, true));
}

}  // namespace distmuon
