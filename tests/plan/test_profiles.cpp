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
  EXPECT_NE(syntax.find("not valid JSON"), std::string::npos) << syntax;
  EXPECT_NE(syntax.find("bad.json"), std::string::npos) << syntax;  // names the file
  EXPECT_THROW(load_profile(temp_path("does-not-exist.json")), Error);
}

// Every numeric field within its bounds (ProfileBounds): integers that are integers and fit, rates
// and bandwidths finite and > 0, latencies finite and >= 0, none absurdly large or small.
TEST(Profiles, ValuesOutsideTheirBoundsAreRefused) {
  const auto refused = [](const json& j, const std::string& needle) {
    const std::string e = load_error(j.dump());
    EXPECT_NE(e.find(needle), std::string::npos) << j.dump() << "\n" << e;
  };
  json j = valid_profile_json();
  j["domain_size"] = 2147483648LL;  // 2^31: get<int>() wrapped it to a negative number
  refused(j, "'domain_size' must be an integer in [-2147483648, 2147483647], got 2147483648");
  j["domain_size"] = 1.5;  // get<int>() truncated it to 1
  refused(j, "'domain_size' must be an integer in");
  j["domain_size"] = (1 << 20) + 1;
  refused(j, "'domain_size' must be in [1, 1048576], got 1048577");
  j = valid_profile_json();
  j["intra_domain_gbps"] = 1e-300;
  refused(j, "'intra_domain_gbps' is 1e-300, outside the plausible range [1e-06, 1000000] GB/s");
  j = valid_profile_json();
  j["inter_domain_gbps"] = 1e300;
  refused(j, "'inter_domain_gbps' is 1e+300, outside");
  j = valid_profile_json();
  j["peak_tflops"]["bf16"] = 2e6;
  refused(j, "'peak_tflops.bf16' is 2000000, outside the plausible range [1e-06, 1000000] TFLOP/s");
  j = valid_profile_json();
  j["intra_domain_latency_us"] = -1;
  refused(j, "'intra_domain_latency_us' is -1, outside");
  j = valid_profile_json();
  j["inter_domain_latency_us"] = 1e8;
  refused(j, "'inter_domain_latency_us' is 100000000, outside");
  j = valid_profile_json();
  j["intra_domain_peer_gbps"] = -64;
  refused(j, "'intra_domain_peer_gbps' must be > 0");
  // The bounds themselves are accepted, and so is every built-in profile (loaded at start).
  j = valid_profile_json();
  j["domain_size"] = 1 << 20;
  j["intra_domain_gbps"] = 1e-6;
  j["inter_domain_latency_us"] = 1e7;
  EXPECT_EQ(load_error(j.dump()), "(no error)");
  EXPECT_EQ(builtin_profiles().size(), 8u);
}

// --profile SPEC: an existing file, or a path that must exist, or a built-in name matched exactly
// (case aside); a part of several names is ambiguous, a near miss is named but not taken.
TEST(Profiles, SpecIsAFileOrAnExactName) {
  const auto error_of = [](const std::string& spec) {
    try {
      const auto p = resolve_profile(spec);
      return "(resolved to " + (p ? p->name : std::string("none")) + ")";
    } catch (const Error& e) {
      return std::string(e.what());
    }
  };
  const auto refused = [&](const std::string& spec, const std::string& needle) {
    const std::string e = error_of(spec);
    EXPECT_NE(e.find(needle), std::string::npos) << spec << ": " << e;
    EXPECT_EQ(e.find("(resolved"), std::string::npos) << spec << ": " << e;
  };
  // A missing file whose name contains a built-in name no longer falls back to it.
  refused("./h100-tuned.json", "hardware profile file './h100-tuned.json' does not exist");
  refused(temp_path("missing").string(), "does not exist");
  refused("h100.json", "does not exist");
  refused("/tmp", "does not exist as a regular file");
  refused("h1000", "unknown hardware profile 'h1000' (did you mean 'h100'?)");
  refused("NVIDIA H100", "did you mean 'h100'?");
  refused("mi300", "did you mean 'mi300x'?");
  refused("gb2", "ambiguous hardware profile name 'gb2': it is part of gb200, gb200-cx7");
  refused("h", "ambiguous");
  refused("tpu-v5", "no built-in profile has that name");
  EXPECT_EQ(error_of("h100"), "(resolved to h100)");
  EXPECT_EQ(error_of("H100"), "(resolved to h100)");
  EXPECT_EQ(error_of("gb200"), "(resolved to gb200)");
  EXPECT_EQ(error_of("gb200-cx7"), "(resolved to gb200-cx7)");
  EXPECT_EQ(error_of("none"), "(resolved to none)");
}

}  // namespace
}  // namespace distmuon
