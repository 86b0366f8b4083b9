// The enum name tables (src/core/enum_names.h): every table round-trips through name_of and
// parse_enum, names are unique, and an unknown name's error lists every valid name.
#include "comm/comm_names.h"
#include "compute/precision_names.h"
#include "ns/ns_names.h"
#include "optim/muon_names.h"
#include "plan/plan_names.h"
#include "timing/timing_names.h"
#include "tp/tp_mode_names.h"
#include "train/train_names.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <type_traits>

namespace distmuon {
namespace {

// A table names each value of E exactly once: E's values are 0..N-1 (none of the enums sets
// explicit values), so a table of N distinct values in that range holds them all.
template <typename E>
void expect_table_complete_and_round_trips(const char* what) {
  SCOPED_TRACE(what);
  const auto& table = detail::kEnumNames<E>;
  std::set<int> values;
  std::set<std::string> names;
  for (const auto& e : table) {
    const auto v = static_cast<int>(static_cast<std::underlying_type_t<E>>(e.value));
    EXPECT_GE(v, 0);
    EXPECT_LT(v, static_cast<int>(table.size()));
    values.insert(v);
    names.insert(e.name);
    EXPECT_STREQ(detail::name_of(e.value), e.name);
    EXPECT_EQ(detail::parse_enum<E>(e.name, what), e.value);
  }
  EXPECT_EQ(values.size(), table.size()) << "a value named twice";
  EXPECT_EQ(names.size(), table.size()) << "a name used twice";
  // A value outside the table (a cast from a corrupt integer) is "?", not a crash.
  EXPECT_STREQ(detail::name_of(static_cast<E>(table.size())), "?");

  try {
    detail::parse_enum<E>("bogus", what);
    ADD_FAILURE() << "parse_enum accepted 'bogus'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(fmt::format("unknown {} 'bogus'; valid: ", what)), std::string::npos) << msg;
    for (const auto& n : table)
      EXPECT_NE(msg.find(n.name), std::string::npos) << msg << " lacks " << n.name;
    EXPECT_NE(msg.find(detail::enum_name_list<E>()), std::string::npos) << msg;
  }
  EXPECT_FALSE(detail::find_enum<E>("").has_value());
  // Names are matched exactly: no case folding, no prefix.
  EXPECT_FALSE(detail::find_enum<E>(std::string(table[0].name) + "x").has_value());
}

TEST(EnumNames, EveryTableRoundTrips) {
  expect_table_complete_and_round_trips<TpMode>("tp_mode");
  expect_table_complete_and_round_trips<NsAlgorithm>("Newton-Schulz algorithm");
  expect_table_complete_and_round_trips<Precision>("precision");
  expect_table_complete_and_round_trips<PlanMode>("plan mode");
  expect_table_complete_and_round_trips<CostModel>("cost model");
  expect_table_complete_and_round_trips<WeightDecayMethod>("weight decay method");
  expect_table_complete_and_round_trips<ScaleMode>("scale mode");
  expect_table_complete_and_round_trips<ReplicaMode>("replica mode");
  expect_table_complete_and_round_trips<ParamRole>("parameter role");
  expect_table_complete_and_round_trips<ParamKind>("parameter kind");
  expect_table_complete_and_round_trips<CollectiveKind>("collective");
  expect_table_complete_and_round_trips<Split>("split");
  expect_table_complete_and_round_trips<DType>("dtype");
  expect_table_complete_and_round_trips<ReduceOp>("reduce op");
}

TEST(EnumNames, NameListIsTableOrder) {
  EXPECT_EQ(detail::enum_name_list<TpMode>(), "blockwise, duplicated, distributed, owner, auto");
  EXPECT_EQ(detail::enum_name_list<CostModel>(), "refined, reference");
  EXPECT_STREQ(precision_names(), "fp32, tf32, bf16");
}

// The public parse functions and to_string are the tables' (their names and their errors).
TEST(EnumNames, PublicParseAndToStringUseTheTables) {
  for (const auto& e : detail::kEnumNames<TpMode>) {
    EXPECT_EQ(parse_tp_mode(e.name), e.value);
    EXPECT_STREQ(to_string(e.value), e.name);
  }
  for (const auto& e : detail::kEnumNames<ParamRole>) {
    EXPECT_EQ(parse_param_role(e.name), e.value);
    EXPECT_STREQ(to_string(e.value), e.name);
  }
  for (const auto& e : detail::kEnumNames<DType>)
    EXPECT_STREQ(dtype_name(e.value), e.name);
  try {
    parse_tp_mode("bogus");
    ADD_FAILURE() << "parse_tp_mode accepted 'bogus'";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "unknown tp_mode 'bogus'; valid: blockwise, duplicated, distributed, owner, auto");
  }
  try {
    parse_param_role("head");
    ADD_FAILURE() << "parse_param_role accepted 'head'";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "unknown parameter role 'head'; valid: hidden, embedding, output_head, other");
  }
  // MuonOptions::validate lists the cost models from the same table.
  MuonOptions o;
  o.cost_model = "fancy";
  try {
    o.validate();
    ADD_FAILURE() << "validate accepted cost_model fancy";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("cost_model = fancy is invalid; valid: refined, reference"),
        std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace distmuon
