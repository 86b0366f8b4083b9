#pragma once
// Shared libraries opened at run time: the GPU libraries, cuBLAS (src/compute/cuda/
// cuda_libraries.h) and NCCL (src/comm/nccl/nccl_comm.cpp), so that nothing links against them and
// a program that never uses the cuda backend maps none of them. Both backends use these helpers;
// they live here, below both, so that neither includes the other's private headers.
#include <string>

namespace distmuon::cuda {

// dlopen(soname, RTLD_NOW | RTLD_LOCAL), the loader's search first (LD_LIBRARY_PATH, the
// loader's cache), then fallback_dir/soname (the directory the build found the library in; empty:
// none). Throws distmuon::Error "device cuda: cannot load <soname>: <dlerror> (<hint>)". The
// handle stays open for the life of the process.
void* open_library(const std::string& soname, const std::string& fallback_dir,
                   const std::string& hint);
// dlsym(library, name); throws distmuon::Error naming the symbol, the library and dlerror().
void* library_symbol(void* library, const std::string& soname, const char* name);
// slot = the function `name` of library, as slot's type.
template <typename F>
void resolve(F& slot, void* library, const std::string& soname, const char* name) {
  slot = reinterpret_cast<F>(library_symbol(library, soname, name));
}

}  // namespace distmuon::cuda
