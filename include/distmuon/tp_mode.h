#pragma once
// The tensor-parallel modes of orthogonalising a sharded weight, and the partition dimension of a
// sharded matrix (see tp.h and layout.h for what each mode does).

#include <string_view>

namespace distmuon {

enum class TpMode { kBlockwise, kDuplicated, kDistributed, kAuto, kOwner };
TpMode parse_tp_mode(std::string_view name);  // throws, listing the valid names
const char* to_string(TpMode mode);

// Partition dimension of a sharded matrix: kNone (replicated), 0 (rows) or 1 (columns).
inline constexpr int kNoPartition = -1;
int parse_partition_dim(std::string_view text);  // "none", "0", "1"

}  // namespace distmuon
