// The run-time loading of the GPU libraries (src/core/dynamic_library.h,
// src/compute/cuda/cuda_libraries.h): nothing is mapped before the first use of the cuda backend,
// a missing library or symbol is a clear error, and cuBLAS loads from this build's toolkit.
// Needs no GPU: dlopen and cuBLAS's status strings run without a device.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "compute/cuda/cuda_libraries.h"
#include "distmuon/error.h"

namespace distmuon {
namespace {

constexpr const char* kMissing = "libdistmuon-test-no-such-library.so.1";

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(name) != std::string::npos) return true;
  }
  return false;
}

// First in this file (GoogleTest runs a file's tests in order): the test program links
// libdistmuon, which must not have mapped cuBLAS or NCCL before anything asked for them.
TEST(CudaLibraries, NothingIsMappedBeforeTheFirstUse) {
  EXPECT_FALSE(mapped("libcublas")) << "cuBLAS mapped at start";
  EXPECT_FALSE(mapped("libnccl")) << "NCCL mapped at start";
  EXPECT_FALSE(mapped("libcudart.so")) << "the shared CUDA runtime mapped at start";
}

TEST(CudaLibraries, AMissingLibraryIsNamedWithTheLoadersReasonAndWhatToDo) {
  const std::string err =
      error_of([] { cuda::open_library(kMissing, "", "install it or set LD_LIBRARY_PATH"); });
  EXPECT_NE(err.find(fmt::format("device cuda: cannot load {}: ", kMissing)), std::string::npos)
      << err;
  // dlerror()'s text follows, then the hint.
  EXPECT_NE(err.find("cannot open shared object file"), std::string::npos) << err;
  EXPECT_NE(err.find("(install it or set LD_LIBRARY_PATH)"), std::string::npos) << err;
}

TEST(CudaLibraries, TheFallbackDirectoryIsTriedAndNamed) {
  const std::string err =
      error_of([] { cuda::open_library(kMissing, "/nonexistent-distmuon-dir", "install it"); });
  EXPECT_NE(err.find(fmt::format("/nonexistent-distmuon-dir/{}", kMissing)), std::string::npos)
      << err;
}

TEST(CudaLibraries, AMissingSymbolIsNamedWithItsLibrary) {
  void* libc = cuda::open_library("libc.so.6", "", "");
  ASSERT_NE(libc, nullptr);
  const std::string err =
      error_of([&] { cuda::library_symbol(libc, "libc.so.6", "distmuon_no_such_symbol"); });
  EXPECT_NE(err.find("device cuda: libc.so.6 has no symbol distmuon_no_such_symbol: "),
            std::string::npos)
      << err;
  EXPECT_NE(cuda::library_symbol(libc, "libc.so.6", "malloc"), nullptr);
}

TEST(CudaLibraries, CublasLoadsOnFirstUseWithEveryFunction) {
  EXPECT_EQ(cuda::cublas_soname(), "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR));
  const cuda::CublasApi& api = cuda::cublas();
  EXPECT_TRUE(mapped(cuda::cublas_soname()));
  EXPECT_NE(api.create, nullptr);
  EXPECT_NE(api.destroy, nullptr);
  EXPECT_NE(api.set_stream, nullptr);
  EXPECT_NE(api.ssyrk, nullptr);
  EXPECT_NE(api.gemm_ex, nullptr);
  EXPECT_NE(api.gemm_batched_ex, nullptr);
  // Calls into the library that need no device.
  EXPECT_STREQ(api.get_status_name(CUBLAS_STATUS_NOT_INITIALIZED), "CUBLAS_STATUS_NOT_INITIALIZED");
  EXPECT_NE(std::string(api.get_status_string(CUBLAS_STATUS_SUCCESS)), "");
  EXPECT_EQ(&cuda::cublas(), &api);  // loaded once
}

}  // namespace
}  // namespace distmuon
