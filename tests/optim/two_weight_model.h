#pragma once
// A small optimizer of two weights, this rank's shards: a 16 x 8 Muon weight "hidden.w" with its
// rows over the world (GTP) and a full 6 x 4 AdamW weight "embed" on every rank. For the tests
// that need a model to step, save and load rather than a particular layout.

#include <cstdint>

#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/muon.h"
#include "test_util.h"

namespace distmuon::test {

struct TwoWeightModel {
  Matrix hidden, embed;
  Muon opt;
  explicit TwoWeightModel(const Communicator& w, MuonOptions o = {.tp_mode = TpMode::kDuplicated})
      : hidden(random_matrix(16 / w.size(), 8, 10 + static_cast<std::uint64_t>(w.rank()))),
        embed(random_matrix(6, 4, 20)),
        opt(o, w, cpu_compute()) {
    opt.add_parameter({.name = "hidden.w",
                       .local = hidden.view(),
                       .rows = 16,
                       .cols = 8,
                       .gtp_sharded = w.size() > 1,
                       .gtp_group = w});
    opt.add_parameter({.name = "embed",
                       .local = embed.view(),
                       .rows = 6,
                       .cols = 4,
                       .role = ParamRole::kEmbedding});
  }
  // One step with the gradients of this rank's hidden shard and of the embedding.
  void step(const Matrix& gh, const Matrix& ge) {
    const ConstMatrixView grads[] = {gh.view(), ge.view()};
    opt.step(grads);
  }
};

}  // namespace distmuon::test
