// A stand-in for libnccl: the subset of the NCCL API distmuon calls (src/comm/nccl/nccl_comm.cpp),
// over host memory shared between the processes of one machine, so that the NCCL communicator runs
// at several ranks without GPUs. distmuon loads it through its NCCL loader
// (DISTMUON_NCCL_LIBRARY=<path of this library>), with a compute backend whose buffers are host
// memory (the opaque backend, DISTMUON_OPAQUE_DATA_PLANE=nccl). docs/gpu.md lists what it does not
// model of the real library.
//
// A communicator is a POSIX shared-memory segment named by its unique id: a header of counters and
// one slot per rank. Every call queues its operation on the communicator's worker thread and
// returns ncclSuccess; ncclCommGetAsyncError answers ncclInProgress while queued operations
// run (the stand-in's "stream" is this queue), and the error of a failed one after. A collective
// copies this rank's input into its slot, waits until every rank has (the counters), computes its
// output from every slot, then waits until every rank has read before the slot is written again.
// Reductions add in a fixed tree order, ((r0 + r1) + (r2 + r3)) at four ranks. Grouped
// send/recv (ncclGroupStart/End) run as one exchange between the peers named. A wait that sees
// its peer's process gone reports ncclRemoteError; ncclCommAbort stops every wait of the
// communicator at once.
//
// Test hooks: DISTMUON_STANDIN_ASYNC_ERROR=RANK:N makes the N-th operation queued on this process
// (counted over its communicators) fail with ncclRemoteError when it runs on communicator rank
// RANK of a communicator spanning every rank of the first one made, without telling the peers
// (they wait, as on a GPU whose peer's kernel never ran). DISTMUON_STANDIN_DELAY_US=N (read when a
// communicator is made) makes its worker wait N microseconds before each operation, as a slow
// link would, so that an operation is still in flight for that long after its call returned.
// distmuon_standin_pending() (not an NCCL function: the tests find it with dlsym) is the number of
// operations queued or running on this process's communicators.
#include <fcntl.h>
#include <nccl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace standin {

constexpr int kMaxRanks = 64;
constexpr std::size_t kSlotBytes = std::size_t{64} << 20;  // one rank's payload per operation

struct Header {
  std::atomic<std::uint64_t> arrived[kMaxRanks];  // 2g+1: slot written for op g; 2g+2: read
  std::atomic<std::int64_t> pid[kMaxRanks];
  std::atomic<std::uint64_t> posted[kMaxRanks][kMaxRanks];    // p2p batches src -> dst written
  std::atomic<std::uint64_t> consumed[kMaxRanks][kMaxRanks];  // ... and read by dst
  std::atomic<std::int32_t> split_color[kMaxRanks];
  std::atomic<std::int32_t> split_key[kMaxRanks];
};
// Per rank slot: a table of (offset, bytes) per peer for send/recv, then the payload.
struct P2pTable {
  std::uint64_t offset[kMaxRanks];
  std::uint64_t bytes[kMaxRanks];
};

std::atomic<long> g_ops{0};     // operations queued by this process (the async-error hook)
std::atomic<int> g_pending{0};  // operations queued or running (distmuon_standin_pending)
std::atomic<int> g_world{0};    // ranks of the first communicator made

std::string segment_name(const ncclUniqueId& id) {
  return std::string(id.internal);
}

float bf16_to_float(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint16_t float_to_bf16(float f) {  // round to nearest even; NaN stays NaN
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
float half_to_float(std::uint16_t h) {
  return static_cast<float>(reinterpret_cast<_Float16&>(h));
}
std::uint16_t float_to_half(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  std::uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

std::size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

template <typename T>
T apply(ncclRedOp_t op, T a, T b) {
  switch (op) {
    case ncclSum:
      return a + b;
    case ncclMax:
      return std::max(a, b);
    case ncclMin:
      return std::min(a, b);
    default:
      return a * b;
  }
}

// out[i] = the reduction of in[0..n)[i], in the tree order ((0 + 1) + (2 + 3)).
template <typename T>
void reduce_typed(ncclRedOp_t op, const std::vector<const void*>& in, void* out,
                  std::size_t count) {
  const auto n = in.size();
  std::vector<T> acc(count);
  std::function<void(std::size_t, std::size_t, T*)> tree = [&](std::size_t lo, std::size_t len,
                                                               T* dst) {
    if (len == 1) {
      std::memcpy(dst, in[lo], count * sizeof(T));
      return;
    }
    std::size_t half = 1;
    while (half * 2 < len)
      half *= 2;
    std::vector<T> right(count);
    tree(lo, half, dst);
    tree(lo + half, len - half, right.data());
    for (std::size_t i = 0; i < count; ++i)
      dst[i] = apply(op, dst[i], right[i]);
  };
  tree(0, n, acc.data());
  std::memcpy(out, acc.data(), count * sizeof(T));
}

void reduce_16(ncclRedOp_t op, const std::vector<const void*>& in, void* out, std::size_t count,
               bool bf16) {
  std::vector<std::vector<float>> wide(in.size(), std::vector<float>(count));
  std::vector<const void*> ptrs;
  for (std::size_t r = 0; r < in.size(); ++r) {
    const auto* h = static_cast<const std::uint16_t*>(in[r]);
    for (std::size_t i = 0; i < count; ++i)
      wide[r][i] = bf16 ? bf16_to_float(h[i]) : half_to_float(h[i]);
    ptrs.push_back(wide[r].data());
  }
  // Each partial sum rounds to the wire type, as a reduction in that type does.
  std::vector<float> acc(count);
  std::function<void(std::size_t, std::size_t, float*)> tree = [&](std::size_t lo, std::size_t len,
                                                                   float* dst) {
    if (len == 1) {
      std::memcpy(dst, ptrs[lo], count * sizeof(float));
      return;
    }
    std::size_t half = 1;
    while (half * 2 < len)
      half *= 2;
    std::vector<float> right(count);
    tree(lo, half, dst);
    tree(lo + half, len - half, right.data());
    for (std::size_t i = 0; i < count; ++i) {
      const float v = apply(op, dst[i], right[i]);
      dst[i] = bf16 ? bf16_to_float(float_to_bf16(v)) : half_to_float(float_to_half(v));
    }
  };
  tree(0, in.size(), acc.data());
  auto* o = static_cast<std::uint16_t*>(out);
  for (std::size_t i = 0; i < count; ++i)
    o[i] = bf16 ? float_to_bf16(acc[i]) : float_to_half(acc[i]);
}

bool reduce(ncclDataType_t t, ncclRedOp_t op, const std::vector<const void*>& in, void* out,
            std::size_t count) {
  switch (t) {
    case ncclFloat32:
      reduce_typed<float>(op, in, out, count);
      return true;
    case ncclFloat64:
      reduce_typed<double>(op, in, out, count);
      return true;
    case ncclInt32:
      reduce_typed<std::int32_t>(op, in, out, count);
      return true;
    case ncclInt64:
      reduce_typed<std::int64_t>(op, in, out, count);
      return true;
    case ncclUint8:
      reduce_typed<std::uint8_t>(op, in, out, count);
      return true;
    case ncclBfloat16:
      reduce_16(op, in, out, count, true);
      return true;
    case ncclFloat16:
      reduce_16(op, in, out, count, false);
      return true;
    default:
      return false;
  }
}

struct P2pOp {
  bool send;
  int peer;
  void* buf;
  std::size_t bytes;
};

}  // namespace standin

using namespace standin;

struct ncclComm {
  std::string name;
  int rank = 0, nranks = 1;
  Header* hdr = nullptr;
  char* slots = nullptr;
  std::size_t map_bytes = 0;
  std::uint64_t generation = 0;                 // collectives run (worker thread)
  std::vector<std::uint64_t> sent_batches;      // p2p batches sent to each peer (worker)
  std::vector<std::uint64_t> received_batches;  // ... received from each peer (worker)
  int splits = 0;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<ncclResult_t()>> queue;
  int running = 0;    // queued or running operations
  long delay_us = 0;  // DISTMUON_STANDIN_DELAY_US
  std::atomic<bool> aborting{false};
  std::atomic<int> error{ncclSuccess};
  std::string last_error;
  bool stop = false;
  std::thread worker;

  char* slot(int r) const { return slots + static_cast<std::size_t>(r) * kSlotBytes; }

  void fail(ncclResult_t rc, std::string why) {
    std::lock_guard lock(mu);
    if (error.load() == ncclSuccess) {
      last_error = std::move(why);
      error.store(rc);
    }
  }

  // Waits until pred() holds; false (error set) when aborted or a needed peer is gone.
  template <typename Pred>
  bool wait(Pred pred, const std::vector<int>& peers, const char* what) {
    auto last_check = std::chrono::steady_clock::now();
    for (int spin = 0; !pred(); ++spin) {
      if (aborting.load()) {
        fail(ncclInternalError, "communicator aborted");
        return false;
      }
      if (spin < 64) continue;
      std::this_thread::sleep_for(std::chrono::microseconds(spin < 1024 ? 5 : 200));
      const auto now = std::chrono::steady_clock::now();
      if (now - last_check > std::chrono::milliseconds(100)) {
        last_check = now;
        for (int q : peers) {
          const auto pid = hdr->pid[q].load();
          if (pid > 0 && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
            char buf[160];
            std::snprintf(buf, sizeof buf, "%s: rank %d (process %lld) is gone", what, q,
                          static_cast<long long>(pid));
            fail(ncclRemoteError, buf);
            return false;
          }
        }
      }
    }
    return true;
  }
  std::vector<int> everyone() const {
    std::vector<int> v;
    for (int q = 0; q < nranks; ++q)
      if (q != rank) v.push_back(q);
    return v;
  }
  // Before this rank's slot is written again: every peer has read what it was sent last.
  bool slot_free(const char* what) {
    for (int q = 0; q < nranks; ++q) {
      const std::uint64_t want = sent_batches[q];
      if (!wait([&] { return hdr->consumed[rank][q].load(std::memory_order_acquire) >= want; }, {q},
                what))
        return false;
    }
    return true;
  }
  // A collective: write(slot) then read(every slot), with the two barriers between.
  bool collective(const char* what, const std::function<void(char*)>& write,
                  const std::function<void()>& read) {
    if (!slot_free(what)) return false;
    const std::uint64_t g = generation++;
    write(slot(rank));
    hdr->arrived[rank].store(2 * g + 1, std::memory_order_release);
    const auto all = everyone();
    for (int q = 0; q < nranks; ++q) {
      if (!wait([&] { return hdr->arrived[q].load(std::memory_order_acquire) >= 2 * g + 1; }, all,
                what))
        return false;
    }
    read();
    hdr->arrived[rank].store(2 * g + 2, std::memory_order_release);
    for (int q = 0; q < nranks; ++q) {
      if (!wait([&] { return hdr->arrived[q].load(std::memory_order_acquire) >= 2 * g + 2; }, all,
                what))
        return false;
    }
    return true;
  }

  void run() {
    for (;;) {
      std::function<ncclResult_t()> op;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;
        op = std::move(queue.front());
        queue.pop_front();
      }
      if (delay_us > 0 && !aborting.load())
        std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      // After an error, queued operations are dropped (their outputs are undefined).
      if (error.load() == ncclSuccess && !aborting.load()) {
        const ncclResult_t rc = op();
        if (rc != ncclSuccess) fail(rc, "operation failed");
      }
      std::lock_guard lock(mu);
      --running;
      --g_pending;
    }
  }

  ncclResult_t enqueue(std::function<ncclResult_t()> op) {
    if (error.load() != ncclSuccess) return static_cast<ncclResult_t>(error.load());
    const long n = ++g_ops;
    if (const char* spec = std::getenv("DISTMUON_STANDIN_ASYNC_ERROR")) {
      int r = -1;
      long at = -1;
      if (std::sscanf(spec, "%d:%ld", &r, &at) == 2 && r == rank && at == n &&
          nranks == g_world.load()) {
        op = [this, n] {
          char buf[96];
          std::snprintf(buf, sizeof buf, "injected error in operation %ld", n);
          fail(ncclRemoteError, buf);
          return ncclRemoteError;
        };
      }
    }
    std::lock_guard lock(mu);
    queue.push_back(std::move(op));
    ++running;
    ++g_pending;
    cv.notify_one();
    return ncclSuccess;
  }

  ~ncclComm() {
    {
      std::lock_guard lock(mu);
      stop = true;
      cv.notify_one();
    }
    if (worker.joinable()) worker.join();
    if (hdr != nullptr) munmap(hdr, map_bytes);
  }
};

namespace {

thread_local int g_group_depth = 0;
thread_local std::vector<std::pair<ncclComm*, P2pOp>> g_group_ops;

std::size_t header_bytes() {
  return (sizeof(Header) + sizeof(P2pTable) * 0 + 4095) / 4096 * 4096;
}

// Maps (creating when needed) the segment; joins it as `rank`; every rank then meets once and rank
// 0 unlinks the name (the mapping stays).
ncclResult_t open_comm(ncclComm* c) {
  c->map_bytes = header_bytes() + static_cast<std::size_t>(c->nranks) * kSlotBytes;
  const int fd = shm_open(c->name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0) {
    c->fail(ncclSystemError, std::string("shm_open ") + c->name + ": " + std::strerror(errno));
    return ncclSystemError;
  }
  if (ftruncate(fd, static_cast<off_t>(c->map_bytes)) != 0) {
    c->fail(ncclSystemError, std::string("ftruncate: ") + std::strerror(errno));
    close(fd);
    return ncclSystemError;
  }
  void* p = mmap(nullptr, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    c->fail(ncclSystemError, std::string("mmap: ") + std::strerror(errno));
    return ncclSystemError;
  }
  c->hdr = static_cast<Header*>(p);
  c->slots = static_cast<char*>(p) + header_bytes();
  c->sent_batches.assign(static_cast<std::size_t>(c->nranks), 0);
  c->received_batches.assign(static_cast<std::size_t>(c->nranks), 0);
  c->hdr->pid[c->rank].store(getpid());
  const bool ok = c->collective(
      "init", [](char*) {}, [] {});
  if (c->rank == 0) shm_unlink(c->name.c_str());
  return ok ? ncclSuccess : static_cast<ncclResult_t>(c->error.load());
}

ncclResult_t make_comm(ncclComm_t* out, int nranks, const std::string& name, int rank,
                       const ncclConfig_t* config) {
  if (out == nullptr || nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks)
    return ncclInvalidArgument;
  auto* c = new ncclComm;
  c->name = name;
  c->rank = rank;
  c->nranks = nranks;
  if (const char* delay = std::getenv("DISTMUON_STANDIN_DELAY_US")) c->delay_us = std::atol(delay);
  int expected = 0;
  g_world.compare_exchange_strong(expected, nranks);
  c->worker = std::thread([c] { c->run(); });
  *out = c;
  const bool blocking = config == nullptr || config->blocking != 0;
  // The join runs as the first queued operation: non-blocking init returns at once.
  {
    std::lock_guard lock(c->mu);
    c->queue.push_back([c] { return open_comm(c); });
    ++c->running;
    ++g_pending;
    c->cv.notify_one();
  }
  if (!blocking) return ncclInProgress;
  for (;;) {
    {
      std::lock_guard lock(c->mu);
      if (c->running == 0) break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return static_cast<ncclResult_t>(c->error.load());
}

}  // namespace

extern "C" {

int distmuon_standin_pending() {
  return g_pending.load();
}

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  std::memset(id, 0, sizeof *id);
  std::random_device rd;
  std::snprintf(id->internal, sizeof id->internal, "/distmuon-nccl-standin-%d-%08x%08x",
                static_cast<int>(getpid()), rd(), rd());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  return make_comm(comm, nranks, segment_name(id), rank, config);
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return make_comm(comm, nranks, segment_name(id), rank, nullptr);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  if (comm == nullptr || newcomm == nullptr) return ncclInvalidArgument;
  // Collective over comm: every rank's (color, key) through the header, then the new ranks.
  if (comm->error.load() != ncclSuccess) return static_cast<ncclResult_t>(comm->error.load());
  const int split = comm->splits++;
  struct Result {
    std::mutex mu;
    std::vector<std::pair<int, int>> members;  // (key, old rank) of this color
  };
  auto res = std::make_shared<Result>();
  comm->enqueue([comm, color, key, res] {
    const bool ok = comm->collective(
        "ncclCommSplit",
        [&](char*) {
          comm->hdr->split_color[comm->rank].store(color);
          comm->hdr->split_key[comm->rank].store(key);
        },
        [&] {
          std::lock_guard lock(res->mu);
          for (int q = 0; q < comm->nranks; ++q) {
            if (comm->hdr->split_color[q].load() == color)
              res->members.emplace_back(comm->hdr->split_key[q].load(), q);
          }
        });
    return ok ? ncclSuccess : static_cast<ncclResult_t>(comm->error.load());
  });
  // The split itself is blocking on the parent's queue (its members are known after it ran).
  for (;;) {
    {
      std::lock_guard lock(comm->mu);
      if (comm->running == 0) break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (comm->error.load() != ncclSuccess) return static_cast<ncclResult_t>(comm->error.load());
  if (color == NCCL_SPLIT_NOCOLOR) {
    *newcomm = nullptr;
    return ncclSuccess;
  }
  std::sort(res->members.begin(), res->members.end());
  int new_rank = 0;
  for (std::size_t i = 0; i < res->members.size(); ++i)
    if (res->members[i].second == comm->rank) new_rank = static_cast<int>(i);
  const std::string name = comm->name + "-s" + std::to_string(split) + "c" + std::to_string(color);
  return make_comm(newcomm, static_cast<int>(res->members.size()), name, new_rank, config);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  if (comm == nullptr || state == nullptr) return ncclInvalidArgument;
  std::lock_guard lock(comm->mu);
  const auto e = static_cast<ncclResult_t>(comm->error.load());
  *state = e != ncclSuccess ? e : comm->running > 0 ? ncclInProgress : ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  comm->aborting.store(true);
  delete comm;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t rc) {
  switch (rc) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  static thread_local std::string copy;
  if (comm == nullptr) return "";
  std::lock_guard lock(comm->mu);
  copy = comm->last_error;
  return copy.c_str();
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
  const std::size_t bytes = count * type_size(t);
  if (comm == nullptr || type_size(t) == 0 || bytes > kSlotBytes) return ncclInvalidArgument;
  return comm->enqueue([=] {
    std::vector<const void*> in;
    const bool ok = comm->collective(
        "ncclAllReduce", [&](char* mine) { std::memcpy(mine, send, bytes); },
        [&] {
          for (int q = 0; q < comm->nranks; ++q)
            in.push_back(comm->slot(q));
          reduce(t, op, in, recv, count);
        });
    return ok ? ncclSuccess : static_cast<ncclResult_t>(comm->error.load());
  });
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
  const std::size_t bytes = count * type_size(t);
  if (comm == nullptr || type_size(t) == 0 || bytes * comm->nranks > kSlotBytes)
    return ncclInvalidArgument;
  return comm->enqueue([=] {
    const bool ok = comm->collective(
        "ncclReduceScatter", [&](char* mine) { std::memcpy(mine, send, bytes * comm->nranks); },
        [&] {
          std::vector<const void*> in;
          for (int q = 0; q < comm->nranks; ++q)
            in.push_back(comm->slot(q) + bytes * comm->rank);
          reduce(t, op, in, recv, count);
        });
    return ok ? ncclSuccess : static_cast<ncclResult_t>(comm->error.load());
  });
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t t,
                           ncclComm_t comm, cudaStream_t) {
  const std::size_t bytes = count * type_size(t);
  if (comm == nullptr || type_size(t) == 0 || bytes > kSlotBytes) return ncclInvalidArgument;
  return comm->enqueue([=] {
    const bool ok = comm->collective(
        "ncclAllGather", [&](char* mine) { std::memmove(mine, send, bytes); },
        [&] {
          for (int q = 0; q < comm->nranks; ++q)
            std::memmove(static_cast<char*>(recv) + bytes * q, comm->slot(q), bytes);
        });
    return ok ? ncclSuccess : static_cast<ncclResult_t>(comm->error.load());
  });
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root,
                           ncclComm_t comm, cudaStream_t) {
  const std::size_t bytes = count * type_size(t);
  if (comm == nullptr || type_size(t) == 0 || bytes > kSlotBytes || root < 0 ||
      root >= comm->nranks)
    return ncclInvalidArgument;
  return comm->enqueue([=] {
    const bool ok = comm->collective(
        "ncclBroadcast",
        [&](char* mine) {
          if (comm->rank == root) std::memcpy(mine, send, bytes);
        },
        [&] { std::memmove(recv, comm->slot(root), bytes); });
    return ok ? ncclSuccess : static_cast<ncclResult_t>(comm->error.load());
  });
}

ncclResult_t ncclGroupStart() {
  ++g_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t) {
  if (comm == nullptr || type_size(t) == 0 || peer < 0 || peer >= comm->nranks)
    return ncclInvalidArgument;
  g_group_ops.push_back({comm, P2pOp{true, peer, const_cast<void*>(buf), count * type_size(t)}});
  return g_group_depth > 0 ? ncclSuccess : (ncclGroupStart(), ncclGroupEnd());
}

ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t) {
  if (comm == nullptr || type_size(t) == 0 || peer < 0 || peer >= comm->nranks)
    return ncclInvalidArgument;
  g_group_ops.push_back({comm, P2pOp{false, peer, buf, count * type_size(t)}});
  return g_group_depth > 0 ? ncclSuccess : (ncclGroupStart(), ncclGroupEnd());
}

ncclResult_t ncclGroupEnd() {
  if (g_group_depth > 0) --g_group_depth;
  if (g_group_depth > 0) return ncclSuccess;
  auto ops = std::move(g_group_ops);
  g_group_ops.clear();
  // One exchange per communicator, in the order the communicators first appear.
  std::vector<ncclComm*> comms;
  for (auto& [c, op] : ops)
    if (std::find(comms.begin(), comms.end(), c) == comms.end()) comms.push_back(c);
  ncclResult_t result = ncclSuccess;
  for (ncclComm* c : comms) {
    std::vector<P2pOp> mine;
    std::size_t total = 0;
    for (auto& [cc, op] : ops) {
      if (cc != c) continue;
      mine.push_back(op);
      if (op.send) total += op.bytes;
    }
    if (total + sizeof(P2pTable) > kSlotBytes) return ncclInvalidArgument;
    const ncclResult_t rc = c->enqueue([c, mine] {
      if (!c->slot_free("ncclSend")) return static_cast<ncclResult_t>(c->error.load());
      auto* table = reinterpret_cast<P2pTable*>(c->slot(c->rank));
      char* data = c->slot(c->rank) + sizeof(P2pTable);
      std::uint64_t at = 0;
      for (const P2pOp& op : mine) {
        if (!op.send) continue;
        table->offset[op.peer] = at;
        table->bytes[op.peer] = op.bytes;
        std::memcpy(data + at, op.buf, op.bytes);
        at += op.bytes;
      }
      for (const P2pOp& op : mine) {
        if (!op.send) continue;
        const std::uint64_t n = ++c->sent_batches[op.peer];
        c->hdr->posted[c->rank][op.peer].store(n, std::memory_order_release);
      }
      for (const P2pOp& op : mine) {
        if (op.send) continue;
        const int q = op.peer;
        const std::uint64_t n = ++c->received_batches[q];
        if (!c->wait(
                [&] { return c->hdr->posted[q][c->rank].load(std::memory_order_acquire) >= n; },
                {q}, "ncclRecv"))
          return static_cast<ncclResult_t>(c->error.load());
        const auto* peer_table = reinterpret_cast<const P2pTable*>(c->slot(q));
        if (peer_table->bytes[c->rank] != op.bytes) {
          char buf[160];
          std::snprintf(buf, sizeof buf, "ncclRecv: rank %d sent %llu bytes, %zu expected", q,
                        static_cast<unsigned long long>(peer_table->bytes[c->rank]), op.bytes);
          c->fail(ncclInvalidUsage, buf);
          return ncclInvalidUsage;
        }
        std::memcpy(op.buf, c->slot(q) + sizeof(P2pTable) + peer_table->offset[c->rank], op.bytes);
        c->hdr->consumed[q][c->rank].store(n, std::memory_order_release);
      }
      return ncclSuccess;
    });
    if (rc != ncclSuccess) result = rc;
  }
  return result;
}

}  // extern "C"
