// Shared libraries opened at run time (dynamic_library.h).
#include "core/dynamic_library.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include "distmuon/error.h"

namespace distmuon::cuda {
namespace {

std::string last_dl_error() {
  const char* err = dlerror();
  return err != nullptr ? err : "unknown error";
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

}  // namespace distmuon::cuda
