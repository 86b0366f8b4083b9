#include "train_test_util.h"

#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>

#include "distmuon/error.h"
#include "test_util.h"

namespace distmuon::test {

namespace fs = std::filesystem;
using nlohmann::json;

SharedDir::SharedDir(const std::string& name) {
  const std::string mine =
      (fs::temp_directory_path() /
       ("distmuon_" + name + "_" + std::to_string(static_cast<long>(::getpid()))))
          .string();
  path_ = world().broadcast_string(mine, 0);
  if (world().rank() == 0) fs::create_directories(path_);
  world().barrier();
}

SharedDir::~SharedDir() {
  world().barrier();
  if (world().rank() == 0) fs::remove_all(path_);
}

fs::path write_text(const fs::path& dir) {
  const fs::path file = dir / "text.txt";
  if (world().rank() == 0) {
    const std::string words[] = {"the ", "free ",   "software ", "licence ",
                                 "of ",  "copies ", "and ",      "program\n"};
    std::string t;
    for (std::uint32_t i = 0; t.size() < 20000; ++i)
      t += words[(i * 2654435761u >> 13) % 8];
    std::ofstream(file) << t;
  }
  world().barrier();
  return file;
}

TrainConfig tiny_config(const fs::path& text, int steps, const std::string& tp_mode,
                        const std::string& ns_algorithm) {
  return parse_train_config(
      json{{"model", {{"context", 8}, {"embed", 8}, {"hidden", 16}, {"ffn", 128}, {"layers", 2}}},
           {"data", {{"path", text.string()}}},
           {"train",
            {{"seed", 11},
             {"steps", steps},
             {"batch", 32},
             {"log_every", 1000},
             {"eval_every", 4},
             {"eval_windows", 256}}},
           {"optimizer", {{"tp_mode", tp_mode}, {"ns_algorithm", ns_algorithm}}}});
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const CollectiveError& e) {
    return e.what();
  } catch (const Error& e) {
    return std::string("(not collective) ") + e.what();
  }
  return "";
}

}  // namespace distmuon::test
