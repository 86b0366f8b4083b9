// Every built-in coefficient table equals the published values, and schedules extend as specified.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "distmuon/error.h"
#include "distmuon/newton_schulz.h"

namespace distmuon {
namespace {

using Table = std::vector<NsCoefficients>;

TEST(Coefficients, TablesMatchSpecification) {
  EXPECT_EQ(coefficient_set("simple").table, (Table{{3.4445, -4.7750, 2.0315}}));
  EXPECT_EQ(coefficient_set("quintic").table, (Table{{4.0848, -6.8946, 2.9270},
                                                     {3.9505, -6.3029, 2.6377},
                                                     {3.7418, -5.5913, 2.3037},
                                                     {2.8769, -3.1427, 1.2046},
                                                     {2.8366, -3.0525, 1.2012}}));
  EXPECT_EQ(coefficient_set("polar_express").table, (Table{{8.2051, -22.9019, 16.4607},
                                                           {4.0664, -2.8612, 0.5184},
                                                           {3.9096, -2.8234, 0.5250},
                                                           {3.2856, -2.4153, 0.4853},
                                                           {2.2779, -1.6198, 0.3985},
                                                           {1.8726, -1.2307, 0.3585},
                                                           {1.8564, -1.2132, 0.3568},
                                                           {1.8750, -1.2500, 0.3750}}));
  EXPECT_EQ(coefficient_set("cans").table, (Table{{8.4703, -25.1081, 18.6293},
                                                  {4.1828, -3.1087, 0.5806},
                                                  {3.9619, -2.9541, 0.5630},
                                                  {3.2866, -2.4647, 0.5074},
                                                  {2.2737, -1.6447, 0.4162}}));
  // Turbo-Muon's (flash-newton-schulz newton_schulz_triton.py, commit cdb03db).
  EXPECT_EQ(coefficient_set("aol").table, (Table{{4.6051, -9.6552, 5.6769},
                                                 {4.7505, -6.0861, 2.1790},
                                                 {2.7763, -2.3190, 0.5523},
                                                 {2.4231, -2.2861, 0.8193}}));
  Table ds(8, {3.4445, -4.7750, 2.0315});
  ds.push_back({2.0, -1.5, 0.5});
  ds.push_back({2.0, -1.5, 0.5});
  EXPECT_EQ(coefficient_set("deepseekv4").table, ds);
  EXPECT_EQ(coefficient_set("cubic5").table, (Table{{3.3656576, -3.3420992, 0},
                                                    {2.5744352, -1.4957376, 0},
                                                    {2.5368962, -1.4312570, 0},
                                                    {2.4418906, -1.2764040, 0},
                                                    {2.2230472, -0.9630650, 0}}));
}

TEST(Coefficients, TailRules) {
  // polar_express, cans and deepseekv4 repeat their last tuple; the others cycle.
  for (const char* name : {"polar_express", "cans", "deepseekv4"}) {
    const auto& s = coefficient_set(name);
    EXPECT_EQ(s.at(static_cast<int>(s.table.size()) + 3), s.table.back()) << name;
  }
  for (const char* name : {"simple", "quintic", "aol"}) {
    const auto& s = coefficient_set(name);
    const int n = static_cast<int>(s.table.size());
    EXPECT_EQ(s.at(n), s.table[0]) << name;
    EXPECT_EQ(s.at(n + 1), s.table[1 % n]) << name;
  }
  const auto custom = parse_custom_coefficients("1,2,3; 4,5,6");
  EXPECT_EQ(custom.at(2), (NsCoefficients{1, 2, 3}));
}

TEST(Coefficients, InvalidNamesAndStepsListValidValues) {
  try {
    coefficient_set("nope");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& n : coefficient_set_names())
      EXPECT_NE(msg.find(n), std::string::npos) << msg;
  }
  NsOptions o;
  o.steps = 0;
  EXPECT_THROW(o.validate(), Error);
  o.coefficients = coefficient_set("cubic5");
  o.steps = 4;
  EXPECT_THROW(o.validate(), Error);
  o.steps = 5;
  EXPECT_NO_THROW(o.validate());
  EXPECT_THROW(parse_custom_coefficients("1,2"), Error);
  EXPECT_THROW(parse_custom_coefficients("1,2,x"), Error);
}

// Non-finite coefficients (std::from_chars reads "nan" and "inf") and absurd magnitudes make the
// iterate NaN or Inf: refused by name, for a parsed schedule, a table and hand-made options.
TEST(Coefficients, NonFiniteAndAbsurdValuesAreRefused) {
  const auto error_of = [](const std::string& text) {
    try {
      parse_custom_coefficients(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(error_of("nan,1,1").find("a = nan"), std::string::npos) << error_of("nan,1,1");
  EXPECT_NE(error_of("1,2,3;1,-inf,1").find("tuple 2"), std::string::npos)
      << error_of("1,2,3;1,-inf,1");
  EXPECT_NE(error_of("1,1,1e30").find("c = 1e+30"), std::string::npos) << error_of("1,1,1e30");
  EXPECT_NE(error_of("1,-1000.5,1").find("at most 1000"), std::string::npos);
  // The bound itself and every built-in set are accepted.
  EXPECT_EQ(parse_custom_coefficients("1000,-1000,0").table.size(), 1u);
  for (const auto& name : coefficient_set_names())
    if (name != "custom") EXPECT_NO_THROW(coefficient_set(name).validate_values()) << name;
  EXPECT_THROW(custom_coefficients({{1, 2, std::numeric_limits<double>::infinity()}}), Error);
  NsOptions o;
  o.coefficients.table[0].b = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(o.validate(), Error);
}

}  // namespace
}  // namespace distmuon
