// A build without NCCL (DISTMUON_ENABLE_CUDA off or not found): no NCCL communicator (nccl_comm.h).
#include <chrono>
#include <thread>

#include "comm/nccl/nccl_comm.h"
#include "distmuon/error.h"

namespace distmuon {

std::shared_ptr<CommImpl> make_nccl_comm(std::shared_ptr<CommImpl>, std::shared_ptr<NcclDevice>) {
  throw Error(
      "nccl: this build of distmuon has no NCCL communicator (built without "
      "DISTMUON_ENABLE_CUDA, or CUDA and NCCL were not found when it was built)");
}

void nccl_wait(NcclDevice& device, const char*) {
  while (!device.idle())
    std::this_thread::sleep_for(std::chrono::microseconds(20));
}

bool nccl_built() {
  return false;
}

}  // namespace distmuon
