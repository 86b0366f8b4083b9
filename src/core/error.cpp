#include "distmuon/error.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace distmuon {

std::string ErrorScope::describe() const {
  if (every_rank) return "every rank";
  if (is_world()) return fmt::format("the world ({} ranks)", size);
  if (!ranks.empty() && world_size > 0)
    return fmt::format("rank{} {} of {}", ranks.size() == 1 ? "" : "s", fmt::join(ranks, ","),
                       world_size);
  if (size > 0) return fmt::format("a group of {}", size);
  return "a group of ranks not known";
}

}  // namespace distmuon

namespace distmuon::detail {

void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
  throw std::logic_error(fmt::format("distmuon internal error: {} ({}:{}): assertion '{}' failed",
                                     msg, file, line, expr));
}

}  // namespace distmuon::detail
