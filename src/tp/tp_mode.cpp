#include "distmuon/tp_mode.h"

#include <fmt/format.h>

#include "distmuon/error.h"

namespace distmuon {

TpMode parse_tp_mode(std::string_view name) {
  if (name == "blockwise") return TpMode::kBlockwise;
  if (name == "duplicated") return TpMode::kDuplicated;
  if (name == "distributed") return TpMode::kDistributed;
  if (name == "auto") return TpMode::kAuto;
  if (name == "owner") return TpMode::kOwner;
  throw Error(fmt::format(
      "unknown tp_mode '{}'; valid: blockwise, duplicated, distributed, owner, auto", name));
}

const char* to_string(TpMode mode) {
  switch (mode) {
    case TpMode::kBlockwise:
      return "blockwise";
    case TpMode::kDuplicated:
      return "duplicated";
    case TpMode::kDistributed:
      return "distributed";
    case TpMode::kAuto:
      return "auto";
    case TpMode::kOwner:
      return "owner";
  }
  return "?";
}

int parse_partition_dim(std::string_view text) {
  if (text == "none" || text == "-1") return kNoPartition;
  if (text == "0") return 0;
  if (text == "1") return 1;
  throw Error(fmt::format("invalid partition dim '{}'; valid: none, 0, 1", text));
}

}  // namespace distmuon
