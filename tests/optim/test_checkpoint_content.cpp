// Optimizer checkpoints agreed by what they hold, and finite (docs/reliability.md, "Bad inputs",
// rows 155, 162, 163): ranks that read different checkpoints (node-local folders under one path
// hold another step: here each rank names its own folder, which is the same to Muon::load) are
// refused on every rank before anything changes; a state that is not finite is never saved and
// never loaded; settings past float32's range are refused.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "distmuon/checkpoint.h"
#include "distmuon/error.h"
#include "distmuon/file_io.h"
#include "distmuon/muon.h"
#include "test_util.h"
#include "two_weight_model.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;

// A folder every rank names (rank 0 picks it), removed at the end.
fs::path shared_dir() {
  const Communicator& w = test::world();
  std::string name;
  if (w.rank() == 0) {
    name = (fs::temp_directory_path() /
            fmt::format("distmuon-ckpt-content-{}-{}", ::getpid(), std::random_device{}()))
               .string();
  }
  return w.broadcast_string(name, 0);
}

// The two-weight model, stepped with gradients drawn from a seed, and its whole state.
struct Model : test::TwoWeightModel {
  using TwoWeightModel::TwoWeightModel;
  void step(std::uint64_t seed) {
    const Communicator& w = test::world();
    const Matrix gh =
        test::random_matrix(16 / w.size(), 8, seed + static_cast<std::uint64_t>(w.rank()));
    TwoWeightModel::step(gh, test::random_matrix(6, 4, seed + 100));
  }
  std::vector<float> state() {
    std::vector<float> out;
    for (std::size_t i = 0; i < 2; ++i)
      for (const MatrixView v : opt.state_tensors(i))
        for (Index r = 0; r < v.rows; ++r)
          for (Index c = 0; c < v.cols; ++c)
            out.push_back(v(r, c));
    return out;
  }
};

// Each rank a view of its own: the last rank's folder holds step 2, the others' step 1 (the same
// path on node-local disks). Every rank refuses, naming the difference, and nothing changes.
TEST(CheckpointContent, LoadRefusesCheckpointsThatDifferBetweenRanks) {
  const Communicator& w = test::world();
  if (w.size() < 2) GTEST_SKIP() << "needs two ranks";
  const fs::path dir = shared_dir();
  Model m(w);
  m.step(1);
  m.opt.save(dir / "step1");
  m.step(2);
  m.opt.save(dir / "step2");
  m.step(3);
  const std::vector<float> before = m.state();
  const fs::path mine = w.rank() == w.size() - 1 ? dir / "step2" : dir / "step1";
  try {
    m.opt.load(mine);
    ADD_FAILURE() << "rank " << w.rank() << " loaded a checkpoint its peers do not share";
  } catch (const CollectiveError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the ranks read different checkpoints"), std::string::npos) << what;
    EXPECT_NE(what.find(fmt::format("rank(s) {} of {}", w.size() - 1, w.size())), std::string::npos)
        << what;
  }
  EXPECT_EQ(m.opt.step_count(), 3);
  EXPECT_EQ(m.state(), before);
  // The same content everywhere loads.
  m.opt.load(dir / "step2");
  EXPECT_EQ(m.opt.step_count(), 2);
  w.barrier();
  if (w.rank() == 0) fs::remove_all(dir);
}

// An AdamW moment that is infinite on the last rank: the save is refused on every rank and the
// folder keeps the checkpoint it held.
TEST(CheckpointContent, SaveRefusesNonFiniteState) {
  const Communicator& w = test::world();
  const fs::path dir = shared_dir();
  Model m(w);
  m.step(1);
  m.opt.save(dir / "ckpt");
  if (w.rank() == w.size() - 1)
    m.opt.state_tensors(1)[1](2, 3) = std::numeric_limits<float>::infinity();
  try {
    m.opt.save(dir / "ckpt");
    ADD_FAILURE() << "a non-finite state was saved";
  } catch (const CollectiveError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("exp_avg_sq of parameter 'embed' has a non-finite value at (2, 3)"),
              std::string::npos)
        << what;
  }
  w.barrier();
  // The earlier checkpoint is intact: it loads, at step 1.
  Model fresh(w);
  fresh.opt.load(dir / "ckpt");
  EXPECT_EQ(fresh.opt.step_count(), 1);
  w.barrier();
  if (w.rank() == 0) fs::remove_all(dir);
}

// A rank file holding an infinity with a checksum that matches (written by another program): the
// load is refused on every rank and nothing changes.
TEST(CheckpointContent, LoadRefusesNonFiniteState) {
  const Communicator& w = test::world();
  const fs::path dir = shared_dir();
  Model m(w);
  m.step(1);
  m.opt.save(dir / "ckpt");
  w.barrier();
  if (w.rank() == 0) {
    const fs::path manifest_path = dir / "ckpt" / kManifestName;
    nlohmann::json manifest = nlohmann::json::parse(std::ifstream(manifest_path));
    const int r = w.size() - 1;
    const fs::path file = dir / "ckpt" / checkpoint_rank_file(r);
    std::vector<char> bytes = read_file_bytes(file);
    const float inf = std::numeric_limits<float>::infinity();
    std::memcpy(bytes.data(), &inf, sizeof inf);  // the first momentum element
    std::ofstream(file, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    manifest["ranks"][static_cast<std::size_t>(r)]["fnv1a64"] =
        checksum_hex(fnv1a64(bytes.data(), bytes.size()));
    std::ofstream(manifest_path) << manifest.dump(1);
  }
  w.barrier();
  Model fresh(w);
  fresh.step(5);
  const std::vector<float> before = fresh.state();
  try {
    fresh.opt.load(dir / "ckpt");
    ADD_FAILURE() << "a non-finite state was loaded";
  } catch (const CollectiveError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("momentum of parameter 'hidden.w' has a non-finite value"),
              std::string::npos)
        << what;
  }
  EXPECT_EQ(fresh.opt.step_count(), 1);
  EXPECT_EQ(fresh.state(), before);
  w.barrier();
  if (w.rank() == 0) fs::remove_all(dir);
}

// Finite settings past float32's range would write infinities into the weights: refused when
// the optimizer is built and when they are changed (which then changes nothing).
TEST(CheckpointContent, SettingsPastFloat32RangeAreRefused) {
  const Communicator& w = test::world();
  for (const auto& set : std::vector<std::function<void(MuonOptions&)>>{
           [](MuonOptions& o) { o.lr = 1e39; },
           [](MuonOptions& o) { o.weight_decay = 1e39; },
           [](MuonOptions& o) {
             o.lr = 1e20;
             o.weight_decay = 1e20;  // 1 - lr x wd = -1e40
           },
           [](MuonOptions& o) { o.adamw.lr = 1e39; },
           [](MuonOptions& o) { o.extra_scale_factor = 1e39; },
       }) {
    MuonOptions o{.tp_mode = TpMode::kDuplicated};
    set(o);
    EXPECT_THROW(o.validate(), Error);
  }
  Model m(w);
  m.step(1);
  const std::vector<float> before = m.state();
  EXPECT_THROW(m.opt.set_learning_rates(1e39, 1e-3), Error);
  EXPECT_THROW(m.opt.set_learning_rates(1e-2, 1e39), Error);
  EXPECT_DOUBLE_EQ(m.opt.options().lr, MuonOptions{}.lr);
  EXPECT_EQ(m.state(), before);
}

}  // namespace
}  // namespace distmuon
