// Where the data folders that ship with distmuon (hardware profiles, model presets) are found.
#pragma once

#include <filesystem>
#include <initializer_list>
#include <string>

namespace distmuon::detail {

// The first existing folder of: $DISTMUON_DATA_DIR/<name> (set by the Python package to the copy
// inside its wheel, or by a user who moved the data), then `builtin` in order (the source tree's
// folder, then the installed one). Throws Error naming every place looked at when none exists.
std::filesystem::path find_data_folder(const std::string& name,
                                       std::initializer_list<const char*> builtin);

}  // namespace distmuon::detail
