#pragma once
// Optimizer checkpoints (written by Muon::save, read by Muon::load).
//
// Layout of a checkpoint directory:
//   manifest.json      format, version, step, world size, options, the parameters (full shape,
//                      sharding, group sizes) and, per rank, its file, size, checksum and where
//                      each state tensor of each parameter lies in it (offset, shape, TP/GTP
//                      coordinates, resolved tp_mode)
//   rank-NNNNN.bin     that rank's state tensors, float32 little-endian, back to back: Muon
//                      momentum shards, AdamW first and second moments (padding rows included)
// Every rank names the same directory (agree_on_checkpoint_folder; ranks saving into different
// folders are refused on every rank, both paths named). The files go into a staging folder
// beside the directory (staging_dir_of: ".NAME.partial"), each written atomically (temporary
// file, fsync, rename); the manifest is written last, by rank 0, after every rank file exists,
// and the staging folder then replaces the directory in one atomic exchange
// (replace_dir_atomic): the directory holds the previous complete checkpoint until the new one
// is complete, never a mixture.
//
// Checksum: FNV-1a 64 (fnv1a64 in file_io.h) over the file's bytes, stored as 16 hex digits. It
// detects corruption and truncation, not tampering.
//
// Loading: every rank reads the manifest and the rank files it needs from its own view of the
// folder (node-local disks may hold another run or step under the same path). The ranks agree on
// the manifest's FNV-1a 64 before anything changes, and each rank file is checked against the
// manifest's checksum, so a load either installs one checkpoint on every rank or changes
// nothing anywhere. A state that is not finite is never saved (Muon::save refuses it on every
// rank) and never loaded.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "distmuon/file_io.h"

namespace distmuon {

inline constexpr int kCheckpointVersion = 1;
inline constexpr const char* kCheckpointFormat = "distmuon-optimizer-checkpoint";
inline constexpr const char* kManifestName = "manifest.json";
std::string checkpoint_rank_file(int rank);  // "rank-00003.bin"

class Communicator;
// Collective. Throws CollectiveError on every rank unless every rank names the same folder (the
// FNV-1a 64 hash of its absolute, normalized path agreed with agree_on): "<what>: the ranks name
// different folders (every rank saves into one): rank(s) 1 of 2 differ from rank 0: rank 0 has
// '/data/ckpt_0', rank 1 has '/data/ckpt_1'".
void agree_on_checkpoint_folder(const Communicator& world, const std::filesystem::path& dir,
                                std::string_view what);

}  // namespace distmuon
