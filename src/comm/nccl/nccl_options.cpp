// What the NCCL communicator's users need in every build (nccl_comm.h): its deadline, the host
// memory device.
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>

#include "comm/nccl/nccl_comm.h"
#include "distmuon/error.h"

namespace distmuon {
namespace {

// Host memory: NCCL's stream argument is unused, every operation is waited for (a started one
// when its request is waited: its completion is NCCL's, nothing to join on a stream).
class HostNcclDevice final : public NcclDevice {
 public:
  std::string name() const override { return "host memory"; }
  void make_current(const char*) override {}
  void* begin_operation(const char*) override { return nullptr; }
  void end_operation(const char*) override {}
  std::unique_ptr<Completion> end_started_operation(const char*) override {
    struct Nothing final : Completion {
      void join(const char*) override {}
    };
    return std::make_unique<Nothing>();
  }
  bool idle() override { return true; }
  bool waits_each_operation() const override { return true; }
};

}  // namespace

std::shared_ptr<NcclDevice> host_nccl_device() {
  return std::make_shared<HostNcclDevice>();
}

double nccl_timeout_seconds() {
  const char* env = std::getenv("DISTMUON_NCCL_TIMEOUT");
  if (env == nullptr || *env == '\0') return 600.0;
  char* end = nullptr;
  const double v = std::strtod(env, &end);
  if (end == env || *end != '\0' || !std::isfinite(v) || v <= 0) {
    throw Error(
        fmt::format("DISTMUON_NCCL_TIMEOUT='{}': expected a positive number of seconds", env));
  }
  return v;
}

}  // namespace distmuon
