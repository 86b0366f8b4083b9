// Trainer checkpoints: the model's values per rank, the optimizer's state (Muon::save) and the
// step, written atomically; resume verifies everything before changing anything it can check.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/fault.h"
#include "distmuon/agreement.h"
#include "distmuon/checkpoint.h"
#include "distmuon/compute.h"
#include "distmuon/error.h"
#include "distmuon/file_io.h"
#include "distmuon/json_file.h"
#include "train/trainer_impl.h"

namespace distmuon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kTrainerFile = "trainer.json";
constexpr const char* kOptimizerManifest = "optimizer/manifest.json";

fs::path model_file(const fs::path& dir, int rank) {
  return dir / "model" / checkpoint_rank_file(rank);
}

// What a resumed run must share with the run that wrote the checkpoint to see the same data and
// weights: the model, the data and the seed and global batch (steps, intervals and the
// optimizer's options may change).
json run_identity(const TrainConfig& c) {
  const json all = to_json(c);
  return {{"model", all.at("model")},
          {"data", all.at("data")},
          {"train",
           {{"seed", all.at("train").at("seed")},
            {"batch", all.at("train").at("batch")},
            {"weights", all.at("train").at("weights")}}}};
}

std::string first_difference(const json& saved, const json& mine) {
  const json patch = json::diff(saved, mine);
  if (patch.empty()) return {};
  const json::json_pointer path(patch[0].at("path").get<std::string>());
  const auto at = [&](const json& j) {
    return j.contains(path) ? j.at(path).dump() : std::string("nothing");
  };
  std::string field = path.to_string().substr(1);
  std::replace(field.begin(), field.end(), '/', '.');
  return fmt::format("the checkpoint was written with {} = {}, this run has {}", field, at(saved),
                     at(mine));
}

// "'<dir>/trainer.json' is damaged (<why>)": the reason it cannot be read.
std::string damaged_trainer_json(const fs::path& step_dir) {
  const fs::path file = step_dir / kTrainerFile;
  std::string why = "unreadable";
  try {
    const json meta = read_json_file(file);
    why = meta.is_object() ? "its run_id is not a string" : "not a JSON object";
    (void)meta.value("run_id", std::string());
  } catch (const std::exception& e) {
    why = e.what();
  }
  return fmt::format("'{}' is damaged ({})", file.string(), why);
}

// Rank 0's choice, the same on every rank: dir itself when it holds trainer.json, else its newest
// step-NNNNNNNN folder that holds one (trainer.json is written last, so a folder without it was
// interrupted while saving and is skipped with a warning). Empty when there is none.
fs::path choose_checkpoint(const Communicator& w, const fs::path& dir) {
  return decide_on_root<std::string>(
      w, 0, fmt::format("train: looking for a checkpoint in '{}'", dir.string()), [&] {
        if (fs::exists(dir / kTrainerFile)) return dir.string();
        if (!fs::is_directory(dir)) return std::string();
        std::vector<std::pair<int, fs::path>> steps;
        for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
          const std::string name = e.path().filename().string();
          int step = 0;
          if (e.is_directory() && std::sscanf(name.c_str(), "step-%d", &step) == 1 &&
              name == train_checkpoint_step_dir(step))
            steps.emplace_back(step, e.path());
        }
        std::sort(steps.rbegin(), steps.rend());
        std::string chosen;
        std::map<std::string, std::vector<std::string>> runs;  // run id -> its complete folders
        std::string damaged;  // the newest complete folder's trainer.json cannot be read
        for (const auto& [step, path] : steps) {
          const std::optional<std::string> id = detail::checkpoint_run_id(path);
          if (id && *id == detail::kDamagedRunId) {
            if (chosen.empty() && damaged.empty()) damaged = path.string();
            continue;  // an older damaged one is not a run of its own
          }
          if (id) {
            if (!damaged.empty()) {
              throw Error(fmt::format(
                  "{}; resume from the previous step folder '{}' or remove the damaged one",
                  damaged_trainer_json(damaged), path.string()));
            }
            if (chosen.empty()) chosen = path.string();
            runs[*id].push_back(path.filename().string());
            continue;
          }
          if (chosen.empty() && damaged.empty()) {
            spdlog::warn("train: skipping '{}': it has no {} (interrupted while saving)",
                         path.string(), kTrainerFile);
          }
        }
        if (!damaged.empty()) {
          throw Error(fmt::format("{}, and no older step folder holds a checkpoint",
                                  damaged_trainer_json(damaged)));
        }
        if (runs.size() > 1) {
          std::vector<std::string> listed;
          for (const auto& [id, folders] : runs)
            listed.push_back(fmt::format("run '{}': {}", id, fmt::join(folders, ", ")));
          throw Error(
              fmt::format("'{}' holds the checkpoints of {} runs ({}); resume from one step folder",
                          dir.string(), runs.size(), fmt::join(listed, "; ")));
        }
        return chosen;
      });
}

}  // namespace

std::optional<std::string> detail::checkpoint_run_id(const fs::path& step_dir) {
  std::error_code ec;
  if (!fs::exists(step_dir / kTrainerFile, ec)) return std::nullopt;
  try {
    const json meta = read_json_file(step_dir / kTrainerFile);
    if (!meta.is_object()) return std::string(kDamagedRunId);
    return meta.value("run_id", std::string());
  } catch (const std::exception&) {
    return std::string(kDamagedRunId);
  }
}

std::string train_checkpoint_step_dir(int step) {
  return fmt::format("step-{:08d}", step);
}

void Trainer::save_checkpoint(const fs::path& dir) {
  Impl& s = *impl_;
  const Communicator& w = s.world;
  const std::string what = fmt::format("train: saving checkpoint '{}'", dir.string());
  agree_on_checkpoint_folder(w, dir, what);
  std::string failure;
  // A NaN or an infinity in any rank's weights: every rank refuses before anything is written.
  // The model's weights are host memory, checked by the host backend.
  Compute& host(cpu_compute());
  for (const ShardedParam& p : s.model->params()) {
    if (const auto at = host.find_non_finite(p.value.view())) {
      failure = fmt::format(
          "weight '{}' has a non-finite value at ({}, {}) of rank {}'s {} part; a checkpoint "
          "holds finite weights only, nothing was written",
          p.name, at->row, at->col, w.rank(), shape_str(p.value.view()));
      break;
    }
  }
  agree_or_throw(w, failure.empty(), what, failure);
  // Everything is written into a staging folder beside dir, which replaces dir only once it is
  // complete: until then dir keeps what it held (an earlier complete checkpoint stays loadable).
  const fs::path staging = staging_dir_of(dir);
  run_on_root(w, what, [&] {
    std::error_code ec;
    fs::remove_all(staging, ec);  // left by a save that did not finish
    if (ec) throw Error(fmt::format("cannot remove '{}': {}", staging.string(), ec.message()));
    fs::create_directories(staging / "model", ec);
    if (ec) throw Error(fmt::format("cannot create '{}': {}", staging.string(), ec.message()));
  });
  // The files into staging, trainer.json last, then staging replaces dir.
  const auto write_staged = [&] {
    std::uint64_t sum = 0;
    std::int64_t size = 0;
    try {
      std::vector<float> values;
      for (const ShardedParam& p : s.model->params())
        values.insert(values.end(), p.value.values().begin(), p.value.values().end());
      size = static_cast<std::int64_t>(values.size() * sizeof(float));
      write_file_atomic(model_file(staging, w.rank()), values.data(),
                        static_cast<std::size_t>(size));
      sum = fnv1a64(values.data(), static_cast<std::size_t>(size));
    } catch (const std::exception& e) {
      failure = e.what();
    }
    agree_or_throw(w, failure.empty(), what, failure);
    const std::vector<std::int64_t> sums = w.all_gather(static_cast<std::int64_t>(sum));
    const std::vector<std::int64_t> sizes = w.all_gather(size);
    detail::fault_point("checkpoint-between-files");  // docs/reliability.md
    s.muon->save(staging / "optimizer");
    // The trainer's manifest last, binding every file of the folder by its checksum: the model
    // files directly, the optimizer's files through its manifest (which lists theirs).
    run_on_root(w, what, [&] {
      json files = json::array();
      for (int r = 0; r < w.size(); ++r) {
        const auto i = static_cast<std::size_t>(r);
        files.push_back({{"file", fs::relative(model_file(staging, r), staging).string()},
                         {"bytes", sizes[i]},
                         {"fnv1a64", checksum_hex(static_cast<std::uint64_t>(sums[i]))}});
      }
      const std::vector<char> manifest = read_file_bytes(staging / kOptimizerManifest);
      json meta = {{"format", kTrainCheckpointFormat},
                   {"version", kTrainCheckpointVersion},
                   {"step", s.step},
                   {"world_size", w.size()},
                   {"config", to_json(s.config)},
                   {"model_files", files},
                   {"optimizer_manifest",
                    {{"file", kOptimizerManifest},
                     {"bytes", manifest.size()},
                     {"fnv1a64", checksum_hex(fnv1a64(manifest.data(), manifest.size()))}}}};
      if (!s.run_id.empty()) meta["run_id"] = s.run_id;
      const std::string text = meta.dump(2) + "\n";
      write_file_atomic(staging / kTrainerFile, text.data(), text.size());
      replace_dir_atomic(staging, dir);
    });
  };
  try {
    write_staged();
  } catch (...) {
    // Every rank throws (the failures are agreed): rank 0 removes the partial folder.
    std::error_code ec;
    if (w.rank() == 0) fs::remove_all(staging, ec);
    throw;
  }
}

void Trainer::resume(const fs::path& where) {
  Impl& s = *impl_;
  const Communicator& w = s.world;
  const fs::path dir = choose_checkpoint(w, where);
  std::string failure;
  int step = 0;
  std::string run_id;
  std::vector<char> bytes;
  std::uint64_t digest = 0;  // of the trainer.json this rank read
  try {
    if (dir.empty()) {
      throw Error(
          fmt::format("'{}' holds no training checkpoint ({} is missing, in it and in "
                      "every step-NNNNNNNN folder)",
                      where.string(), kTrainerFile));
    }
    const std::vector<char> meta_bytes = read_file_bytes(dir / kTrainerFile);
    digest = fnv1a64(meta_bytes.data(), meta_bytes.size());
    const json meta =
        parse_json_text(std::string_view(meta_bytes.data(), meta_bytes.size()),
                        fmt::format("checkpoint '{}'", (dir / kTrainerFile).string()));
    try {
      if (meta.at("format") != kTrainCheckpointFormat ||
          meta.at("version") != kTrainCheckpointVersion) {
        throw Error(fmt::format("format {} version {} (expected {} version {})",
                                meta.at("format").dump(), meta.at("version").dump(),
                                kTrainCheckpointFormat, kTrainCheckpointVersion));
      }
      const int saved_world = meta.at("world_size").get<int>();
      if (saved_world != w.size()) {
        throw Error(fmt::format(
            "written by {} ranks, this run has {} (the model's shards are per rank: resume with "
            "mpirun -np {})",
            saved_world, w.size(), saved_world));
      }
      const std::string diff = first_difference(run_identity(parse_train_config(meta.at("config"))),
                                                run_identity(s.config));
      if (!diff.empty()) throw Error(diff);
      step = meta.at("step").get<int>();
      run_id = meta.value("run_id", std::string());
      if (meta.contains("optimizer_manifest")) {  // absent in checkpoints written before it
        const json& entry = meta.at("optimizer_manifest");
        const fs::path path = dir / entry.at("file").get<std::string>();
        const std::vector<char> manifest = read_file_bytes(path);
        const std::string sum = checksum_hex(fnv1a64(manifest.data(), manifest.size()));
        if (manifest.size() != entry.at("bytes").get<std::size_t>() ||
            sum != entry.at("fnv1a64").get<std::string>()) {
          throw Error(fmt::format(
              "'{}' is not the optimizer state this checkpoint was saved with ({} bytes, FNV-1a "
              "64 {}; {} records {} bytes, {}): a file copied from another run or step",
              path.string(), manifest.size(), sum, kTrainerFile, entry.at("bytes").dump(),
              entry.at("fnv1a64").get<std::string>()));
        }
      }
      const json optimizer = read_json_file(dir / kOptimizerManifest);
      if (optimizer.at("step").get<std::int64_t>() != step) {
        throw Error(fmt::format("the optimizer state is at step {}, the trainer's at step {}",
                                optimizer.at("step").get<std::int64_t>(), step));
      }
      const json& entry = meta.at("model_files").at(static_cast<std::size_t>(w.rank()));
      const fs::path path = dir / entry.at("file").get<std::string>();
      bytes = read_file_bytes(path);
      Index expected = 0;
      for (const ShardedParam& p : s.model->params())
        expected += p.value.rows() * p.value.cols();
      if (bytes.size() != entry.at("bytes").get<std::size_t>() ||
          bytes.size() != static_cast<std::size_t>(expected) * sizeof(float)) {
        throw Error(fmt::format("'{}' has {} bytes; the manifest says {}, this model needs {}",
                                path.string(), bytes.size(), entry.at("bytes").dump(),
                                static_cast<std::size_t>(expected) * sizeof(float)));
      }
      verify_checksum(path, bytes, entry.at("fnv1a64").get<std::string>());
    } catch (const json::exception& e) {
      throw Error(
          fmt::format("'{}' is malformed: {}", (dir / kTrainerFile).string(), json_error_text(e)));
    }
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const std::string what = fmt::format("train: resuming from '{}'", where.string());
  agree_or_throw(w, failure.empty(), what, failure);
  // Each rank read the folder rank 0 chose from its own disk (node-local folders under one path
  // may hold another run or step): trainer.json, which binds every other file of the checkpoint
  // by its checksum (checked above), must be one content on every rank before anything changes.
  agree(w, digest,
        fmt::format("{}: the ranks read different checkpoints in '{}' (its {} differs: the "
                    "folder holds another run or step on some nodes)",
                    what, dir.string(), kTrainerFile),
        fmt::format("{} FNV-1a 64 {}, step {}", kTrainerFile, checksum_hex(digest), step));
  // Muon::load checks its own files on every rank and changes nothing on failure.
  s.muon->load(dir / "optimizer");
  std::size_t offset = 0;
  for (ShardedParam& p : s.model->params()) {
    const std::size_t n = p.value.values().size() * sizeof(float);
    std::memcpy(p.value.data(), bytes.data() + offset, n);
    offset += n;
  }
  s.upload_values();
  s.step = step;
  s.run_id = run_id;
  s.resumed_from = dir;
}

}  // namespace distmuon
