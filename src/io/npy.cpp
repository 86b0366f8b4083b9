#include "distmuon/npy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "distmuon/error.h"
#include "distmuon/file_io.h"
#include "io/npy_header.h"

namespace distmuon {
namespace {

static_assert(std::endian::native == std::endian::little,
              "distmuon's .npy support assumes a little-endian host");

constexpr char kMagic[] = "\x93NUMPY";

[[noreturn]] void bad(const std::filesystem::path& path, const std::string& what) {
  throw Error(fmt::format("read_npy '{}': {}", path.string(), what));
}

std::string errno_str() {
  return std::strerror(errno);
}

// An empty matrix (a zero dimension) holds no data, so the file's size bounds nothing: its other
// dimension is refused above this (a header claiming 999999999999 x 0 is corrupt, and the
// per-row work downstream would run out of memory).
constexpr Index kMaxEmptyExtent = Index{1} << 24;

}  // namespace

Matrix read_npy(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) bad(path, "cannot open: " + errno_str());
  char magic[6] = {};
  if (!in.read(magic, 6) || std::memcmp(magic, kMagic, 6) != 0)
    bad(path, "not a .npy file (bad magic)");
  unsigned char version[2] = {};
  if (!in.read(reinterpret_cast<char*>(version), 2)) bad(path, "truncated before the version");
  std::size_t header_len = 0;
  if (version[0] == 1) {
    unsigned char len[2];
    if (!in.read(reinterpret_cast<char*>(len), 2)) bad(path, "truncated header length");
    header_len = len[0] | (static_cast<std::size_t>(len[1]) << 8);
  } else if (version[0] == 2 || version[0] == 3) {
    unsigned char len[4];
    if (!in.read(reinterpret_cast<char*>(len), 4)) bad(path, "truncated header length");
    header_len = len[0] | (static_cast<std::size_t>(len[1]) << 8) |
                 (static_cast<std::size_t>(len[2]) << 16) |
                 (static_cast<std::size_t>(len[3]) << 24);
  } else {
    bad(path, fmt::format("unsupported format version {}.{}", version[0], version[1]));
  }
  if (header_len > (1u << 20))
    bad(path, fmt::format("header length {} is implausible", header_len));
  std::string header(header_len, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header_len)))
    bad(path, "truncated header");

  detail::NpyHeader h;
  try {
    h = detail::parse_npy_header(header);
  } catch (const Error& e) {
    bad(path, e.what());
  }
  const std::string& dtype = h.descr;
  // '|f4' ("byte order not applicable") is float32 in native order to numpy.load, as '=f4' is.
  if (dtype != "<f4" && dtype != "=f4" && dtype != "|f4" && dtype != "f4") {
    bad(path,
        fmt::format("dtype '{}' is not float32 ('<f4'); convert with arr.astype(numpy.float32)",
                    dtype));
  }
  if (h.fortran_order) {
    bad(path, "Fortran-ordered arrays are not supported; save numpy.ascontiguousarray(arr)");
  }
  const std::vector<Index>& dims = h.shape;
  const std::string shape_text =
      fmt::format("({}{})", fmt::join(dims, ", "), dims.size() == 1 ? "," : "");
  if (dims.size() != 2)
    bad(path, fmt::format("array has rank {} (shape {}); a 2-D matrix is required", dims.size(),
                          shape_text));
  if ((dims[0] == 0 || dims[1] == 0) && std::max(dims[0], dims[1]) > kMaxEmptyExtent) {
    bad(path, fmt::format("an empty matrix of shape {} is implausible: with a zero dimension the "
                          "other may be at most {}",
                          shape_text, kMaxEmptyExtent));
  }

  // Compare with the file size before allocating, so that a corrupt shape cannot ask for an
  // absurd allocation and a short or long file is reported as such.
  std::error_code ec;
  const auto file_size = std::filesystem::file_size(path, ec);
  if (ec) bad(path, "cannot stat: " + ec.message());
  const auto data_offset = static_cast<std::uintmax_t>(in.tellg());
  const std::uintmax_t available = file_size - data_offset;
  const auto rows = static_cast<std::uintmax_t>(dims[0]);
  const auto cols = static_cast<std::uintmax_t>(dims[1]);
  const bool fits = cols == 0 || rows <= available / sizeof(float) / cols;
  const std::uintmax_t bytes = fits ? sizeof(float) * rows * cols : 0;
  if (!fits || bytes > available) {
    bad(path,
        fmt::format(
            "truncated data: a {} float32 matrix needs {} bytes, the file has {} after the header",
            shape_str(dims[0], dims[1]), fits ? fmt::format("{}", bytes) : "more", available));
  }
  if (bytes < available) {
    bad(path, fmt::format("{} unexpected bytes after the data of a {} float32 matrix",
                          available - bytes, shape_str(dims[0], dims[1])));
  }
  Matrix m(dims[0], dims[1]);
  if (bytes > 0 &&
      !in.read(reinterpret_cast<char*>(m.data()), static_cast<std::streamsize>(bytes))) {
    bad(path, fmt::format("read of {} data bytes failed: {}", bytes, errno_str()));
  }
  return m;
}

void write_npy(const std::filesystem::path& path, ConstMatrixView m) {
  std::string header = fmt::format(
      "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", m.rows, m.cols);
  // Pad so that magic + version + length + header + '\n' is a multiple of 64 bytes.
  const std::size_t preamble = 6 + 2 + 2;
  const std::size_t total = preamble + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::vector<char> buf;
  buf.reserve(preamble + header.size() + sizeof(float) * static_cast<std::size_t>(m.size()));
  buf.insert(buf.end(), kMagic, kMagic + 6);
  buf.push_back(1);
  buf.push_back(0);
  buf.push_back(static_cast<char>(header.size() & 0xff));
  buf.push_back(static_cast<char>((header.size() >> 8) & 0xff));
  buf.insert(buf.end(), header.begin(), header.end());
  for (Index i = 0; i < m.rows; ++i) {
    const char* row = reinterpret_cast<const char*>(m.data + i * m.ld);
    buf.insert(buf.end(), row, row + sizeof(float) * static_cast<std::size_t>(m.cols));
  }
  write_file_atomic(path, buf.data(), buf.size());
}

}  // namespace distmuon
