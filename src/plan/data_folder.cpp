#include "plan/data_folder.h"

#include <fmt/format.h>

#include <cstdlib>
#include <vector>

#include "distmuon/error.h"

namespace distmuon::detail {

std::filesystem::path find_data_folder(const std::string& name,
                                       std::initializer_list<const char*> builtin) {
  std::vector<std::filesystem::path> candidates;
  if (const char* root = std::getenv("DISTMUON_DATA_DIR"); root && *root) {
    candidates.push_back(std::filesystem::path(root) / name);
  }
  candidates.insert(candidates.end(), builtin.begin(), builtin.end());
  std::string looked;
  for (const auto& dir : candidates) {
    std::error_code ec;
    if (std::filesystem::is_directory(dir, ec)) return dir;
    looked += (looked.empty() ? "" : ", ") + dir.string();
  }
  throw Error(fmt::format("no {} folder: none of {} exists (DISTMUON_DATA_DIR=DIR looks in DIR/{})",
                          name, looked, name));
}

}  // namespace distmuon::detail
