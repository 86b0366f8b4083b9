// Reading user-named JSON and text files (json_file.h) and MuonOptions from JSON: every error
// names the file or the option and what is wrong, in the user's terms, never a message of
// nlohmann::json or libstdc++.
#include "distmuon/json_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "distmuon/error.h"
#include "distmuon/muon.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void expect_clean(const std::string& message, const std::string& needle) {
  EXPECT_NE(message.find(needle), std::string::npos) << message;
  EXPECT_EQ(message.find("[json.exception"), std::string::npos) << message;
  EXPECT_EQ(message.find("basic_filebuf"), std::string::npos) << message;
}

TEST(JsonFile, FolderMissingAndGoodFiles) {
  const fs::path dir =
      fs::temp_directory_path() / ("distmuon_json_file_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "folder");
  expect_clean(error_of([&] { read_text_file(dir / "folder", "text data"); }),
               "text data '" + (dir / "folder").string() + "' is a directory, not a file");
  expect_clean(error_of([&] { read_json_file(dir / "missing.json", "train config"); }),
               "train config '" + (dir / "missing.json").string() + "' does not exist");
  std::ofstream(dir / "ok.json") << R"({"a": {"b": 1}, "c": [1, 2]})";
  EXPECT_EQ(read_json_file(dir / "ok.json", "x"), json::parse(R"({"a": {"b": 1}, "c": [1, 2]})"));
  fs::remove_all(dir);
}

TEST(JsonFile, DuplicateKeysAndSyntaxErrorsAreNamed) {
  expect_clean(error_of([] { parse_json_text(R"({"a": 1, "a": 2})", "cfg"); }),
               "cfg: key 'a' appears twice in one object");
  expect_clean(
      error_of([] { parse_json_text(R"({"o": {"k": 1, "x": {"k": 2}, "k": 3}})", "cfg"); }),
      "key 'k' appears twice");
  // The same key in different objects (siblings or nested) is no duplicate.
  EXPECT_NO_THROW(parse_json_text(R"({"a": {"k": 1}, "b": {"k": 2}, "k": {"k": 3}})", "cfg"));
  EXPECT_NO_THROW(parse_json_text(R"([{"k": 1}, {"k": 2}])", "cfg"));
  expect_clean(error_of([] { parse_json_text("{\"a\": 1,}", "cfg"); }),
               "cfg: not valid JSON: parse error at line 1, column 9");
  expect_clean(error_of([] { parse_json_text(R"({"lr": NaN})", "cfg"); }), "not valid JSON");
}

TEST(MuonOptionsJson, WrongTypesNameTheOptionAndTheType) {
  const auto with = [](const char* key, json value) {
    json j = MuonOptions{};
    j[key] = std::move(value);
    return error_of([&] { static_cast<void>(j.get<MuonOptions>()); });
  };
  expect_clean(with("lr", "0.1"), "Muon options: option 'lr' must be a number, got string \"0.1\"");
  expect_clean(with("nesterov", 1), "option 'nesterov' must be true or false, got number 1");
  expect_clean(with("steps", 2.5), "option 'steps' must be an integer from");
  expect_clean(with("steps", 4294967296), "option 'steps' must be an integer from");
  expect_clean(with("tp_mode", 3), "option 'tp_mode' must be a string");
  json j = MuonOptions{};
  j["adamw"]["eps"] = nullptr;
  expect_clean(error_of([&] { static_cast<void>(j.get<MuonOptions>()); }),
               "option 'adamw.eps' must be a number, got null");
  j = MuonOptions{};
  j.erase("momentum");
  expect_clean(error_of([&] { static_cast<void>(j.get<MuonOptions>()); }),
               "missing option 'momentum'");
  // A good object round-trips.
  MuonOptions o;
  o.lr = 0.25;
  o.steps = 7;
  const MuonOptions back = json(o).get<MuonOptions>();
  EXPECT_EQ(back.lr, 0.25);
  EXPECT_EQ(back.steps, 7);
}

}  // namespace
}  // namespace distmuon
