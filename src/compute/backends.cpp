// The compute backends by name (the CLI's --device, the Python bindings).
#include <fmt/format.h>

#include <cstdint>

#include "distmuon/compute.h"
#include "distmuon/error.h"

namespace distmuon {

#if DISTMUON_HAVE_CUDA
Compute& cuda_compute_of_this_rank();  // src/compute/cuda
#else
namespace {
Error no_cuda() {
  return Error(
      "device cuda: this build of distmuon has no CUDA backend (configure with "
      "-DDISTMUON_ENABLE_CUDA=ON on a machine with the CUDA toolkit, cuBLAS and NCCL)");
}
}  // namespace

Compute& cuda_compute_on_stream(int, std::uintptr_t) {
  throw no_cuda();
}
#endif

std::vector<std::string> compute_backend_names() {
#if DISTMUON_HAVE_CUDA
  return {"cpu", "opaque", "cuda"};
#else
  return {"cpu", "opaque"};
#endif
}

Compute& compute_backend(std::string_view name) {
  if (name == "cpu") return cpu_compute();
  if (name == "opaque") {
    static const std::unique_ptr<Compute> opaque = make_opaque_compute();
    return *opaque;
  }
#if DISTMUON_HAVE_CUDA
  if (name == "cuda") return cuda_compute_of_this_rank();
#else
  if (name == "cuda") throw no_cuda();
#endif
  throw Error(fmt::format("unknown device '{}' (valid: {})", name,
                          fmt::join(compute_backend_names(), ", ")));
}

}  // namespace distmuon
