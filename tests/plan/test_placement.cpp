// Placements: the --parallel spec, Megatron's rank order, the layers of each pipeline rank and
// each rank's weights (shards, experts, replicas, domain crossings), checked against cases
// worked out by hand.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "distmuon/error.h"
#include "distmuon/placement.h"

namespace distmuon {
namespace {

std::string error_of(const auto& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Placement, ParsesMegatronNames) {
  const Parallelism p = parse_parallelism("pp=4,vpp=4,ep=64,etp=1,dp=64");
  EXPECT_EQ(p.world(), 256);
  EXPECT_EQ(p.tp, 1);
  EXPECT_EQ(p.expert_tp(), 1);
  EXPECT_EQ(p.expert_dp(), 1);  // 256 / (etp 1 x ep 64 x pp 4)
  EXPECT_EQ(p.describe(), "pp=4 vpp=4 ep=64 etp=1 dp=64");
  const Parallelism q = parse_parallelism("dp=16,tp=2,gtp=8,ep=8,egtp=2");
  EXPECT_EQ(q.world(), 32);
  EXPECT_EQ(q.expert_tp(), 2);  // etp defaults to tp
  EXPECT_EQ(q.expert_dp(), 2);
  EXPECT_NE(error_of([] { parse_parallelism("tp=0"); }).find("tp=0"), std::string::npos);
  EXPECT_NE(error_of([] { parse_parallelism("tp=2,tp=4"); }).find("twice"), std::string::npos);
  EXPECT_NE(error_of([] { parse_parallelism("xp=2"); }).find("'xp'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_parallelism("tp"); }).find("name=value"), std::string::npos);
  EXPECT_NE(error_of([] { parse_parallelism("tp=2x"); }).find("whole number"), std::string::npos);
  EXPECT_EQ(parse_optimizer_sharding("zero1"), OptimizerSharding::kZero1);
  EXPECT_THROW(parse_optimizer_sharding("zero3"), Error);
}

// A 4-layer MoE model: qkv (column), o (row), a router (replicated over TP) in layers 1-3, and 8
// experts per MoE layer of fc1 (column) and fc2 (row).
std::vector<LayeredWeight> tiny_moe() {
  return {{"attn.qkv", 96, 32, 0, 4, 0, TpSplit::kColumn},
          {"attn.o", 32, 64, 0, 4, 0, TpSplit::kRow},
          {"router", 8, 32, 1, 3, 0, TpSplit::kReplicated},
          {"expert.fc1", 16, 32, 1, 3, 8, TpSplit::kColumn},
          {"expert.fc2", 32, 8, 1, 3, 8, TpSplit::kRow}};
}

TEST(Placement, RankFiveOfEightHoldsWhatMegatronGivesIt) {
  // tp 2, pp 2, dp 2 (8 ranks); experts: ep 4, etp 1, so edp = 8 / (1 x 4 x 2) = 1. NVLink
  // domains of 2 ranks.
  const Placement pl(tiny_moe(), parse_parallelism("tp=2,pp=2,dp=2,ep=4,etp=1"), 2);
  // Rank 5 = tp 1 + 2 (cp 0 + 1 (dp 0 + 2 pp 1)); experts: 5 = etp 0 + 1 (ep 1 + 4 (edp 0 + pp 1)).
  const RankCoords c = pl.coords(5);
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.dp, 0);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(c.ep, 1);
  EXPECT_EQ(c.edp, 0);
  // 4 layers over 2 stages: layers 0-1 on pipeline rank 0, 2-3 on 1.
  EXPECT_EQ(pl.stage_layers(1), (std::vector<Index>{2, 3}));
  EXPECT_EQ(pl.shard_group(5, false), (std::vector<int>{4, 5}));                // tp 0 and 1
  EXPECT_EQ(pl.replica_group(5, false), (std::vector<int>{5, 7}));              // dp 0 and 1
  EXPECT_EQ(pl.replica_group(5, false, true), (std::vector<int>{4, 5, 6, 7}));  // and tp
  EXPECT_EQ(pl.shard_group(5, true), (std::vector<int>{5}));
  EXPECT_EQ(pl.replica_group(5, true), (std::vector<int>{5}));
  EXPECT_FALSE(pl.crosses_domain({4, 5}));  // domain 2
  EXPECT_TRUE(pl.crosses_domain({5, 7}));   // domains 2 and 3

  const std::vector<HeldWeight> held = pl.rank_weights(5);
  ASSERT_EQ(held.size(), 10u);  // 2 layers x (qkv, o, router, expert fc1, expert fc2)
  // name, layer, first expert, experts, m, n, tp, tp_dim, gtp, shard m x n, replicas, crossings
  const HeldWeight want[] = {
      {"attn.qkv", 2, 0, 0, 96, 32, 2, 0, 1, 48, 32, 2, false, true},
      {"attn.o", 2, 0, 0, 32, 64, 2, 1, 1, 32, 32, 2, false, true},
      {"router", 2, 0, 0, 8, 32, 1, 0, 1, 8, 32, 4, false, true},
      {"expert.fc1", 2, 2, 2, 16, 32, 1, 0, 1, 16, 32, 1, false, false},
      {"expert.fc2", 2, 2, 2, 32, 8, 1, 1, 1, 32, 8, 1, false, false},
  };
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(held[i], want[i]) << i;
    HeldWeight next = want[i];
    next.layer = 3;
    EXPECT_EQ(held[i + 5], next) << i;
  }
  // Rank 0 holds layers 0-1: no router or experts in layer 0.
  const std::vector<HeldWeight> first = pl.rank_weights(0);
  ASSERT_EQ(first.size(), 7u);
  EXPECT_EQ(first[0].name, "attn.qkv");
  EXPECT_EQ(first[2].name, "attn.qkv");
  EXPECT_EQ(first[2].layer, 1);
  EXPECT_EQ(first[5].first_expert, 0);  // ep 0: experts 0-1
}

TEST(Placement, GtpSplitsRowsInsideTheDataParallelGroup) {
  // dp 4 with gtp 2: two replicas of a 2-way row split; 10 rows pad to 5 per rank.
  const Placement pl({{"mlp.fc1", 10, 6, 0, 1, 0, TpSplit::kColumn}},
                     parse_parallelism("dp=4,gtp=2"), 8);
  EXPECT_EQ(pl.coords(3).gtp, 1);
  EXPECT_EQ(pl.shard_group(3, false), (std::vector<int>{2, 3}));
  EXPECT_EQ(pl.replica_group(3, false), (std::vector<int>{1, 3}));
  const HeldWeight w = pl.rank_weights(3).at(0);
  EXPECT_EQ(w.shard_m, 5);
  EXPECT_EQ(w.shard_n, 6);
  EXPECT_EQ(w.gtp, 2);
  EXPECT_EQ(w.replicas, 2);
}

TEST(Placement, VirtualStagesInterleaveLayers) {
  // 10 layers, pp 2 x vpp 2 = 4 virtual stages of 3, 3, 2, 2 layers: stages 0 and 2 on pipeline
  // rank 0 (layers 0-2 and 6-7), 1 and 3 on rank 1 (3-5 and 8-9).
  const Placement pl({{"attn.qkv", 8, 8, 0, 10, 0, TpSplit::kColumn}},
                     parse_parallelism("pp=2,vpp=2"), 8);
  EXPECT_EQ(pl.stage_layers(0), (std::vector<Index>{0, 1, 2, 6, 7}));
  EXPECT_EQ(pl.stage_layers(1), (std::vector<Index>{3, 4, 5, 8, 9}));
  EXPECT_EQ(pl.stage_of_layer(8), 1);
}

TEST(Placement, KimiK2OnTheNvidiaPlacement) {
  const Placement pl(layered_weights(resolve_model("kimi-k2")),
                     parse_parallelism("pp=4,vpp=4,ep=64,etp=1,dp=64"), 72);
  EXPECT_EQ(pl.world(), 256);
  // 61 layers over 16 virtual stages: 13 of 4 and 3 of 3; pipeline rank 0 has stages 0, 4, 8,
  // 12 (16 layers, the dense layer 0 among them), the others 15.
  EXPECT_EQ(pl.stage_layers(0).size(), 16u);
  EXPECT_EQ(pl.stage_layers(3).size(), 15u);
  const std::vector<HeldWeight> held = pl.rank_weights(70);  // pp 1, ep 6
  Index experts = 0;
  for (const HeldWeight& w : held) {
    if (w.name == "expert.fc1") {
      EXPECT_EQ(w.experts, 6);  // 384 / 64
      EXPECT_EQ(w.first_expert, 36);
      EXPECT_EQ(w.replicas, 1);
      experts += w.experts;
    }
    if (w.name == "attn.o") {
      EXPECT_EQ(w.replicas, 64);
      EXPECT_TRUE(w.replicas_cross);  // ranks 64-127 span domains 0 and 1
    }
  }
  EXPECT_EQ(experts, 15 * 6);
}

TEST(Placement, RefusesWhatDoesNotFit) {
  const auto make = [](const char* spec) {
    return error_of([&] { Placement(tiny_moe(), parse_parallelism(spec), 8); });
  };
  EXPECT_NE(make("ep=3,dp=3").find("ep=3 does not divide the 8 experts"), std::string::npos);
  EXPECT_NE(make("pp=5,dp=1").find("5 stages for 4 layers"), std::string::npos);
  EXPECT_NE(make("dp=4,gtp=3").find("gtp=3"), std::string::npos);
  EXPECT_NE(make("dp=2,ep=4").find("does not divide the 2 ranks"), std::string::npos);
  EXPECT_NE(error_of([] {
              Placement({{"attn.qkv", 8, 8, 0, 1, 0, TpSplit::kColumn}},
                        parse_parallelism("ep=2,dp=2"), 8);
            }).find("need a model with experts"),
            std::string::npos);
}

}  // namespace
}  // namespace distmuon
