// A program outside the distmuon tree: orthogonalise a small matrix through the installed core
// package (distmuon::distmuon), and list the trainer's model through distmuon::train.
#include <distmuon/newton_schulz.h>
#include <distmuon/singular_values.h>
#include <distmuon/train_config.h>

#include <cstdio>

int main() {
  distmuon::Matrix g(4, 6);
  for (distmuon::Index i = 0; i < g.size(); ++i)
    g.data()[i] = static_cast<float>((i * 7) % 5) - 2.0f;
  const auto x = distmuon::newton_schulz(g.view(), {}, distmuon::cpu_compute());
  const auto sv = distmuon::singular_values(x.view());
  std::printf("sigma in [%.3f, %.3f]\n", sv.back(), sv.front());
  // The training model's Muon weights: input, fc1 and fc2 (docs/training.md).
  const auto weights = distmuon::charlm_muon_weights(distmuon::default_train_config().model);
  std::printf("train-default: %zu Muon weight shapes\n", weights.size());
  return sv.front() > 0.5 && sv.front() < 1.5 && weights.size() == 3 ? 0 : 1;
}
