#include "distmuon/tp_mode.h"

#include <fmt/format.h>

#include "distmuon/error.h"
#include "tp/tp_mode_names.h"

namespace distmuon {

TpMode parse_tp_mode(std::string_view name) {
  return detail::parse_enum<TpMode>(name, "tp_mode");
}

const char* to_string(TpMode mode) {
  return detail::name_of(mode);
}

int parse_partition_dim(std::string_view text) {
  if (text == "none" || text == "-1") return kNoPartition;
  if (text == "0") return 0;
  if (text == "1") return 1;
  throw Error(fmt::format("invalid partition dim '{}'; valid: none, 0, 1", text));
}

}  // namespace distmuon
