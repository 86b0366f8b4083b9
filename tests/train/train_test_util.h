#pragma once
// Shared by the trainer tests: a folder every rank sees, a small text, a tiny training config and
// the message of a collective error.

#include <filesystem>
#include <functional>
#include <string>

#include "distmuon/train_config.h"

namespace distmuon::test {

// A folder every rank sees (named after rank 0's pid), removed at the end. Collective.
class SharedDir {
 public:
  explicit SharedDir(const std::string& name);
  ~SharedDir();
  SharedDir(const SharedDir&) = delete;
  SharedDir& operator=(const SharedDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Words in a pseudo-random order (as in test_sharded_training), written by rank 0 into
// dir/text.txt. Collective.
std::filesystem::path write_text(const std::filesystem::path& dir);

// Small enough for a step in about a millisecond; at 2 and 4 ranks the cost model (FLOPs, no
// profile) picks distributed for fc1 (128 x 16: the Gram is 16 x 16 over a quarter or half of the
// rows) and duplicated for the input projection (16 x 64) and fc2 (16 x 128).
TrainConfig tiny_config(const std::filesystem::path& text, int steps,
                        const std::string& tp_mode = "auto",
                        const std::string& ns_algorithm = "standard");

// The message of the CollectiveError f throws ("(not collective) ..." for another Error, "" when
// it throws nothing).
std::string error_of(const std::function<void()>& f);

}  // namespace distmuon::test
