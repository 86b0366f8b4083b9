// Single-rank backend: every collective over one rank is a copy or nothing at all.
#include <cstdlib>
#include <cstring>

#include "distmuon/comm.h"
#include "distmuon/error.h"

namespace distmuon {
namespace {

class LocalComm final : public CommImpl {
 public:
  std::string backend() const override { return "local"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_gather(const void* send, void* recv, std::size_t count, DType t) override {
    if (send != recv && count > 0) std::memmove(recv, send, count * dtype_size(t));
  }
  void all_reduce(void*, std::size_t, DType, ReduceOp) override {}
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType t, ReduceOp) override {
    all_gather(send, recv, count, t);
  }
  void broadcast(void*, std::size_t, DType, int root) override {
    if (root != 0)
      throw Error("broadcast: root " + std::to_string(root) + " outside a 1-rank group");
  }
  void all_to_all_v(const void* send, const std::size_t* send_counts,
                    const std::size_t* send_displs, void* recv, const std::size_t* recv_counts,
                    const std::size_t* recv_displs, DType t) override {
    if (send_counts[0] != recv_counts[0]) {
      throw Error("all_to_all_v: sends " + std::to_string(send_counts[0]) +
                  " elements to itself "
                  "but expects " +
                  std::to_string(recv_counts[0]));
    }
    if (send_counts[0] > 0) {
      std::memmove(static_cast<char*>(recv) + recv_displs[0] * dtype_size(t),
                   static_cast<const char*>(send) + send_displs[0] * dtype_size(t),
                   send_counts[0] * dtype_size(t));
    }
  }
  void barrier() override {}
  std::shared_ptr<CommImpl> split(int, int) override { return std::make_shared<LocalComm>(); }
  void abort(int code) override { std::exit(code); }
  // One rank; in a job launched by mpirun, that rank of the launcher's world.
  GroupPlacement placement() const override {
    auto env = [](const char* a, const char* b, int fallback) {
      for (const char* var : {a, b}) {
        if (const char* v = std::getenv(var)) return std::atoi(v);
      }
      return fallback;
    };
    return {{env("OMPI_COMM_WORLD_RANK", "PMI_RANK", 0)},
            env("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", 1)};
  }
};

}  // namespace

Communicator local_communicator() {
  return Communicator(std::make_shared<LocalComm>());
}

}  // namespace distmuon
