// Hardware profiles: the built-in registry, lookup by device name, JSON round trip and malformed
// files whose error names the field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "distmuon/error.h"
#include "distmuon/hardware_profile.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("distmuon-test-" + std::to_string(getpid()) + "-" + name);
}

fs::path write_temp(const std::string& name, const std::string& text) {
  const fs::path p = temp_path(name);
  std::ofstream(p) << text;
  return p;
}

// The error message of loading text as a profile file.
std::string load_error(const std::string& text) {
  const fs::path p = write_temp("bad.json", text);
  try {
    load_profile(p);
  } catch (const Error& e) {
    fs::remove(p);
    return e.what();
  }
  fs::remove(p);
  return "(no error)";
}

json valid_profile_json() {
  return json(*find_profile("h100"));
}

// The datasheet figures the registry must carry (dense bf16 TFLOP/s; NVLink and network GB/s per
// GPU one way; NVLink domain size).
TEST(Profiles, BuiltInRegistryCarriesTheDatasheetFigures) {
  struct Row {
    const char* name;
    double bf16, intra, inter;
    int domain;
  };
  const Row rows[] = {{"a100", 312, 300, 25, 8},     {"h100", 989, 450, 50, 8},
                      {"h200", 989, 450, 50, 8},     {"b200", 2250, 900, 50, 8},
                      {"gb200", 2500, 900, 100, 72}, {"gb200-cx7", 2500, 900, 50, 72},
                      {"gb300", 2500, 900, 100, 72}, {"mi300x", 1307, 448, 50, 8}};
  EXPECT_EQ(builtin_profiles().size(), std::size(rows));
  for (const auto& r : rows) {
    const auto p = find_profile(r.name);
    ASSERT_TRUE(p) << r.name;
    EXPECT_EQ(p->peak_tflops_bf16, r.bf16) << r.name;
    EXPECT_EQ(p->intra_domain_gbps, r.intra) << r.name;
    EXPECT_EQ(p->inter_domain_gbps, r.inter) << r.name;
    EXPECT_EQ(p->domain_size, r.domain) << r.name;
    EXPECT_GT(p->peak_tflops_fp32, 0) << r.name;
    // A few microseconds per ring step inside a domain, more across it; every figure is sourced.
    EXPECT_GT(p->intra_domain_latency_us, 0.5) << r.name;
    EXPECT_LT(p->intra_domain_latency_us, p->inter_domain_latency_us) << r.name;
    EXPECT_NE(p->source.find("datasheet"), std::string::npos) << r.name;
    EXPECT_NE(p->source.find("tuning.cc"), std::string::npos) << r.name;
  }
  EXPECT_EQ(find_profile("mi300x")->bandwidth_gbps(3, false), 128);  // (G - 1) x 64 inside the hive
}

TEST(Profiles, LookupByDeviceNameSubstring) {
  EXPECT_EQ(find_profile("NVIDIA GB200")->name, "gb200");   // not b200, although it contains it
  EXPECT_EQ(find_profile("GB200 CX7")->name, "gb200-cx7");  // the longest contained name wins
  EXPECT_EQ(find_profile("NVIDIA B200")->name, "b200");
  EXPECT_EQ(find_profile("NVIDIA H100 80GB HBM3")->name, "h100");
  EXPECT_EQ(find_profile("NVIDIA A100-SXM4-80GB")->name, "a100");
  EXPECT_EQ(find_profile("AMD Instinct MI300X")->name, "mi300x");
  EXPECT_EQ(find_profile("GB300")->name, "gb300");
  EXPECT_EQ(find_profile("mi300")->name, "mi300x");  // contained in exactly one name
  EXPECT_FALSE(find_profile("NVIDIA V100"));
  EXPECT_FALSE(find_profile("h"));  // contained in several names: ambiguous
  EXPECT_FALSE(resolve_profile("none"));
  try {
    resolve_profile("tpu-v5");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gb200"), std::string::npos)
        << e.what();  // lists the valid names
  }
}

TEST(Profiles, JsonRoundTrip) {
  for (const auto& p : builtin_profiles()) {
    const fs::path file = temp_path(p.name + ".json");
    save_profile(p, file);
    EXPECT_EQ(load_profile(file), p);
    EXPECT_EQ(resolve_profile(file.string()), p);  // a file is a profile spec too
    fs::remove(file);
  }
  // A measured profile with a mesh and a custom name survives too.
  HardwareProfile custom = *find_profile("mi300x");
  custom.name = "my-cluster";
  custom.intra_domain_latency_us = 1.25;
  EXPECT_EQ(json(custom).get<HardwareProfile>(), custom);
}

TEST(Profiles, MalformedFilesNameTheField) {
  json j = valid_profile_json();
  j.erase("inter_domain_gbps");
  EXPECT_NE(load_error(j.dump()).find("'inter_domain_gbps'"), std::string::npos);

  j = valid_profile_json();
  j["domain_size"] = "eight";
  EXPECT_NE(load_error(j.dump()).find("'domain_size'"), std::string::npos);

  j = valid_profile_json();
  j["peak_tflops"].erase("fp32");
  const std::string peak = load_error(j.dump());
  EXPECT_NE(peak.find("'fp32'"), std::string::npos) << peak;
  EXPECT_NE(peak.find("peak_tflops"), std::string::npos) << peak;

  j = valid_profile_json();
  j["intra_domain_gbps"] = -1;
  EXPECT_NE(load_error(j.dump()).find("'intra_domain_gbps'"), std::string::npos);

  const std::string syntax = load_error("{\"name\": \"x\",");
  EXPECT_NE(syntax.find("invalid JSON"), std::string::npos) << syntax;
  EXPECT_NE(syntax.find("bad.json"), std::string::npos) << syntax;  // names the file
  EXPECT_THROW(load_profile(temp_path("does-not-exist.json")), Error);
}

}  // namespace
}  // namespace distmuon
