// The C++ side of the Python <-> C++ checkpoint tests (test_checkpoint.py mirrors it in Python).
//   checkpoint_peer write DIR OUT   3 steps, Muon::save(DIR) with the weights (DIR/weight-*.npy),
//                                   2 more steps, final weights to OUT/weight-*.npy
//   checkpoint_peer resume DIR OUT  weights from DIR/weight-*.npy, Muon::load(DIR), steps 4 and 5,
//                                   final weights to OUT/weight-*.npy
// Weights and gradients are small integers over powers of two: exact in float32 in both languages.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "distmuon/error.h"
#include "distmuon/muon.h"
#include "distmuon/npy.h"

using namespace distmuon;

namespace {

struct Weight {
  std::string name;
  Index rows, cols;
  ParamRole role;
};
const std::vector<Weight> kWeights = {{"a", 24, 16, ParamRole::kHidden},
                                      {"b", 16, 1, ParamRole::kOther}};

Matrix initial(const Weight& w) {
  Matrix m(w.rows, w.cols);
  for (Index i = 0; i < w.rows; ++i)
    for (Index j = 0; j < w.cols; ++j)
      m(i, j) = static_cast<float>((i * 7 + j * 13) % 17 - 8) / 8.0f;
  return m;
}

Matrix gradient(const Weight& w, int step) {
  Matrix m(w.rows, w.cols);
  for (Index i = 0; i < w.rows; ++i)
    for (Index j = 0; j < w.cols; ++j)
      m(i, j) = static_cast<float>((i * 5 + j * 3 + step * 11) % 19 - 9) / 16.0f;
  return m;
}

void run_steps(Muon& opt, int first, int last) {
  for (int s = first; s <= last; ++s) {
    std::vector<Matrix> g;
    std::vector<ConstMatrixView> views;
    for (const Weight& w : kWeights)
      g.push_back(gradient(w, s));
    for (const Matrix& m : g)
      views.push_back(m.view());
    opt.step(views);
  }
}

MuonOptions options() {
  MuonOptions o;
  o.lr = 0.02;
  o.weight_decay = 0.01;
  o.tp_mode = TpMode::kDuplicated;
  o.adamw.lr = 0.01;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc != 4) throw Error("usage: checkpoint_peer write|resume DIR OUT");
    const std::string cmd = argv[1];
    const std::filesystem::path dir = argv[2], out = argv[3];
    std::vector<Matrix> weights;
    for (const Weight& w : kWeights)
      weights.push_back(cmd == "resume" ? read_npy(dir / ("weight-" + w.name + ".npy"))
                                        : initial(w));
    Muon opt(options(), local_communicator(), cpu_compute());
    for (std::size_t k = 0; k < kWeights.size(); ++k) {
      opt.add_parameter({.name = kWeights[k].name,
                         .local = weights[k].view(),
                         .rows = kWeights[k].rows,
                         .cols = kWeights[k].cols,
                         .role = kWeights[k].role});
    }
    if (cmd == "write") {
      run_steps(opt, 1, 3);
      opt.save(dir);
      for (std::size_t k = 0; k < kWeights.size(); ++k)
        write_npy(dir / ("weight-" + kWeights[k].name + ".npy"), weights[k].view());
    } else if (cmd == "resume") {
      opt.load(dir);
    } else {
      throw Error("checkpoint_peer: unknown command '" + cmd + "'");
    }
    run_steps(opt, 4, 5);
    std::filesystem::create_directories(out);
    for (std::size_t k = 0; k < kWeights.size(); ++k)
      write_npy(out / ("weight-" + kWeights[k].name + ".npy"), weights[k].view());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_peer: %s\n", e.what());
    return 1;
  }
}
