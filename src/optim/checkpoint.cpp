// Muon::save / Muon::load (format in checkpoint.h).
#include "distmuon/checkpoint.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <optional>

#include "distmuon/agreement.h"
#include "distmuon/cost_model.h"
#include "distmuon/error.h"
#include "distmuon/file_io.h"
#include "distmuon/json_file.h"
#include "optim/muon_impl.h"

namespace distmuon {

std::string checkpoint_rank_file(int rank) {
  return fmt::format("rank-{:05d}.bin", rank);
}

void to_json(nlohmann::json& j, const AutoKey& k) {
  j = {{"m", k.m},
       {"n", k.n},
       {"group_size", k.group_size},
       {"partition_dim", k.partition_dim},
       {"second_group_size", k.second_group_size},
       {"crosses_domain", k.crosses_domain},
       {"steps", k.steps},
       {"use_syrk", k.use_syrk},
       {"elem_size", k.elem_size},
       {"algorithm", to_string(k.algorithm)},
       {"gram_formations", k.gram_formations},
       {"batch", k.batch},
       {"batched_products", k.batched_products}};
}

void from_json(const nlohmann::json& j, AutoKey& k) {
  j.at("m").get_to(k.m);
  j.at("n").get_to(k.n);
  j.at("group_size").get_to(k.group_size);
  j.at("partition_dim").get_to(k.partition_dim);
  j.at("second_group_size").get_to(k.second_group_size);
  j.at("crosses_domain").get_to(k.crosses_domain);
  j.at("steps").get_to(k.steps);
  j.at("use_syrk").get_to(k.use_syrk);
  j.at("elem_size").get_to(k.elem_size);
  // Absent in checkpoints written before the Gram algorithm: the standard-only key.
  k.algorithm = j.contains("algorithm") ? parse_ns_algorithm(j.at("algorithm").get<std::string>())
                                        : NsAlgorithm::kStandard;
  k.gram_formations = j.value("gram_formations", 1);
  // Absent before batched parameters were priced as batches: one matrix.
  k.batch = j.value("batch", Index{1});
  k.batched_products = j.value("batched_products", false);
}

namespace {

const std::vector<std::string>& tensor_names(bool muon) {
  static const std::vector<std::string> muon_names{"momentum"};
  static const std::vector<std::string> adamw_names{"exp_avg", "exp_avg_sq"};
  return muon ? muon_names : adamw_names;
}

// Rank files of a checkpoint, read and verified (size, checksum) on first use.
class RankFiles {
 public:
  RankFiles(std::filesystem::path dir, const nlohmann::json& ranks)
      : dir_(std::move(dir)), ranks_(ranks) {}
  const std::vector<char>& get(int rank) {
    auto it = files_.find(rank);
    if (it != files_.end()) return it->second;
    const auto& entry = ranks_.at(static_cast<std::size_t>(rank));
    const auto path = dir_ / entry.at("file").get<std::string>();
    std::vector<char> bytes = read_file_bytes(path);
    const auto expected = entry.at("bytes").get<std::size_t>();
    if (bytes.size() != expected) {
      throw Error(
          fmt::format("checkpoint file '{}' has {} bytes, the manifest says {} (truncated?)",
                      path.string(), bytes.size(), expected));
    }
    verify_checksum(path, bytes, entry.at("fnv1a64").get<std::string>());
    return files_.emplace(rank, std::move(bytes)).first->second;
  }

 private:
  std::filesystem::path dir_;
  const nlohmann::json& ranks_;
  std::map<int, std::vector<char>> files_;
};

// The saved rank holding (tp_rank, gtp_rank, expert_rank) of parameter i; prefers `self`.
int find_source(const nlohmann::json& ranks, std::size_t i, int tp_rank, int gtp_rank,
                int expert_rank, int self) {
  int found = -1;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const auto& e = ranks[r].at("params").at(i);
    if (e.at("tp_rank").get<int>() == tp_rank && e.at("gtp_rank").get<int>() == gtp_rank &&
        e.at("expert_rank").get<int>() == expert_rank) {
      if (static_cast<int>(r) == self) return self;
      if (found < 0) found = static_cast<int>(r);
    }
  }
  if (found < 0) {
    throw Error(fmt::format("no saved rank holds TP rank {}, GTP rank {}, expert rank {}", tp_rank,
                            gtp_rank, expert_rank));
  }
  return found;
}

// The current parameter list must match the saved one, except for the GTP layout (resharded).
void check_params(const nlohmann::json& saved, const nlohmann::json& current) {
  if (saved.size() != current.size()) {
    throw Error(fmt::format("the checkpoint has {} parameters, the optimizer {}", saved.size(),
                            current.size()));
  }
  for (std::size_t i = 0; i < saved.size(); ++i) {
    for (const char* field : {"name", "rows", "cols", "role", "muon", "tp_partition_dim", "tp_size",
                              "expert", "qkv_split"}) {
      if (saved[i].at(field) != current[i].at(field)) {
        throw Error(fmt::format("parameter {} ('{}'): {} is {} in the checkpoint but {} now{}", i,
                                current[i].at("name").get<std::string>(), field,
                                saved[i].at(field).dump(), current[i].at(field).dump(),
                                std::string(field) == "tp_size"
                                    ? " (only the GTP group size may change on load)"
                                    : ""));
      }
    }
    // Absent from checkpoints written before batched parameters: one matrix.
    const auto saved_batch = saved[i].value("batch", Index{1});
    if (saved_batch != current[i].at("batch").get<Index>()) {
      throw Error(fmt::format(
          "parameter {} ('{}'): a batch of {} matrices in the checkpoint but {} now", i,
          current[i].at("name").get<std::string>(), saved_batch, current[i].at("batch").dump()));
    }
    // Absent from checkpoints written before uneven TP shards: none then.
    const auto saved_tp_pad = saved[i].value("tp_pad_length", Index{0});
    if (saved_tp_pad != current[i].at("tp_pad_length").get<Index>()) {
      throw Error(fmt::format("parameter {} ('{}'): TP pad is {} in the checkpoint but {} now", i,
                              current[i].at("name").get<std::string>(), saved_tp_pad,
                              current[i].at("tp_pad_length").dump()));
    }
  }
}

}  // namespace

void agree_on_checkpoint_folder(const Communicator& world, const std::filesystem::path& dir,
                                std::string_view what) {
  std::string normal;  // empty: no folder
  if (!dir.empty()) {
    std::error_code ec;
    std::filesystem::path absolute = std::filesystem::absolute(dir, ec);
    if (ec) absolute = dir;
    normal = absolute.lexically_normal().string();
    while (normal.size() > 1 && normal.back() == '/')
      normal.pop_back();
  }
  agree_on(world, normal,
           fmt::format("{}: the ranks name different folders (every rank saves into one)", what));
}

void Muon::save(const std::filesystem::path& dir) {
  Impl& s = *impl_;
  s.prepare();
  const int rank = s.world.rank();
  const std::string what = fmt::format("Muon::save '{}'", dir.string());
  agree_on_checkpoint_folder(s.world, dir, what);
  // Written into a staging folder that replaces dir once complete (replace_dir_atomic): an
  // earlier checkpoint in dir stays loadable until then.
  const std::filesystem::path staging = staging_dir_of(dir);
  run_on_root(s.world, what, [&] {
    std::error_code ec;
    std::filesystem::remove_all(staging, ec);  // left by a save that did not finish
    if (!ec) std::filesystem::create_directories(staging, ec);
    if (ec) throw Error(fmt::format("cannot create '{}': {}", staging.string(), ec.message()));
  });
  std::string reason;
  // The rank files into staging, the manifest last, then staging replaces dir.
  const auto write_staged = [&] {
    nlohmann::json entry;
    try {
      std::vector<char> bytes;
      nlohmann::json params = nlohmann::json::array();
      for (const ParamState& p : s.params) {
        nlohmann::json tensors = nlohmann::json::array();
        const auto& names = tensor_names(p.muon);
        for (std::size_t k = 0; k < names.size(); ++k) {
          // The state lives in the backend's memory: copied to host staging (in float32, a
          // bfloat16 momentum unpacked), then to the bytes.
          const Matrix t = s.state_to_host(p, k);
          // A checkpoint holds finite values only: a state that overflowed is refused on every
          // rank before anything replaces the folder.
          if (const auto at = cpu_compute().find_non_finite(t.view())) {
            throw Error(fmt::format(
                "the {} of parameter '{}' has a non-finite value at ({}, {}) on rank {}; a "
                "checkpoint holds finite values only, nothing was written",
                names[k], p.spec.name, at->row, at->col, rank));
          }
          tensors.push_back({{"name", names[k]},
                             {"offset", bytes.size()},
                             {"rows", t.rows()},
                             {"cols", t.cols()}});
          const auto* raw = reinterpret_cast<const char*>(t.data());
          bytes.insert(bytes.end(), raw, raw + sizeof(float) * static_cast<std::size_t>(t.size()));
        }
        nlohmann::json e = {{"tp_rank", p.layout.tp_rank},
                            {"gtp_rank", p.layout.gtp_rank},
                            {"expert_rank", p.spec.expert_rank},
                            {"tensors", tensors}};
        if (p.mode) {
          e["mode"] = to_string(*p.mode);
          e["algorithm"] = to_string(p.algorithm);
        }
        if (p.auto_key) {
          // Whether the backend batches its products is the machine's, as its profile is: not
          // the checkpoint's (a checkpoint reads the same on every backend; loading takes the
          // loading backend's).
          e["auto_key"] = *p.auto_key;
          e["auto_key"].erase("batched_products");
        }
        params.push_back(e);
      }
      const std::string file = checkpoint_rank_file(rank);
      write_file_atomic(staging / file, bytes.data(), bytes.size());
      entry = {{"rank", rank},
               {"file", file},
               {"bytes", bytes.size()},
               {"fnv1a64", checksum_hex(fnv1a64(bytes.data(), bytes.size()))},
               {"params", params}};
    } catch (const std::exception& e) {
      reason = e.what();
    }
    agree_or_throw(s.world, reason.empty(), what, reason);

    const std::vector<std::string> entries = all_gather_strings(s.world, entry.dump());
    run_on_root(s.world, what + " (manifest)", [&] {
      nlohmann::json ranks = nlohmann::json::array();
      for (const std::string& e : entries)
        ranks.push_back(nlohmann::json::parse(e));
      const nlohmann::json manifest = {
          {"format", kCheckpointFormat},  {"version", kCheckpointVersion}, {"step", s.step},
          {"world_size", s.world.size()}, {"config", s.config()},          {"ranks", ranks}};
      const std::string text = manifest.dump(1);
      write_file_atomic(staging / kManifestName, text.data(), text.size());
      replace_dir_atomic(staging, dir);
    });
  };
  try {
    write_staged();
  } catch (...) {
    // Every rank throws (the failures are agreed): rank 0 removes the partial folder.
    std::error_code ec;
    if (rank == 0) std::filesystem::remove_all(staging, ec);
    throw;
  }
}

namespace {

// What a checkpoint holds for one parameter, resharded to this rank's layout.
struct LoadedParam {
  std::vector<Matrix> tensors;  // host staging, copied into the backend's state by restore
  std::optional<AutoChoice> choice;
  std::optional<AutoKey> key;
};

// The manifest of a checkpoint, checked against this optimizer: format and version, the same
// parameters (shapes, groups may differ), one rank entry per saved rank. Warns (rank 0) when the
// saved options differ from the current ones, which are kept.
struct CheckpointManifest {
  std::filesystem::path path;
  nlohmann::json json;
  const nlohmann::json& params() const { return json.at("config").at("params"); }
  const nlohmann::json& ranks() const { return json.at("ranks"); }
  std::int64_t step() const { return json.at("step").get<std::int64_t>(); }
};

// The manifest's digest (FNV-1a 64 of its bytes) is set first, so that a manifest that fails a
// later check is still agreed on by content.
CheckpointManifest read_manifest(Muon::Impl& s, const std::filesystem::path& dir,
                                 std::uint64_t& digest) {
  CheckpointManifest out{dir / kManifestName, {}};
  const std::vector<char> bytes = read_file_bytes(out.path);
  digest = fnv1a64(bytes.data(), bytes.size());
  out.json = parse_json_text(std::string_view(bytes.data(), bytes.size()),
                             fmt::format("checkpoint manifest '{}'", out.path.string()));
  const nlohmann::json& manifest = out.json;
  if (manifest.value("format", "") != kCheckpointFormat ||
      manifest.value("version", 0) != kCheckpointVersion) {
    throw Error(fmt::format("'{}' is not a {} version {}", out.path.string(), kCheckpointFormat,
                            kCheckpointVersion));
  }
  const nlohmann::json& cfg = manifest.at("config");
  const nlohmann::json current = s.config();
  check_params(cfg.at("params"), current.at("params"));
  // An option absent from the checkpoint (one added after it was written) counts as its default.
  nlohmann::json saved_options = MuonOptions{};
  saved_options.merge_patch(cfg.at("options"));
  if (saved_options != current.at("options") && s.world.rank() == 0) {
    spdlog::warn(
        "Muon::load: the checkpoint was written with other options; keeping the "
        "current ones (differences: {})",
        nlohmann::json::diff(saved_options, current.at("options")).dump());
  }
  const nlohmann::json& ranks = manifest.at("ranks");
  if (ranks.size() != manifest.at("world_size").get<std::size_t>()) {
    throw Error(fmt::format("'{}' lists {} rank files for a world of {}", out.path.string(),
                            ranks.size(), manifest.at("world_size").dump()));
  }
  return out;
}

// Parameter i's state for this rank's shard, read row by row from the saved shards of the same
// TP-local tensor (the GTP size and padding may have changed), and its tp_mode=auto decision
// when the layout is unchanged.
LoadedParam reshard(const Muon::Impl& s, const CheckpointManifest& manifest, RankFiles& files,
                    std::size_t i) {
  const nlohmann::json& ranks = manifest.ranks();
  const ParamState& p = s.params[i];
  const detail::ShardLayout& l = p.layout;
  detail::ShardLayout saved = l;  // the saved GTP layout of the same TP-local tensor
  saved.gtp_size = manifest.params()[i].at("gtp_size").get<int>();
  saved.pad = manifest.params()[i].at("pad_length").get<Index>();
  saved.validate(fmt::format("checkpoint parameter '{}'", p.spec.name));
  const Index src_rows = saved.shard_rows();
  LoadedParam out;
  const auto& names = tensor_names(p.muon);
  out.tensors.assign(names.size(), Matrix(l.batch * l.shard_rows(), l.n_tp()));
  std::map<int, int> source;  // saved GTP rank -> saved world rank
  // Row j of slice b: row b * shard_rows + j of the tensors (a batch stacks its slices' shards).
  for (Index bj = 0; bj < l.batch * l.shard_rows(); ++bj) {
    const Index b = bj / l.shard_rows(), j = bj % l.shard_rows();
    const Index row = l.gtp_rank * l.shard_rows() + j;  // TP-local row
    if (row >= l.m_tp()) continue;                      // padding: zero
    const int g = static_cast<int>(row / src_rows);
    if (!source.contains(g)) {
      source[g] = find_source(ranks, i, l.tp_rank, g, p.spec.expert_rank, s.world.rank());
    }
    const std::vector<char>& bytes = files.get(source[g]);
    const auto& tensors = ranks[static_cast<std::size_t>(source[g])].at("params")[i].at("tensors");
    for (std::size_t k = 0; k < names.size(); ++k) {
      const auto& t = tensors.at(k);
      const auto offset = t.at("offset").get<std::size_t>();
      const auto row_bytes = sizeof(float) * static_cast<std::size_t>(l.n_tp());
      const Index saved_rows = l.batch * src_rows;
      if (t.at("name") != names[k] || t.at("rows").get<Index>() != saved_rows ||
          t.at("cols").get<Index>() != l.n_tp() ||
          offset + row_bytes * static_cast<std::size_t>(saved_rows) > bytes.size()) {
        throw Error(fmt::format(
            "checkpoint tensor {} of '{}' on rank {} does not match a {} "
            "shard of {}",
            t.dump(), p.spec.name, source[g], names[k], shape_str(saved_rows, l.n_tp())));
      }
      const Index saved_row = b * src_rows + row % src_rows;
      std::copy_n(bytes.data() + offset + row_bytes * static_cast<std::size_t>(saved_row),
                  row_bytes, reinterpret_cast<char*>(out.tensors[k].view().row_block(bj, 1).data));
    }
  }
  // A checkpoint holds finite values only: one that does not (written by another program, or
  // damaged with a matching checksum) is refused before anything changes.
  for (std::size_t k = 0; k < names.size(); ++k) {
    if (const auto at = cpu_compute().find_non_finite(out.tensors[k].view())) {
      throw Error(fmt::format(
          "the saved {} of parameter '{}' has a non-finite value at row {}, column {} of this "
          "rank's part; a checkpoint must hold finite values",
          names[k], p.spec.name, at->row, at->col));
    }
  }
  // A decision of tp_mode=auto is kept when the layout is unchanged and the key it was made for is
  // the key the current options give (the same NS steps, syrk, Gram formations and allowed
  // algorithms; the domain probe is not repeated): a decision made under other options is dropped
  // and the weight planned again. Every rank compares the same saved key with the same options.
  if (s.options.mode_for(p.spec.expert) == TpMode::kAuto && saved.gtp_size == l.gtp_size &&
      p.muon) {
    const int r = find_source(ranks, i, l.tp_rank, l.gtp_rank, p.spec.expert_rank, s.world.rank());
    const auto& e = ranks[static_cast<std::size_t>(r)].at("params")[i];
    auto saved_key =
        e.contains("auto_key") ? std::optional(e.at("auto_key").get<AutoKey>()) : std::nullopt;
    if (saved_key) saved_key->batched_products = s.compute->batches_newton_schulz();  // not saved
    if (saved_key && e.contains("mode") &&
        *saved_key == auto_key(l, s.ns, s.options.ns_algorithm, saved_key->crosses_domain, 4,
                               s.compute->batches_newton_schulz())) {
      out.key = saved_key;
      // "algorithm" is absent in checkpoints written before the Gram algorithm: standard.
      out.choice = AutoChoice{parse_tp_mode(e.at("mode").get<std::string>()),
                              e.contains("algorithm")
                                  ? parse_ns_algorithm(e.at("algorithm").get<std::string>())
                                  : NsAlgorithm::kStandard};
    }
  }
  return out;
}

// Installs the loaded state (every rank has loaded it): the step, the optimizer states and the
// kept tp_mode=auto decisions.
void restore(Muon::Impl& s, std::int64_t step, std::vector<LoadedParam>& loaded) {
  s.step = step;
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    ParamState& p = s.params[i];
    LoadedParam& in = loaded[i];
    for (std::size_t k = 0; k < in.tensors.size(); ++k)
      s.state_from_host(p, k, in.tensors[k].view());
    if (in.choice) {
      p.mode = in.choice->mode;
      p.algorithm = in.choice->algorithm;
      p.auto_key = in.key;
      restore_auto_decision(s, *in.key, *in.choice);
    }
  }
}

}  // namespace

void Muon::load(const std::filesystem::path& dir) {
  Impl& s = *impl_;
  s.prepare();
  std::vector<LoadedParam> loaded;
  std::int64_t step = 0;
  std::string reason;
  std::uint64_t digest = 0;  // of the manifest this rank read
  try {
    const CheckpointManifest manifest = read_manifest(s, dir, digest);
    step = manifest.step();
    RankFiles files(dir, manifest.ranks());
    for (std::size_t i = 0; i < s.params.size(); ++i)
      loaded.push_back(reshard(s, manifest, files, i));
  } catch (const std::exception& e) {
    reason = e.what();
  }
  const std::string what = fmt::format("Muon::load '{}'", dir.string());
  agree_or_throw(s.world, reason.empty(), what, reason);
  // Every rank read its own copy of the folder (node-local disks may hold another run or step
  // under the same path): the manifests must be one content, and with them the rank files, each
  // checked against the manifest's checksum above. A mixture is refused before anything changes.
  agree(s.world, digest,
        fmt::format("{}: the ranks read different checkpoints (their manifests differ: the "
                    "folder holds another run or step on some nodes)",
                    what),
        fmt::format("manifest FNV-1a 64 {}, step {}", checksum_hex(digest), step));
  restore(s, step, loaded);
}

}  // namespace distmuon
