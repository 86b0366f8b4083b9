#pragma once
// The gpu tests' common pieces: skipping without a device, and host <-> CUDA round trips.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string_view>

#include "compute/cuda/cuda_compute.h"
#include "distmuon/compute.h"

namespace distmuon::test {
// DISTMUON_TEST_REQUIRE_GPU=1 (scripts/device-check.sh sets it where the driver reports a
// device): a test that would skip for want of a CUDA device fails instead, so that a CUDA
// start-up failure is never reported as a pass.
inline bool gpu_required() {
  const char* v = std::getenv("DISTMUON_TEST_REQUIRE_GPU");
  return v != nullptr && std::string_view(v) == "1";
}
}  // namespace distmuon::test

// Skips the calling test (GTEST_SKIP, reported by ctest as not run) when this machine has no
// CUDA device; fails it instead when a GPU is required (above).
#define DISTMUON_REQUIRE_CUDA()                                                               \
  do {                                                                                        \
    if (::distmuon::cuda_device_count() == 0) {                                               \
      if (::distmuon::test::gpu_required())                                                   \
        FAIL() << "no CUDA device, but DISTMUON_TEST_REQUIRE_GPU=1 (the driver reports one)"; \
      GTEST_SKIP() << "no CUDA device: skipped";                                              \
    }                                                                                         \
  } while (0)
