#pragma once
// Byte-level text data for the character-level model: a deterministic train/validation split and
// deterministic batch sampling.
//
// Vocabulary: the 256 byte values (token id = byte), so any file works and the model's shapes do
// not depend on the text.
//
// Split: the text is cut into blocks of `split_block` bytes; a seeded permutation of the blocks
// sends round(val_fraction * blocks) of them (at least one, and at least one left for training)
// to validation. Adjacent blocks of the same split join into one segment. A window is C context
// bytes and the byte after them (its target), all inside one segment, so no window mixes the
// splits; each split has sum over its segments of max(0, length - C) windows.
//
// Sampling: window k of the global training batch of step t is drawn uniformly (with replacement)
// from the training windows by a hash of (seed, t, k). With R data-parallel ranks and a global
// batch of B windows, rank r takes k in [r B / R, (r + 1) B / R): the union over ranks is the
// same for every R, so runs on different rank counts see the same data.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "distmuon/charlm.h"
#include "distmuon/matrix.h"

namespace distmuon {

struct TextDataOptions {
  int context = 16;           // C
  double val_fraction = 0.1;  // share of blocks held out for validation, in (0, 1)
  Index split_block = 512;    // bytes per split block; must exceed C
  std::uint64_t seed = 1;     // split permutation and batch sampling
};

// The text every Debian system ships, used when no file is given.
inline constexpr const char* kDefaultTextPath = "/usr/share/common-licenses/GPL-3";

// The largest training text the trainer reads (it is read whole on every rank and held twice
// while its splits are built).
inline constexpr std::uint64_t kMaxTextDataBytes = std::uint64_t{2} << 30;

enum class Split { kTrain, kValidation };
const char* to_string(Split split);

class TextData {
 public:
  // Throws distmuon::Error when the options are invalid or a split ends up without windows.
  TextData(std::vector<std::uint8_t> bytes, const TextDataOptions& options);
  // Reads the whole file; throws naming the path when it cannot be read, is no regular file (a
  // device such as /dev/zero, a FIFO) or holds more than kMaxTextDataBytes or than memory allows
  // (checked from its size before it is read).
  static TextData from_file(const std::string& path, const TextDataOptions& options);

  const TextDataOptions& options() const { return options_; }
  std::span<const std::uint8_t> bytes() const { return bytes_; }
  // Number of windows of a split.
  Index windows(Split split) const;
  // Bytes of the text that belong to a split.
  Index split_bytes(Split split) const;
  // Position (in the text) of the target of window i of a split, 0 <= i < windows(split).
  Index target_position(Split split, Index i) const;

  // This rank's part of the global training batch of `step` (see the header comment).
  // global_batch must be divisible by ranks.
  CharBatch train_batch(std::uint64_t step, int rank, int ranks, Index global_batch) const;
  // The validation set used for evaluation: `count` windows spread evenly over the validation
  // windows (all of them when count >= windows(kValidation)), no randomness. This rank takes an
  // equal contiguous part; the first (count mod ranks) ranks take one more.
  CharBatch validation_batch(int rank, int ranks, Index count) const;
  // Arbitrary windows of a split, by index.
  CharBatch batch_of(Split split, std::span<const Index> indices) const;

 private:
  struct Segment {
    Index begin = 0, length = 0;
    Index first_window = 0;  // windows of earlier segments of the same split
  };
  const std::vector<Segment>& segments(Split split) const {
    return split == Split::kTrain ? train_ : validation_;
  }

  std::vector<std::uint8_t> bytes_;
  TextDataOptions options_;
  std::vector<Segment> train_, validation_;
  Index train_windows_ = 0, validation_windows_ = 0;
};

// Unigram entropy of the bytes in nats per byte: -sum p log p over the byte frequencies. A model
// that ignores context cannot beat it on text with these statistics; 0 for empty input.
double unigram_entropy(std::span<const std::uint8_t> bytes);

}  // namespace distmuon
