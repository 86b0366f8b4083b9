#pragma once
// The NVML part of the topology probe, kept apart so that it can be tested on machines without
// a GPU (the library is opened with dlopen, nothing links against NVML).

#include <string>

namespace distmuon::detail {

// "nvml:<cluster uuid hex>:<clique id>" for GPU gpu_index, or empty with why in *reason when the
// library, the driver or a completed fabric registration is not there. *no_library (when given)
// says whether the library itself could not be opened (a machine without an NVIDIA driver).
std::string nvml_fabric_domain(const std::string& library, int gpu_index, std::string* reason,
                               bool* no_library = nullptr);

}  // namespace distmuon::detail
