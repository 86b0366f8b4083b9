// File helpers (file_io.h): atomic writes, whole-file reads, JSON files, FNV-1a 64 checksums.
#include "distmuon/file_io.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "distmuon/error.h"

namespace distmuon {

void check_output_file(const std::filesystem::path& path, std::string_view what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (st.type() == fs::file_type::not_found || st.type() == fs::file_type::regular) return;
  const char* kind = "not a regular file";
  switch (st.type()) {
    case fs::file_type::directory:
      kind = "is a directory";
      break;
    case fs::file_type::character:
    case fs::file_type::block:
      kind = "is a device";
      break;
    case fs::file_type::fifo:
      kind = "is a FIFO";
      break;
    case fs::file_type::socket:
      kind = "is a socket";
      break;
    default:
      if (ec)
        throw Error(fmt::format("{} '{}': cannot stat: {}", what, path.string(), ec.message()));
      break;
  }
  throw Error(fmt::format("{} '{}': {}, not a regular file; give the path of a file to write", what,
                          path.string(), kind));
}

void write_file_atomic(const std::filesystem::path& path, const void* data, std::size_t size) {
  check_output_file(path, "write");
  const std::filesystem::path tmp = path.string() + fmt::format(".tmp.{}", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw Error(fmt::format("write '{}': cannot create '{}': {}", path.string(), tmp.string(),
                            std::strerror(errno)));
  auto fail = [&](const std::string& what) {
    const std::string err = std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(fmt::format("write '{}': {}: {}", path.string(), what, err));
  };
  const char* p = static_cast<const char*>(data);
  std::size_t left = size;
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write failed");
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) fail("fsync failed");
  if (::close(fd) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error(fmt::format("write '{}': close failed: {}", path.string(), err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error(
        fmt::format("write '{}': rename from '{}' failed: {}", path.string(), tmp.string(), err));
  }
  const std::filesystem::path dir =
      path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {  // directory fsync makes the rename durable; not all file systems support it
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::vector<char> read_file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("cannot open '{}': {}", path.string(), std::strerror(errno)));
  std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad())
    throw Error(fmt::format("read of '{}' failed: {}", path.string(), std::strerror(errno)));
  return bytes;
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  const std::vector<char> bytes = read_file_bytes(path);
  try {
    return nlohmann::json::parse(bytes.begin(), bytes.end());
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("'{}' is not valid JSON: {}", path.string(), e.what()));
  }
}

std::string checksum_hex(std::uint64_t checksum) {
  return fmt::format("{:016x}", checksum);
}

void verify_checksum(const std::filesystem::path& path, const std::vector<char>& bytes,
                     const std::string& expected_hex) {
  const std::string sum = checksum_hex(fnv1a64(bytes.data(), bytes.size()));
  if (sum != expected_hex) {
    throw Error(fmt::format("'{}' fails its checksum (FNV-1a 64 {}, manifest {})", path.string(),
                            sum, expected_hex));
  }
}

}  // namespace distmuon
