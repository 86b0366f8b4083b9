// Optimizer checkpoints: save, load and continue equals an uninterrupted run bit for bit;
// resharding to another GTP group size; corrupted, truncated and mismatched checkpoints are
// refused on every rank; a configuration that differs between ranks is detected.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "distmuon/checkpoint.h"
#include "distmuon/compute.h"
#include "distmuon/error.h"
#include "optim_test_util.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using test::TestLayout;

// A directory every rank sees (rank 0 picks the name), removed at the end.
class SharedTempDir {
 public:
  SharedTempDir() {
    const Communicator& w = test::world();
    std::string name;
    if (w.rank() == 0) {
      name = (fs::temp_directory_path() /
              fmt::format("distmuon-ckpt-{}-{}", ::getpid(), std::random_device{}()))
                 .string();
    }
    path_ = w.broadcast_string(name, 0);
  }
  ~SharedTempDir() {
    test::world().barrier();
    if (test::world().rank() == 0) fs::remove_all(path_);
  }
  fs::path sub(const std::string& s) const { return path_ / s; }

 private:
  fs::path path_;
};

// A small model: a padded GTP-sharded hidden weight, a QKV weight, a TP-sharded weight (when
// the world allows TP 2), an embedding and a 1-D gain for AdamW.
struct Model {
  struct Param {
    TestLayout layout;
    ParamRole role = ParamRole::kHidden;
    Matrix full;  // initial full weight
  };
  std::vector<Param> params;
  int tp = 1, gtp = 1;
};

Model make_model(int tp, int gtp) {
  Model m;
  m.tp = tp;
  m.gtp = gtp;
  auto pad_for = [&](Index rows) { return (gtp - rows % gtp) % gtp; };
  const int t = tp;
  m.params.push_back({{.label = "hidden", .m = 30, .n = 12, .gtp = gtp, .pad = pad_for(30)}});
  m.params.push_back(
      {{.label = "qkv", .m = 24, .n = 10, .gtp = gtp, .pad = pad_for(24), .qkv = {4, 2, 2}}});
  m.params.push_back({{.label = "tp",
                       .m = 16,
                       .n = 8 * t,
                       .tp_dim = t > 1 ? 1 : kNoPartition,
                       .tp = t,
                       .gtp = gtp,
                       .pad = pad_for(16)}});
  m.params.push_back({{.label = "embedding", .m = 30, .n = 6, .gtp = gtp, .pad = pad_for(30)},
                      ParamRole::kEmbedding});
  m.params.push_back(
      {{.label = "gain", .m = 10, .n = 1, .gtp = gtp, .pad = pad_for(10)}, ParamRole::kOther});
  std::uint64_t seed = 1000;
  for (auto& p : m.params)
    p.full = test::random_matrix(p.layout.m, p.layout.n, seed++);
  return m;
}

// One rank's optimizer over the model, with its local shards, on a backend ("cpu": the shards are
// `local` itself; another backend: they live in its memory, `local` holding their host copies
// after every steps() call).
struct ModelRun {
  ProcessGroups groups;
  std::vector<Matrix> local;
  Compute* compute;
  std::vector<DeviceMatrix> device;  // the shards on a backend other than cpu
  std::unique_ptr<Muon> opt;

  ModelRun(const Model& m, const MuonOptions& o, const std::string& backend = "cpu")
      : groups(make_process_groups(test::world(), m.tp, m.gtp)),
        compute(&compute_backend(backend)),
        opt(std::make_unique<Muon>(o, test::world(), *compute)) {
    for (const auto& p : m.params) {
      local.push_back(
          test::shard_for(p.full.view(), p.layout, groups.tp.rank(), groups.gtp.rank()));
      if (on_device()) device.push_back(to_device(*compute, local.back().view()));
    }
    for (std::size_t i = 0; i < m.params.size(); ++i) {
      const TestLayout& l = m.params[i].layout;
      ParamSpec s;
      s.name = l.label;
      s.local = on_device() ? device[i].view() : local[i].view();
      s.rows = l.m;
      s.cols = l.n;
      s.role = m.params[i].role;
      s.tp_partition_dim = l.tp_dim;
      s.tp_group = groups.tp;
      s.gtp_sharded = true;
      s.gtp_group = groups.gtp;
      s.pad_length = l.pad;
      s.qkv_split = l.qkv;
      opt->add_parameter(s);
    }
  }
  bool on_device() const { return compute != &cpu_compute(); }
  // Steps [first, last) with gradients that depend on the step only.
  void steps(const Model& m, int first, int last) {
    for (int step = first; step < last; ++step) {
      std::vector<Matrix> g;
      std::vector<DeviceMatrix> g_device;
      std::vector<ConstMatrixView> views;
      for (std::size_t i = 0; i < m.params.size(); ++i) {
        const TestLayout& l = m.params[i].layout;
        const Matrix full =
            test::random_matrix(l.m, l.n, 77 * static_cast<std::uint64_t>(step) + i);
        g.push_back(test::shard_for(full.view(), l, groups.tp.rank(), groups.gtp.rank()));
        if (on_device()) g_device.push_back(to_device(*compute, g.back().view()));
      }
      for (std::size_t i = 0; i < g.size(); ++i)
        views.push_back(on_device() ? g_device[i].view() : g[i].view());
      opt->step(views);
    }
    for (std::size_t i = 0; i < device.size(); ++i)
      compute->copy_to_host(device[i].view(), local[i].view());
  }
  // Host copies of the optimizer state of every parameter, in order.
  std::vector<Matrix> state() const {
    std::vector<Matrix> out;
    for (std::size_t i = 0; i < local.size(); ++i)
      for (const MatrixView& t : opt->state_tensors(i))
        out.push_back(to_host(*compute, t));
    return out;
  }
  // The full weights now (all-gather over TP and GTP; padding stripped).
  Model current(const Model& m) const {
    Model out = m;
    for (std::size_t i = 0; i < m.params.size(); ++i) {
      const TestLayout& l = m.params[i].layout;
      Matrix tp_local(l.shard_rows() * l.gtp, l.n_tp());
      groups.gtp.all_gather<float>(Matrix::from(local[i].view()).values(), tp_local.values());
      const Matrix unpadded = Matrix::from(tp_local.view().row_block(0, l.m_tp()));
      if (l.tp_dim == kNoPartition) {
        out.params[i].full = unpadded;
        continue;
      }
      std::vector<Matrix> pieces(static_cast<std::size_t>(l.tp), Matrix(l.m_tp(), l.n_tp()));
      std::vector<float> all(unpadded.values().size() * static_cast<std::size_t>(l.tp));
      groups.tp.all_gather<float>(unpadded.values(), all);
      for (int t = 0; t < l.tp; ++t) {
        std::copy_n(all.data() + unpadded.values().size() * static_cast<std::size_t>(t),
                    unpadded.values().size(), pieces[static_cast<std::size_t>(t)].data());
      }
      out.params[i].full = unshard(pieces, l.tp_dim);
    }
    return out;
  }
};

MuonOptions options(TpMode mode) {
  MuonOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.01;
  o.tp_mode = mode;
  return o;
}

bool bit_equal(const Matrix& a, const Matrix& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<std::size_t>(a.size())) == 0;
}

TEST(Checkpoint, SaveLoadContinueIsBitForBit) {
  const int w = test::world().size();
  const int tp = w >= 4 ? 2 : 1;
  const Model m = make_model(tp, w / tp);
  SharedTempDir dir;
  for (TpMode mode :
       {TpMode::kDuplicated, TpMode::kDistributed, TpMode::kBlockwise, TpMode::kAuto}) {
    ModelRun whole(m, options(mode));
    whole.steps(m, 0, 6);

    ModelRun first(m, options(mode));
    first.steps(m, 0, 3);
    first.opt->save(dir.sub(to_string(mode)));
    // A fresh optimizer on the weights at step 3 (weights are the training loop's to save).
    const Model at3 = first.current(m);
    ModelRun second(at3, options(mode));
    second.opt->load(dir.sub(to_string(mode)));
    EXPECT_EQ(second.opt->step_count(), 3);
    second.steps(m, 3, 6);
    for (std::size_t i = 0; i < m.params.size(); ++i) {
      EXPECT_TRUE(bit_equal(second.local[i], whole.local[i]))
          << to_string(mode) << " " << m.params[i].layout.label << " differs after resume";
    }
  }
}

// Loads a checkpoint written at GTP size g_from into GTP size g_to and continues: equals the
// run that never left g_from. duplicated orthogonalises the same full matrix whatever G, so
// only lost or misplaced state could make a difference: checked within 1e-6 (it is exact
// here). distributed sums the Gram matrix over another number of ranks: rounding only, 1e-5.
void check_reshard(int g_from, int g_to, TpMode mode, double tol, const SharedTempDir& dir) {
  const Model from = make_model(1, g_from);
  ModelRun whole(from, options(mode));
  whole.steps(from, 0, 6);
  const Model expected = whole.current(from);

  ModelRun first(from, options(mode));
  first.steps(from, 0, 3);
  const fs::path path = dir.sub(fmt::format("reshard-{}-{}-{}", g_from, g_to, to_string(mode)));
  first.opt->save(path);
  Model at3 = first.current(from);
  const Model to = make_model(1, g_to);
  for (std::size_t i = 0; i < to.params.size(); ++i)
    at3.params[i].layout = to.params[i].layout;
  at3.gtp = g_to;
  ModelRun second(at3, options(mode));
  second.opt->load(path);
  second.steps(to, 3, 6);
  const Model got = second.current(at3);
  for (std::size_t i = 0; i < got.params.size(); ++i) {
    EXPECT_LE(relative_error(got.params[i].full.view(), expected.params[i].full.view()), tol)
        << "G " << g_from << " -> " << g_to << " " << to_string(mode) << " "
        << got.params[i].layout.label;
  }
}

TEST(Checkpoint, ReshardsToAnotherGtpSize) {
  if (test::world().size() != 4) GTEST_SKIP() << "needs 4 ranks (G = 2 with 2 replicas, G = 4)";
  SharedTempDir dir;
  check_reshard(2, 4, TpMode::kDuplicated, 1e-6, dir);
  check_reshard(4, 2, TpMode::kDuplicated, 1e-6, dir);
  check_reshard(2, 4, TpMode::kDistributed, 1e-5, dir);
}

// Save, load (into the same and into another GTP size) and continue on the opaque backend, whose
// memory the host cannot address: the weights and the state are bit-equal to the same run on
// the CPU backend (tolerance 0: the same arithmetic; the files go through host staging).
TEST(Checkpoint, OpaqueBackendIsBitEqualToCpu) {
  const int w = test::world().size();
  SharedTempDir dir;
  // The same GTP size, and (with 2 or more ranks) G -> G / 2 with two replicas.
  const std::vector<std::pair<int, int>> sizes =
      w > 1 ? std::vector<std::pair<int, int>>{{w, w}, {w, w / 2}}
            : std::vector<std::pair<int, int>>{{1, 1}};
  for (const auto& [g_from, g_to] : sizes) {
    for (TpMode mode :
         {TpMode::kDuplicated, TpMode::kDistributed, TpMode::kBlockwise, TpMode::kOwner}) {
      const Model from = make_model(1, g_from);
      std::map<std::string, std::pair<std::vector<Matrix>, std::vector<Matrix>>> result;
      for (const std::string backend : {"cpu", "opaque"}) {
        ModelRun first(from, options(mode), backend);
        first.steps(from, 0, 2);
        const fs::path path =
            dir.sub(fmt::format("{}-{}-{}-{}", backend, to_string(mode), g_from, g_to));
        first.opt->save(path);
        Model at2 = first.current(from);
        const Model to = make_model(1, g_to);
        for (std::size_t i = 0; i < to.params.size(); ++i)
          at2.params[i].layout = to.params[i].layout;
        at2.gtp = g_to;
        ModelRun second(at2, options(mode), backend);
        second.opt->load(path);
        second.steps(to, 2, 4);
        result[backend] = {second.local, second.state()};
      }
      const auto& [cpu_w, cpu_s] = result["cpu"];
      const auto& [opaque_w, opaque_s] = result["opaque"];
      for (std::size_t i = 0; i < cpu_w.size(); ++i)
        EXPECT_TRUE(bit_equal(cpu_w[i], opaque_w[i]))
            << to_string(mode) << " G " << g_from << " -> " << g_to << " weight " << i;
      ASSERT_EQ(cpu_s.size(), opaque_s.size());
      for (std::size_t i = 0; i < cpu_s.size(); ++i)
        EXPECT_TRUE(bit_equal(cpu_s[i], opaque_s[i]))
            << to_string(mode) << " G " << g_from << " -> " << g_to << " state " << i;
    }
  }
}

std::string load_error(Muon& opt, const fs::path& path) {
  try {
    opt.load(path);
  } catch (const CollectiveError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not collective: ") + e.what();
  }
  return "";
}

TEST(Checkpoint, CorruptedTruncatedAndMismatchedCheckpointsAreRefused) {
  const Communicator& world = test::world();
  const int w = world.size();
  const Model m = make_model(1, w);
  SharedTempDir dir;
  ModelRun run(m, options(TpMode::kDuplicated));
  run.steps(m, 0, 2);
  const fs::path path = dir.sub("ckpt");
  run.opt->save(path);
  const int last = w - 1;  // only the last rank reads this file: the others must not hang
  const fs::path file = path / checkpoint_rank_file(last);
  std::vector<char> good;
  if (world.rank() == last) {
    std::ifstream in(file, std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto rewrite = [&](const std::vector<char>& bytes) {
    if (world.rank() == last)
      std::ofstream(file, std::ios::binary)
          .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    world.barrier();
  };

  std::vector<char> flipped = good;
  if (!flipped.empty()) flipped[flipped.size() / 2] ^= 0x10;
  rewrite(flipped);
  EXPECT_NE(load_error(*run.opt, path).find("checksum"), std::string::npos)
      << load_error(*run.opt, path);

  std::vector<char> truncated(good.begin(),
                              good.begin() + static_cast<std::ptrdiff_t>(good.size() / 2));
  rewrite(truncated);
  EXPECT_NE(load_error(*run.opt, path).find("truncated"), std::string::npos);
  rewrite(good);
  EXPECT_EQ(load_error(*run.opt, path), "");

  // A manifest that is not JSON.
  const fs::path manifest = path / kManifestName;
  std::string text;
  if (world.rank() == 0) {
    std::ifstream in(manifest);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    std::ofstream(manifest) << text.substr(0, text.size() / 2);
  }
  world.barrier();
  EXPECT_NE(load_error(*run.opt, path).find("not valid JSON"), std::string::npos);
  if (world.rank() == 0) std::ofstream(manifest) << text;
  world.barrier();

  // Another model: one weight with another shape, and one weight fewer.
  Model other = m;
  other.params[0].layout.n = 14;
  other.params[0].full = test::random_matrix(30, 14, 1);
  ModelRun wrong_shape(other, options(TpMode::kDuplicated));
  EXPECT_NE(load_error(*wrong_shape.opt, path).find("cols is 12 in the checkpoint but 14 now"),
            std::string::npos);
  Model fewer = m;
  fewer.params.pop_back();
  ModelRun wrong_count(fewer, options(TpMode::kDuplicated));
  EXPECT_NE(load_error(*wrong_count.opt, path).find("5 parameters, the optimizer 4"),
            std::string::npos);
  EXPECT_NE(load_error(*run.opt, dir.sub("missing")).find("cannot open"), std::string::npos);
}

TEST(Checkpoint, ConfigurationDifferingBetweenRanksIsDetected) {
  const Communicator& world = test::world();
  if (world.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const Model m = make_model(1, world.size());
  {
    MuonOptions o = options(TpMode::kDuplicated);
    if (world.rank() == 1) o.momentum = 0.9;
    ModelRun run(m, o);
    try {
      run.steps(m, 0, 1);
      ADD_FAILURE() << "different options were not detected";
    } catch (const CollectiveError& e) {
      EXPECT_NE(std::string(e.what()).find("/options/momentum"), std::string::npos) << e.what();
    }
  }
  {
    // A NaN gradient on one rank, in blockwise mode (no collective in NS): every rank raises.
    ModelRun run(m, options(TpMode::kBlockwise));
    std::vector<Matrix> g;
    std::vector<ConstMatrixView> views;
    for (const Matrix& x : run.local)
      g.push_back(Matrix(x.rows(), x.cols()));
    if (world.rank() == 1) g[0](0, 0) = std::nanf("");
    for (const Matrix& x : g)
      views.push_back(x.view());
    try {
      run.opt->step(views);
      ADD_FAILURE() << "a non-finite gradient was not detected";
    } catch (const CollectiveError& e) {
      EXPECT_NE(std::string(e.what()).find("non-finite"), std::string::npos) << e.what();
    }
  }
  {
    Model renamed = m;
    if (world.rank() == 1) renamed.params[2].layout.label = "renamed";
    ModelRun run(renamed, options(TpMode::kDuplicated));
    SharedTempDir dir;
    try {
      run.opt->save(dir.sub("x"));
      ADD_FAILURE() << "different parameter lists were not detected";
    } catch (const CollectiveError& e) {
      EXPECT_NE(std::string(e.what()).find("/params/2/name"), std::string::npos) << e.what();
    }
  }
}

// Ranks saving into different folders (a path built from the rank, as `opt.save(f"ckpt_{rank}")`
// would): refused on every rank before anything is written, naming rank 0's folder and the
// first differing rank's.
TEST(Checkpoint, RanksSavingIntoDifferentFoldersAreRefused) {
  const Communicator& world = test::world();
  if (world.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const Model m = make_model(1, world.size());
  SharedTempDir dir;
  ModelRun run(m, options(TpMode::kDuplicated));
  run.steps(m, 0, 1);
  try {
    run.opt->save(dir.sub(fmt::format("ckpt_{}", world.rank())));
    ADD_FAILURE() << "saving into different folders succeeded";
  } catch (const CollectiveError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the ranks name different folders"), std::string::npos) << what;
    EXPECT_NE(what.find(dir.sub("ckpt_0").string()), std::string::npos) << what;
    EXPECT_NE(what.find(dir.sub("ckpt_1").string()), std::string::npos) << what;
  }
  world.barrier();
  for (int r = 0; r < world.size(); ++r)
    EXPECT_FALSE(fs::exists(dir.sub(fmt::format("ckpt_{}", r))));
}

// A save that fails on the last rank (its rank file over the file-size limit) into a folder
// holding a checkpoint: every rank throws, the folder still loads the earlier checkpoint
// (step 2) unchanged, and no staging folder is left.
TEST(Checkpoint, AFailedSaveKeepsThePreviousCheckpoint) {
  const Communicator& world = test::world();
  const Model m = make_model(1, world.size());
  SharedTempDir dir;
  ModelRun run(m, options(TpMode::kDuplicated));
  run.steps(m, 0, 2);
  const fs::path path = dir.sub("ckpt");
  run.opt->save(path);
  run.steps(m, 2, 3);
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  if (world.rank() == world.size() - 1) {
    struct rlimit small = old;
    small.rlim_cur = 16;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  }
  std::string error;
  try {
    run.opt->save(path);
  } catch (const CollectiveError& e) {
    error = e.what();
  }
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  EXPECT_NE(error.find("file-size limit"), std::string::npos) << error;
  world.barrier();
  EXPECT_FALSE(fs::exists(dir.sub(".ckpt.partial")));
  ModelRun second(run.current(m), options(TpMode::kDuplicated));
  second.opt->load(path);
  EXPECT_EQ(second.opt->step_count(), 2);
  // Saved again (the folder exists: replaced by the atomic exchange) it holds step 3.
  run.opt->save(path);
  second.opt->load(path);
  EXPECT_EQ(second.opt->step_count(), 3);
  EXPECT_FALSE(fs::exists(dir.sub(".ckpt.partial")));
}

}  // namespace
}  // namespace distmuon
