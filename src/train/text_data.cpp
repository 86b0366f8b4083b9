// Byte-level text data: split, windows, deterministic sampling, unigram entropy.
#include "distmuon/text_data.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <iterator>
#include <numeric>

#include "distmuon/error.h"
#include "distmuon/json_file.h"
#include "distmuon/memory_check.h"
#include "train/counter_rng.h"
#include "train/train_names.h"

namespace distmuon {

const char* to_string(Split split) {
  return detail::name_of(split);
}

TextData::TextData(std::vector<std::uint8_t> bytes, const TextDataOptions& options)
    : bytes_(std::move(bytes)), options_(options) {
  const Index c = options_.context;
  if (c < 1) throw Error(fmt::format("text data: context {} must be positive", c));
  if (!(options_.val_fraction > 0.0 && options_.val_fraction < 1.0)) {
    throw Error(fmt::format("text data: val_fraction {} must be in (0, 1)", options_.val_fraction));
  }
  if (options_.split_block <= c) {
    throw Error(fmt::format("text data: split_block {} must exceed the context {}",
                            options_.split_block, c));
  }
  const Index size = static_cast<Index>(bytes_.size());
  const Index blocks = (size + options_.split_block - 1) / options_.split_block;
  if (blocks < 2) {
    throw Error(fmt::format("text data: {} bytes make {} block(s) of {}; a split needs at least 2",
                            size, blocks, options_.split_block));
  }
  // A seeded permutation of the blocks (each block's rank in hash order); the first ones validate.
  std::vector<Index> order(static_cast<std::size_t>(blocks));
  std::iota(order.begin(), order.end(), Index{0});
  const auto key = [&](Index b) {
    return detail::hash_keys(
        {options_.seed, 0x73706c6974ULL /* "split" */, static_cast<std::uint64_t>(b)});
  };
  std::sort(order.begin(), order.end(),
            [&](Index a, Index b) { return std::pair(key(a), a) < std::pair(key(b), b); });
  const Index val_blocks = std::clamp<Index>(
      std::llround(options_.val_fraction * static_cast<double>(blocks)), 1, blocks - 1);
  std::vector<bool> is_val(static_cast<std::size_t>(blocks), false);
  for (Index i = 0; i < val_blocks; ++i)
    is_val[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])] = true;

  for (Index b = 0; b < blocks;) {
    Index e = b;
    while (e < blocks && is_val[static_cast<std::size_t>(e)] == is_val[static_cast<std::size_t>(b)])
      ++e;
    const Index begin = b * options_.split_block, end = std::min(size, e * options_.split_block);
    auto& segs = is_val[static_cast<std::size_t>(b)] ? validation_ : train_;
    Index& count = is_val[static_cast<std::size_t>(b)] ? validation_windows_ : train_windows_;
    segs.push_back({begin, end - begin, count});
    count += std::max<Index>(0, end - begin - c);
    b = e;
  }
  for (Split s : {Split::kTrain, Split::kValidation}) {
    if (windows(s) == 0) {
      throw Error(fmt::format("text data: the {} split of {} bytes has no window of {} + 1 bytes",
                              to_string(s), split_bytes(s), c));
    }
  }
}

TextData TextData::from_file(const std::string& path, const TextDataOptions& options) {
  // Read whole and held twice while the splits are built: the size is checked against memory
  // before anything is read (a 40 GB file is refused at once, not after minutes of reading).
  const std::uint64_t size = check_input_file(path, "text data", kMaxTextDataBytes);
  check_memory_fits(
      2.0 * static_cast<double>(size),
      fmt::format("text data '{}' ({} bytes, held twice while it is split)", path, size));
  const std::string text = read_text_file(path, "text data", kMaxTextDataBytes);
  std::vector<std::uint8_t> bytes(text.begin(), text.end());
  try {
    return TextData(std::move(bytes), options);
  } catch (const Error& e) {
    throw Error(fmt::format("{} ({})", e.what(), path));
  }
}

Index TextData::windows(Split split) const {
  return split == Split::kTrain ? train_windows_ : validation_windows_;
}

Index TextData::split_bytes(Split split) const {
  Index n = 0;
  for (const Segment& s : segments(split))
    n += s.length;
  return n;
}

Index TextData::target_position(Split split, Index i) const {
  if (i < 0 || i >= windows(split)) {
    throw Error(fmt::format("text data: window {} outside the {} split's {} windows", i,
                            to_string(split), windows(split)));
  }
  const auto& segs = segments(split);
  // The last segment whose first window is <= i (segments without windows share first_window
  // with the next one, so upper_bound skips them).
  const auto it = std::upper_bound(segs.begin(), segs.end(), i,
                                   [](Index v, const Segment& s) { return v < s.first_window; });
  const Segment& seg = *std::prev(it);
  return seg.begin + options_.context + (i - seg.first_window);
}

CharBatch TextData::batch_of(Split split, std::span<const Index> indices) const {
  CharBatch batch;
  batch.context = options_.context;
  batch.tokens.reserve(indices.size() * static_cast<std::size_t>(options_.context));
  batch.targets.reserve(indices.size());
  for (Index i : indices) {
    const Index p = target_position(split, i);
    for (Index j = p - options_.context; j < p; ++j)
      batch.tokens.push_back(bytes_[static_cast<std::size_t>(j)]);
    batch.targets.push_back(bytes_[static_cast<std::size_t>(p)]);
  }
  return batch;
}

CharBatch TextData::train_batch(std::uint64_t step, int rank, int ranks, Index global_batch) const {
  if (ranks < 1 || rank < 0 || rank >= ranks)
    throw Error(fmt::format("text data: rank {} of {}", rank, ranks));
  if (global_batch < 1 || global_batch % ranks != 0) {
    throw Error(
        fmt::format("text data: global batch {} must be a positive multiple of the {} ranks",
                    global_batch, ranks));
  }
  const Index local = global_batch / ranks;
  std::vector<Index> indices(static_cast<std::size_t>(local));
  for (Index k = 0; k < local; ++k) {
    const auto global_k = static_cast<std::uint64_t>(rank * local + k);
    const std::uint64_t bits =
        detail::hash_keys({options_.seed, 0x6261746368ULL /* "batch" */, step, global_k});
    indices[static_cast<std::size_t>(k)] =
        static_cast<Index>(detail::uniform_below(bits, static_cast<std::uint64_t>(train_windows_)));
  }
  return batch_of(Split::kTrain, indices);
}

CharBatch TextData::validation_batch(int rank, int ranks, Index count) const {
  if (ranks < 1 || rank < 0 || rank >= ranks)
    throw Error(fmt::format("text data: rank {} of {}", rank, ranks));
  if (count < 1) throw Error(fmt::format("text data: validation count {} must be positive", count));
  const Index total = std::min(count, validation_windows_);
  const Index base = total / ranks, extra = total % ranks;
  const Index first = rank * base + std::min<Index>(rank, extra),
              mine = base + (rank < extra ? 1 : 0);
  std::vector<Index> indices(static_cast<std::size_t>(mine));
  for (Index k = 0; k < mine; ++k) {
    // Evenly spread: window floor(i W / total) for i in [0, total); exact in 128-bit arithmetic.
    const auto i = static_cast<detail::UInt128>(first + k);
    indices[static_cast<std::size_t>(k)] =
        static_cast<Index>(i * static_cast<detail::UInt128>(validation_windows_) /
                           static_cast<detail::UInt128>(total));
  }
  return batch_of(Split::kValidation, indices);
}

double unigram_entropy(std::span<const std::uint8_t> bytes) {
  if (bytes.empty()) return 0.0;
  std::array<std::uint64_t, 256> counts{};
  for (std::uint8_t b : bytes)
    ++counts[b];
  const double n = static_cast<double>(bytes.size());
  double h = 0.0;
  for (std::uint64_t c : counts) {
    if (c == 0) continue;
    const double p = static_cast<double>(c) / n;
    h -= p * std::log(p);
  }
  return h;
}

}  // namespace distmuon
