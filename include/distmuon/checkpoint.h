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
// Every file is written atomically (temporary file, fsync, rename); the manifest is written
// last, by rank 0, after every rank file exists, so a directory holds either the previous
// complete checkpoint or a mismatch that load() refuses.
//
// Checksum: FNV-1a 64 (fnv1a64 in file_io.h) over the file's bytes, stored as 16 hex digits. It
// detects corruption and truncation, not tampering.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "distmuon/file_io.h"

namespace distmuon {

inline constexpr int kCheckpointVersion = 1;
inline constexpr const char* kCheckpointFormat = "distmuon-optimizer-checkpoint";
inline constexpr const char* kManifestName = "manifest.json";
std::string checkpoint_rank_file(int rank);  // "rank-00003.bin"

}  // namespace distmuon
