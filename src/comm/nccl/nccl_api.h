#pragma once
// The NCCL functions distmuon calls, from the library opened at the first NCCL communicator
// (core/dynamic_library.h: nothing links against NCCL): libnccl.so.<NCCL_MAJOR>, or the file
// DISTMUON_NCCL_LIBRARY names (the stand-in NCCL of the tests, another NCCL build).
#include <nccl.h>

#include <string>

namespace distmuon::nccl_detail {

struct NcclApi {
  std::string library;  // what was opened, for messages
  decltype(&::ncclGetUniqueId) get_unique_id;
  decltype(&::ncclCommInitRankConfig) comm_init_rank_config;
  decltype(&::ncclCommSplit) comm_split;
  decltype(&::ncclCommDestroy) comm_destroy;
  decltype(&::ncclCommAbort) comm_abort;
  decltype(&::ncclCommGetAsyncError) comm_get_async_error;
  decltype(&::ncclGetErrorString) get_error_string;
  decltype(&::ncclGetLastError) get_last_error;
  decltype(&::ncclAllGather) all_gather;
  decltype(&::ncclAllReduce) all_reduce;
  decltype(&::ncclReduceScatter) reduce_scatter;
  decltype(&::ncclBroadcast) broadcast;
  decltype(&::ncclSend) send;
  decltype(&::ncclRecv) recv;
  decltype(&::ncclGroupStart) group_start;
  decltype(&::ncclGroupEnd) group_end;
};

// NCCL, loaded on the first call (thread-safe; a failed load throws distmuon::Error and the next
// call tries again).
const NcclApi& nccl();

}  // namespace distmuon::nccl_detail
