#include "fault_scenarios.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "distmuon/error.h"
#include "distmuon/hash.h"
#include "distmuon/muon.h"
#include "distmuon/tp.h"
#include "distmuon/trainer.h"
#include "test_util.h"
#include "train_test_util.h"

namespace distmuon::test {
namespace {

namespace fs = std::filesystem;

constexpr int kTp = 2, kGtp = 2;  // the grid of the optimizer scenarios: 4 ranks

// A weight of the optimizer scenarios: full m x n, TP-split along tp_dim, then rows over GTP.
struct WeightShape {
  const char* name;
  Index m, n;
  int tp_dim;
  ParamRole role = ParamRole::kHidden;
};
// Shapes on which the cost model picks different modes, and one AdamW weight.
constexpr WeightShape kWeights[] = {{"wq", 64, 32, 0},
                                    {"wo", 32, 64, 1},
                                    {"fc1", 256, 16, 0},
                                    {"fc2", 16, 256, 1},
                                    {"embed", 8, 16, kNoPartition, ParamRole::kEmbedding}};

// Deterministic values in [-1, 1) from (seed, index): the same on every run.
float value_at(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return static_cast<float>(static_cast<double>(x >> 11) / 4503599627370496.0 - 1.0);
}

void fill(MatrixView m, std::uint64_t seed) {
  for (Index r = 0; r < m.rows; ++r)
    for (Index c = 0; c < m.cols; ++c)
      m(r, c) = value_at(seed, static_cast<std::uint64_t>(r * m.cols + c));
}

void append(std::vector<float>& out, ConstMatrixView m) {
  for (Index r = 0; r < m.rows; ++r)
    for (Index c = 0; c < m.cols; ++c)
      out.push_back(m(r, c));
}

// The optimizer scenarios' model: this rank's shards on the TP x GTP grid and a Muon over them.
struct GridModel {
  ProcessGroups groups;
  std::vector<Matrix> local;
  std::unique_ptr<Muon> opt;

  GridModel(const Communicator& world, const MuonOptions& o)
      : groups(make_process_groups(world, kTp, kGtp)),
        opt(std::make_unique<Muon>(o, world, cpu_compute())) {
    for (const WeightShape& w : kWeights) {
      const bool sharded = w.tp_dim != kNoPartition;
      const Index rows = sharded ? (w.tp_dim == 0 ? w.m / kTp : w.m) / kGtp : w.m;
      const Index cols = w.tp_dim == 1 ? w.n / kTp : w.n;
      local.emplace_back(rows, cols);
      fill(local.back().view(), 1000 + 10 * local.size() + world.rank());
      ParamSpec s;
      s.name = w.name;
      s.local = local.back().view();
      s.rows = w.m;
      s.cols = w.n;
      s.role = w.role;
      if (sharded) {
        s.tp_partition_dim = w.tp_dim;
        s.tp_group = groups.tp;
        s.gtp_sharded = true;
        s.gtp_group = groups.gtp;
      }
      opt->add_parameter(s);
    }
  }

  std::vector<float> weights() const {
    std::vector<float> out;
    for (const Matrix& m : local)
      append(out, m.view());
    return out;
  }
  // The weights and the optimizer's state tensors.
  std::vector<float> state() {
    std::vector<float> out = weights();
    for (std::size_t i = 0; i < local.size(); ++i)
      for (const MatrixView t : opt->state_tensors(i))
        append(out, t);
    return out;
  }
  // One step with gradients that depend on (step, weight, rank) only. A failed step must leave
  // the weights as they were (record.failed_step_left_weights).
  void step(int step, int rank, ScenarioRecord& record) {
    std::vector<Matrix> grads;
    std::vector<ConstMatrixView> views;
    for (const Matrix& m : local) {
      grads.emplace_back(m.rows(), m.cols());
      fill(grads.back().view(), 7919 * static_cast<std::uint64_t>(step) + 31 * grads.size() +
                                    static_cast<std::uint64_t>(rank));
    }
    for (const Matrix& g : grads)
      views.push_back(g.view());
    const std::vector<float> before = weights();
    try {
      opt->step(views);
    } catch (...) {
      record.failed_step_left_weights = weights() == before;
      throw;
    }
  }
};

MuonOptions grid_options(PlanMode plan) {
  MuonOptions o;
  o.lr = 0.05;
  o.tp_mode = TpMode::kAuto;
  o.plan = plan;
  return o;
}

std::vector<float> run_step(const Communicator& world, PlanMode plan, ScenarioRecord& record) {
  GridModel model(world, grid_options(plan));
  model.step(1, world.rank(), record);
  return model.state();
}

// Data parallelism: three weights whole on every rank, replicated over the world, each
// orthogonalised on its home (replica_mode home, the bf16 wire) with the results exchanged in
// pipelined chunks; the same values and gradients on every replica; two steps.
std::vector<float> run_replicated(const Communicator& world, const fs::path&,
                                  ScenarioRecord& record) {
  MuonOptions o;
  o.lr = 0.05;
  o.replica_mode = ReplicaMode::kHome;
  o.replica_wire = ReplicaWire::kBf16;
  Muon opt(o, world, cpu_compute());
  const WeightShape shapes[] = {{"wq", 64, 32, 0}, {"fc1", 48, 16, 0}, {"fc2", 16, 48, 0}};
  std::vector<Matrix> local;
  for (const WeightShape& w : shapes) {
    local.emplace_back(w.m, w.n);
    fill(local.back().view(), 2000 + 10 * local.size());
    ParamSpec s;
    s.name = w.name;
    s.local = local.back().view();
    s.rows = w.m;
    s.cols = w.n;
    s.dp_group = world;
    opt.add_parameter(s);
  }
  auto weights = [&] {
    std::vector<float> out;
    for (const Matrix& m : local)
      append(out, m.view());
    return out;
  };
  for (int step = 1; step <= 2; ++step) {
    std::vector<Matrix> grads;
    std::vector<ConstMatrixView> views;
    for (const Matrix& m : local) {
      grads.emplace_back(m.rows(), m.cols());
      fill(grads.back().view(), 7919 * static_cast<std::uint64_t>(step) + 31 * grads.size());
    }
    for (const Matrix& g : grads)
      views.push_back(g.view());
    const std::vector<float> before = weights();
    try {
      opt.step(views);
    } catch (...) {
      record.failed_step_left_weights = weights() == before;
      throw;
    }
  }
  std::vector<float> out = weights();
  for (std::size_t i = 0; i < local.size(); ++i)
    for (const MatrixView t : opt.state_tensors(i))
      append(out, t);
  return out;
}

// Two steps, a save into dir/ckpt after each (the second replaces the first), then a load into
// a new optimizer, whose state ends the result.
std::vector<float> run_checkpoint(const Communicator& world, const fs::path& dir,
                                  ScenarioRecord& record) {
  GridModel model(world, grid_options(PlanMode::kEstimate));
  for (int step = 1; step <= 2; ++step) {
    model.step(step, world.rank(), record);
    model.opt->save(dir / "ckpt");
    std::vector<float> momentum;
    for (std::size_t i = 0; i < model.local.size(); ++i)
      for (const MatrixView t : model.opt->state_tensors(i))
        append(momentum, t);
    record.saved.push_back({step, checkpoint_digest(dir / "ckpt"), std::move(momentum)});
  }
  GridModel loaded(world, grid_options(PlanMode::kEstimate));
  loaded.opt->load(dir / "ckpt");
  std::vector<float> out = model.weights();
  for (std::size_t i = 0; i < loaded.local.size(); ++i)
    for (const MatrixView t : loaded.opt->state_tensors(i))
      append(out, t);
  return out;
}

std::vector<float> resume_checkpoint(const Communicator& world, const fs::path& dir) {
  GridModel loaded(world, grid_options(PlanMode::kEstimate));
  loaded.opt->load(dir / "ckpt");
  std::vector<float> out;
  for (std::size_t i = 0; i < loaded.local.size(); ++i)
    for (const MatrixView t : loaded.opt->state_tensors(i))
      append(out, t);
  return out;
}

// The trainer's weights on this rank and its step count.
std::vector<float> trainer_state(Trainer& t) {
  std::vector<float> out{static_cast<float>(t.step_count())};
  for (const ShardedParam& p : t.model().params())
    append(out, p.value.view());
  return out;
}

TrainConfig train_config(const fs::path& dir) {
  return tiny_config(dir / "text.txt", 2);
}

// Records the losses and, after each checkpoint, its digest and the trainer's state.
class Recorder : public TrainObserver {
 public:
  Recorder(Trainer& trainer, ScenarioRecord& record) : trainer_(trainer), record_(record) {}
  void on_step(const StepRecord& r) override {
    losses.push_back(static_cast<float>(r.loss));
    if (r.val_loss) losses.push_back(static_cast<float>(*r.val_loss));
  }
  void on_checkpoint(int step, const fs::path& dir) override {
    record_.saved.push_back({step, checkpoint_digest(dir), trainer_state(trainer_)});
  }
  std::vector<float> losses;

 private:
  Trainer& trainer_;
  ScenarioRecord& record_;
};

fs::path latest_step_folder(const fs::path& dir) {
  fs::path newest;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir / "ckpt", ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("step-") && fs::exists(e.path() / "trainer.json") &&
        (newest.empty() || name > newest.filename().string()))
      newest = e.path();
  }
  return newest;
}

std::vector<float> resume_train(const Communicator& world, const fs::path& dir);

// The training loop: two steps, a checkpoint after each, the validation loss at the last; then
// a resume into a new trainer.
std::vector<float> run_train(const Communicator& world, const fs::path& dir,
                             ScenarioRecord& record) {
  if (world.rank() == 0) {
    std::string text;
    for (std::uint32_t i = 0; text.size() < 6000; ++i)
      text += (i * 2654435761u >> 13) % 3 == 0 ? "free software " : "copies of it\n";
    std::ofstream(dir / "text.txt") << text;
  }
  world.barrier();
  Trainer trainer(train_config(dir), world);
  Recorder recorder(trainer, record);
  TrainObserver* observers[] = {&recorder};
  TrainRunOptions options;
  options.log_jsonl = dir / "log.jsonl";
  options.checkpoint_dir = dir / "ckpt";
  options.checkpoint_every = 1;
  const TrainSummary summary = run_training(trainer, options, observers);
  std::vector<float> out = resume_train(world, dir);
  out.insert(out.end(), recorder.losses.begin(), recorder.losses.end());
  out.push_back(static_cast<float>(summary.final_val_loss));
  return out;
}

std::vector<float> resume_train(const Communicator& world, const fs::path& dir) {
  Trainer resumed(train_config(dir), world);
  resumed.resume(dir / "ckpt");
  return trainer_state(resumed);
}

}  // namespace

const std::vector<Scenario>& fault_scenarios() {
  static const std::vector<Scenario> all = {
      {"step-estimate", [](const Communicator& w, const fs::path&,
                           ScenarioRecord& r) { return run_step(w, PlanMode::kEstimate, r); }},
      {"step-measure",
       [](const Communicator& w, const fs::path&, ScenarioRecord& r) {
         return run_step(w, PlanMode::kMeasure, r);
       },
       false},
      {"step-replicated", run_replicated},
      {"checkpoint", run_checkpoint, true, resume_checkpoint,
       [](const fs::path& dir) { return fs::exists(dir / "ckpt") ? dir / "ckpt" : fs::path(); }},
      {"train", run_train, true, resume_train, latest_step_folder},
  };
  return all;
}

const Scenario& fault_scenario(const std::string& name) {
  for (const Scenario& s : fault_scenarios())
    if (s.name == name) return s;
  throw Error(fmt::format("no fault scenario '{}'", name));
}

bool staging_left(const fs::path& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with(".") && name.ends_with(".partial")) return true;
  }
  return false;
}

std::uint64_t checkpoint_digest(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return 0;
  std::map<std::string, std::string> files = files_of(dir);  // relative name -> bytes
  for (auto& [name, bytes] : files) {
    if (fs::path(name).filename() != "trainer.json") continue;
    nlohmann::json meta = nlohmann::json::parse(bytes);
    meta.erase("run_id");
    bytes = meta.dump();
  }
  std::uint64_t h = kFnv1a64Basis;
  for (const auto& [name, bytes] : files) {
    h = fnv1a64(name.data(), name.size() + 1, h);  // the terminating zero separates the name
    h = fnv1a64(bytes.data(), bytes.size(), h);
  }
  return h | 1;  // never 0 (no folder)
}

}  // namespace distmuon::test
