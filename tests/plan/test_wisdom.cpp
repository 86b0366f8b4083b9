// Wisdom files (wisdom.h): what is written is read back; entries of another host, profile or cost
// model are kept but not used; a damaged file is refused with its name and the problem.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "distmuon/error.h"
#include "distmuon/wisdom.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  TempDir() : path(fs::temp_directory_path() / ("distmuon-wisdom-" + std::to_string(getpid()))) {
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path path;
};

WisdomContext context() {
  return {{"node-a", "Test CPU", "Haswell", 1}, "none", "refined"};
}

AutoKey key(Index m, Index n) {
  return {.m = m, .n = n, .group_size = 2, .algorithm = NsAlgorithm::kAuto};
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
}

std::string load_error(const fs::path& p) {
  try {
    Wisdom::load(p, context());
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Wisdom, RoundTrip) {
  TempDir dir;
  const fs::path file = dir.path / "wisdom.json";
  Wisdom w(context());
  const std::vector<MeasuredCandidate> c = {
      {{TpMode::kDistributed, NsAlgorithm::kGram}, 0.0123},
      {{TpMode::kDuplicated, NsAlgorithm::kStandard}, 0.0456}};
  const std::vector<AutoKey> bucket = {key(64, 32), key(64, 32), key(32, 64)};
  const std::vector<MeasuredOwner> o = {
      {{NsAlgorithm::kGram, NsAlgorithm::kGram, NsAlgorithm::kStandard}, 0.25}};
  w.record(key(64, 32), c);
  w.record_owner(bucket, o);
  w.save(file);

  const Wisdom back = Wisdom::load(file, context());
  EXPECT_EQ(back.size(), 2u);
  EXPECT_EQ(back.foreign(), 0u);
  const auto* got = back.find(key(64, 32));
  ASSERT_NE(got, nullptr);
  ASSERT_EQ(got->size(), c.size());
  for (std::size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ((*got)[i].choice, c[i].choice);
    // Written in ms as JSON numbers (shortest round-trip form): read back to the last bit, up to
    // the ms <-> s scaling (one rounding each way).
    EXPECT_NEAR((*got)[i].seconds, c[i].seconds, 1e-15);
  }
  const auto* owner = back.find_owner(bucket);
  ASSERT_NE(owner, nullptr);
  ASSERT_EQ(owner->size(), 1u);
  EXPECT_EQ((*owner)[0].algorithms, o[0].algorithms);
  EXPECT_NEAR((*owner)[0].seconds, 0.25, 1e-15);
  // Another key, another bucket order: no hit.
  EXPECT_EQ(back.find(key(32, 64)), nullptr);
  const std::vector<AutoKey> other = {key(32, 64), key(64, 32), key(64, 32)};
  EXPECT_EQ(back.find_owner(other), nullptr);
}

TEST(Wisdom, AnotherHostProfileModelOrDeviceIsKeptButNotUsed) {
  TempDir dir;
  const fs::path file = dir.path / "wisdom.json";
  WisdomContext host = context(), profile = context(), model = context(), device = context();
  host.host.blas_core = "SkylakeX";
  profile.profile = "h100";
  model.cost_model = "reference";
  device.device = "cuda:0-fp32";
  for (const WisdomContext& c : {host, profile, model, device}) {
    Wisdom w = Wisdom::load(file, c);
    w.record(key(64, 32), {{{TpMode::kDuplicated, NsAlgorithm::kStandard}, 0.01}});
    w.save(file);
  }
  Wisdom mine = Wisdom::load(file, context());
  EXPECT_EQ(mine.find(key(64, 32)), nullptr);
  EXPECT_EQ(mine.size(), 0u);
  ASSERT_EQ(mine.foreign(), 4u);
  EXPECT_NE(mine.foreign_reasons()[0].find("SkylakeX"), std::string::npos);
  EXPECT_NE(mine.foreign_reasons()[3].find("device cuda:0-fp32"), std::string::npos);
  // Writing this host's entry keeps the others.
  mine.record(key(64, 32), {{{TpMode::kDistributed, NsAlgorithm::kStandard}, 0.02}});
  mine.save(file);
  EXPECT_EQ(Wisdom::load(file, context()).foreign(), 4u);
  const Wisdom again = Wisdom::load(file, host);
  ASSERT_NE(again.find(key(64, 32)), nullptr);
  EXPECT_EQ(again.find(key(64, 32))->front().choice.mode, TpMode::kDuplicated);
}

TEST(Wisdom, MissingFileIsEmpty) {
  TempDir dir;
  const Wisdom w = Wisdom::load(dir.path / "none.json", context());
  EXPECT_EQ(w.size(), 0u);
}

TEST(Wisdom, DamagedFileIsRefusedNamingIt) {
  TempDir dir;
  const fs::path file = dir.path / "wisdom.json";
  Wisdom w(context());
  w.record(key(64, 32), {{{TpMode::kDistributed, NsAlgorithm::kGram}, 0.01}});
  w.save(file);
  std::ifstream in(file);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  write_text(file, good.substr(0, good.size() / 2));  // truncated
  std::string why = load_error(file);
  EXPECT_NE(why.find(file.string()), std::string::npos) << why;
  EXPECT_NE(why.find("not valid JSON"), std::string::npos) << why;

  write_text(file, R"({"format": "something else", "version": 1, "entries": []})");
  why = load_error(file);
  EXPECT_NE(why.find("not valid distmuon wisdom"), std::string::npos) << why;

  nlohmann::json j = nlohmann::json::parse(good);
  j["entries"][0]["candidates"][0]["ms"] = -1.0;
  write_text(file, j.dump());
  why = load_error(file);
  EXPECT_NE(why.find("not positive"), std::string::npos) << why;

  j = nlohmann::json::parse(good);
  j["entries"][0]["candidates"][0]["mode"] = "blockwise";
  write_text(file, j.dump());
  why = load_error(file);
  EXPECT_NE(why.find("blockwise"), std::string::npos) << why;

  j = nlohmann::json::parse(good);
  j["entries"][0].erase("key");
  write_text(file, j.dump());
  why = load_error(file);
  EXPECT_NE(why.find("exactly one of"), std::string::npos) << why;
  EXPECT_NE(why.find(file.string()), std::string::npos) << why;
}

// Every algorithm of an entry must be one its key allows ("auto" is never a timed algorithm);
// the reference model's standard fallback of a Gram-pinned key is allowed.
TEST(Wisdom, AlgorithmsTheKeyDoesNotAllowAreRefused) {
  TempDir dir;
  const fs::path file = dir.path / "wisdom.json";
  AutoKey standard = key(64, 32), gram = key(64, 32);
  standard.algorithm = NsAlgorithm::kStandard;
  gram.algorithm = NsAlgorithm::kGram;
  Wisdom w(context());
  w.record(standard, {{{TpMode::kDistributed, NsAlgorithm::kStandard}, 0.01}});
  w.record_owner(std::vector<AutoKey>{key(64, 32), standard},
                 {{{NsAlgorithm::kGram, NsAlgorithm::kStandard}, 0.02}});
  w.save(file);
  ASSERT_EQ(Wisdom::load(file, context()).size(), 2u);
  std::ifstream in(file);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const nlohmann::json doc = nlohmann::json::parse(good);
  const std::size_t key_entry = doc["entries"][0].contains("key") ? 0 : 1;
  const std::size_t owner_entry = 1 - key_entry;

  nlohmann::json j = doc;
  j["entries"][owner_entry]["owner"][0]["algorithms"][0] = "auto";
  write_text(file, j.dump());
  std::string why = load_error(file);
  EXPECT_NE(why.find("'auto'"), std::string::npos) << why;
  EXPECT_NE(why.find(file.string()), std::string::npos) << why;

  j = doc;
  j["entries"][owner_entry]["owner"][0]["algorithms"][1] = "gram";  // the standard-pinned weight
  write_text(file, j.dump());
  why = load_error(file);
  EXPECT_NE(why.find("owner run algorithm 'gram' of weight 1"), std::string::npos) << why;

  j = doc;
  j["entries"][key_entry]["candidates"][0]["algorithm"] = "gram";
  write_text(file, j.dump());
  why = load_error(file);
  EXPECT_NE(why.find("does not allow"), std::string::npos) << why;

  // Refused even in an entry of another context (it is kept and written back).
  j["entries"][key_entry]["host"]["hostname"] = "node-b";
  write_text(file, j.dump());
  why = load_error(file);
  EXPECT_NE(why.find("does not allow"), std::string::npos) << why;

  // The reference model times standard NS for a Gram-pinned key: allowed.
  WisdomContext reference = context();
  reference.cost_model = "reference";
  fs::remove(file);
  Wisdom r(reference);
  r.record(gram, {{{TpMode::kDuplicated, NsAlgorithm::kStandard}, 0.01}});
  r.save(file);
  EXPECT_NE(Wisdom::load(file, reference).find(gram), nullptr);
  EXPECT_EQ(Wisdom::load(file, context()).foreign(), 1u);
}

}  // namespace
}  // namespace distmuon
