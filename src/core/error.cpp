#include "distmuon/error.h"

#include <fmt/format.h>

namespace distmuon::detail {

void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
  throw std::logic_error(fmt::format("distmuon internal error: {} ({}:{}): assertion '{}' failed",
                                     msg, file, line, expr));
}

}  // namespace distmuon::detail
