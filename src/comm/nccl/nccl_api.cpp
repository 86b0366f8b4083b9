// NCCL opened at run time (nccl_api.h).
#include "comm/nccl/nccl_api.h"

#include <fmt/format.h>

#include <cstdlib>

#include "core/dynamic_library.h"

#ifndef DISTMUON_NCCL_DIR
#define DISTMUON_NCCL_DIR ""
#endif

namespace distmuon::nccl_detail {
namespace {

using cuda::resolve;

NcclApi load_nccl() {
  const char* env = std::getenv("DISTMUON_NCCL_LIBRARY");
  const bool named = env != nullptr && *env != '\0';
  const std::string soname = named ? std::string(env) : fmt::format("libnccl.so.{}", NCCL_MAJOR);
  void* lib =
      named ? cuda::open_library(soname, "", "DISTMUON_NCCL_LIBRARY names it")
            : cuda::open_library(soname, DISTMUON_NCCL_DIR, "install NCCL or set LD_LIBRARY_PATH");
  NcclApi api{};
  api.library = soname;
  resolve(api.get_unique_id, lib, soname, "ncclGetUniqueId");
  resolve(api.comm_init_rank_config, lib, soname, "ncclCommInitRankConfig");
  resolve(api.comm_split, lib, soname, "ncclCommSplit");
  resolve(api.comm_destroy, lib, soname, "ncclCommDestroy");
  resolve(api.comm_abort, lib, soname, "ncclCommAbort");
  resolve(api.comm_get_async_error, lib, soname, "ncclCommGetAsyncError");
  resolve(api.get_error_string, lib, soname, "ncclGetErrorString");
  resolve(api.get_last_error, lib, soname, "ncclGetLastError");
  resolve(api.all_gather, lib, soname, "ncclAllGather");
  resolve(api.all_reduce, lib, soname, "ncclAllReduce");
  resolve(api.reduce_scatter, lib, soname, "ncclReduceScatter");
  resolve(api.broadcast, lib, soname, "ncclBroadcast");
  resolve(api.send, lib, soname, "ncclSend");
  resolve(api.recv, lib, soname, "ncclRecv");
  resolve(api.group_start, lib, soname, "ncclGroupStart");
  resolve(api.group_end, lib, soname, "ncclGroupEnd");
  return api;
}

}  // namespace

const NcclApi& nccl() {
  static const NcclApi api = load_nccl();
  return api;
}

}  // namespace distmuon::nccl_detail
