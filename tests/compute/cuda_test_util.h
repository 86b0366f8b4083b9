#pragma once
// The gpu tests' common pieces: skipping without a device, and host <-> CUDA round trips.
#include <gtest/gtest.h>

#include "compute/cuda/cuda_compute.h"
#include "distmuon/compute.h"

// Skips the calling test (GTEST_SKIP, reported by ctest as not run) when this machine has no
// CUDA device.
#define DISTMUON_REQUIRE_CUDA()                                                          \
  do {                                                                                   \
    if (::distmuon::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: skipped"; \
  } while (0)
