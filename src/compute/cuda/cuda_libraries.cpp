// cuBLAS opened at run time (cuda_libraries.h).
#include "compute/cuda/cuda_libraries.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include "distmuon/error.h"

#ifndef DISTMUON_CUBLAS_DIR
#define DISTMUON_CUBLAS_DIR ""
#endif

namespace distmuon::cuda {
namespace {

// CublasApi::gemm_ex is spelled out (cublasGemmEx is overloaded in C++): this cast compiles only
// when it is exactly the type of one of the declared functions.
static_assert(sizeof(static_cast<decltype(CublasApi::gemm_ex)>(&::cublasGemmEx)) > 0);
static_assert(sizeof(static_cast<decltype(CublasApi::gemm_batched_ex)>(&::cublasGemmBatchedEx)) >
              0);

std::string last_dl_error() {
  const char* err = dlerror();
  return err != nullptr ? err : "unknown error";
}

CublasApi load_cublas() {
  const std::string soname = cublas_soname();
  void* lib = open_library(soname, DISTMUON_CUBLAS_DIR, "install cuBLAS or set LD_LIBRARY_PATH");
  CublasApi api{};
  resolve(api.create, lib, soname, "cublasCreate_v2");
  resolve(api.destroy, lib, soname, "cublasDestroy_v2");
  resolve(api.set_stream, lib, soname, "cublasSetStream_v2");
  resolve(api.ssyrk, lib, soname, "cublasSsyrk_v2");
  resolve(api.gemm_ex, lib, soname, "cublasGemmEx");
  resolve(api.gemm_batched_ex, lib, soname, "cublasGemmBatchedEx");
  resolve(api.get_status_string, lib, soname, "cublasGetStatusString");
  resolve(api.get_status_name, lib, soname, "cublasGetStatusName");
  return api;
}

}  // namespace

void* open_library(const std::string& soname, const std::string& fallback_dir,
                   const std::string& hint) {
  if (void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL)) return lib;
  const std::string why = last_dl_error();
  std::string also;
  if (!fallback_dir.empty()) {
    const std::string path = fmt::format("{}/{}", fallback_dir, soname);
    if (void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return lib;
    also = fmt::format("; {}: {}", path, last_dl_error());
  }
  throw Error(fmt::format("device cuda: cannot load {}: {}{} ({})", soname, why, also, hint));
}

void* library_symbol(void* library, const std::string& soname, const char* name) {
  dlerror();  // clear an earlier error
  void* sym = dlsym(library, name);
  if (sym == nullptr) {
    throw Error(
        fmt::format("device cuda: {} has no symbol {}: {} (a library older than the "
                    "headers distmuon was built with?)",
                    soname, name, last_dl_error()));
  }
  return sym;
}

std::string cublas_soname() {
  return fmt::format("libcublas.so.{}", CUBLAS_VER_MAJOR);
}

const CublasApi& cublas() {
  // A function-local static: initialised once, thread-safe; a throwing load leaves it
  // uninitialised, so the next call tries again.
  static const CublasApi api = load_cublas();
  return api;
}

}  // namespace distmuon::cuda
