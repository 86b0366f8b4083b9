// GPU fabric information through NVML, opened at run time. The structure and constants are
// declared here (version 2 of nvmlGpuFabricInfo_t in nvml.h) so that no NVML header or library is
// needed to build.
#include "topology/nvml_fabric.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <memory>

namespace distmuon::detail {
namespace {

using NvmlReturn = int;  // nvmlReturn_t
using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr unsigned char kFabricStateCompleted = 3;  // NVML_GPU_FABRIC_STATE_COMPLETED

struct NvmlGpuFabricInfoV2 {
  unsigned int version;
  unsigned char clusterUuid[16];
  NvmlReturn status;
  unsigned int cliqueId;
  unsigned char state;  // nvmlGpuFabricState_t
  unsigned int healthMask;
};
static_assert(sizeof(NvmlGpuFabricInfoV2) == 36, "layout of nvmlGpuFabricInfo_v2_t");
// NVML_STRUCT_VERSION(GpuFabricInfo, 2): the struct size with the version in the top byte.
constexpr unsigned int kFabricInfoVersion2 =
    static_cast<unsigned int>(sizeof(NvmlGpuFabricInfoV2)) | (2u << 24);

struct LibraryCloser {
  void operator()(void* h) const { dlclose(h); }
};

template <typename F>
F symbol(void* lib, const char* name) {
  return reinterpret_cast<F>(dlsym(lib, name));
}

}  // namespace

std::string nvml_fabric_domain(const std::string& library, int gpu_index, std::string* reason,
                               bool* no_library) {
  if (no_library != nullptr) *no_library = false;
  const auto fail = [&](std::string why) {
    if (reason != nullptr) *reason = std::move(why);
    return std::string();
  };
  std::unique_ptr<void, LibraryCloser> lib(dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL));
  if (!lib) {
    if (no_library != nullptr) *no_library = true;
    const char* err = dlerror();
    return fail(
        fmt::format("cannot open {} ({})", library, err != nullptr ? err : "unknown error"));
  }
  const auto init = symbol<NvmlReturn (*)()>(lib.get(), "nvmlInit_v2");
  const auto shutdown = symbol<NvmlReturn (*)()>(lib.get(), "nvmlShutdown");
  const auto count = symbol<NvmlReturn (*)(unsigned int*)>(lib.get(), "nvmlDeviceGetCount_v2");
  const auto handle =
      symbol<NvmlReturn (*)(unsigned int, NvmlDevice*)>(lib.get(), "nvmlDeviceGetHandleByIndex_v2");
  const auto fabric = symbol<NvmlReturn (*)(NvmlDevice, NvmlGpuFabricInfoV2*)>(
      lib.get(), "nvmlDeviceGetGpuFabricInfoV");
  if (init == nullptr || shutdown == nullptr || count == nullptr || handle == nullptr ||
      fabric == nullptr) {
    return fail(
        fmt::format("{} lacks nvmlDeviceGetGpuFabricInfoV (driver older than R550?)", library));
  }
  if (const NvmlReturn rc = init(); rc != kNvmlSuccess)
    return fail(fmt::format("nvmlInit_v2 returned {}", rc));
  std::string id;
  std::string why;
  unsigned int n = 0;
  NvmlDevice dev = nullptr;
  NvmlGpuFabricInfoV2 info{};
  info.version = kFabricInfoVersion2;
  if (NvmlReturn rc = count(&n); rc != kNvmlSuccess || n == 0) {
    why = fmt::format("nvmlDeviceGetCount_v2 returned {} with {} GPUs", rc, n);
  } else if (rc = handle(static_cast<unsigned int>(std::max(gpu_index, 0)) % n, &dev);
             rc != kNvmlSuccess) {
    why = fmt::format("nvmlDeviceGetHandleByIndex_v2({}) returned {}", gpu_index, rc);
  } else if (rc = fabric(dev, &info); rc != kNvmlSuccess) {
    why = fmt::format("nvmlDeviceGetGpuFabricInfoV returned {} (no NVLink fabric on this GPU)", rc);
  } else if (info.state != kFabricStateCompleted || info.status != kNvmlSuccess) {
    why = fmt::format("GPU fabric registration not complete (state {}, status {})", info.state,
                      info.status);
  } else if (std::all_of(std::begin(info.clusterUuid), std::end(info.clusterUuid),
                         [](unsigned char c) { return c == 0; })) {
    why = "GPU fabric cluster UUID is zero (no multi-node NVLink domain)";
  } else {
    id = "nvml:";
    for (unsigned char c : info.clusterUuid)
      id += fmt::format("{:02x}", c);
    id += fmt::format(":{}", info.cliqueId);
  }
  shutdown();
  return id.empty() ? fail(why) : id;
}

}  // namespace distmuon::detail
