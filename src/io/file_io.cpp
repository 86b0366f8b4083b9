// File helpers (file_io.h): atomic writes, whole-file reads, JSON files, FNV-1a 64 checksums.
#include "distmuon/file_io.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/fault.h"
#include "distmuon/error.h"
#include "distmuon/json_file.h"
#include "distmuon/memory_check.h"

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

namespace {

std::string errno_text() {
  return std::strerror(errno);
}

// fsync of a folder makes renames and creations in it durable; not every file system supports
// it, so a failure is ignored (the data itself was fsynced).
void sync_dir(const std::filesystem::path& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::filesystem::path parent_of(const std::filesystem::path& path) {
  return path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
}

// The path without a trailing separator ("ckpt/" -> "ckpt"), so that it has a file name.
std::filesystem::path without_trailing_separator(const std::filesystem::path& dir) {
  std::filesystem::path p = dir.lexically_normal();
  if (!p.has_filename() && p.has_parent_path() && p.parent_path() != p) p = p.parent_path();
  return p;
}

}  // namespace

void write_file_atomic(const std::filesystem::path& path, const void* data, std::size_t size) {
  check_output_file(path, "write");
  // The file-size limit (ulimit -f) checked first: past it a write raises SIGXFSZ, which ends
  // the process by default and would leave the temporary file behind.
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
      static_cast<std::uint64_t>(size) > static_cast<std::uint64_t>(limit.rlim_cur)) {
    throw Error(fmt::format(
        "write '{}': the file needs {} bytes, over this process's file-size limit of {} bytes "
        "(ulimit -f); nothing was written",
        path.string(), size, static_cast<std::uint64_t>(limit.rlim_cur)));
  }
  const std::filesystem::path tmp = path.string() + fmt::format(".tmp.{}", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw Error(fmt::format("write '{}': cannot create '{}': {}", path.string(), tmp.string(),
                            errno_text()));
  // Every way out before the rename (an error, an exception from the fault hook) closes and
  // removes the temporary file.
  bool renamed = false;
  struct Cleanup {
    const std::filesystem::path& tmp;
    int& fd;
    bool& renamed;
    ~Cleanup() {
      if (fd >= 0) ::close(fd);
      if (!renamed) ::unlink(tmp.c_str());
    }
  } cleanup{tmp, fd, renamed};
  auto fail = [&](const std::string& what) {
    throw Error(fmt::format("write '{}': {}: {}", path.string(), what, errno_text()));
  };
  const char* p = static_cast<const char*>(data);
  std::size_t left = size;
  bool halfway = size == 0;
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write failed");
    }
    p += n;
    left -= static_cast<std::size_t>(n);
    if (!halfway && left <= size / 2) {
      halfway = true;
      detail::fault_point("file-write");  // docs/reliability.md
    }
  }
  if (::fsync(fd) != 0) fail("fsync failed");
  const int closing = fd;
  fd = -1;
  if (::close(closing) != 0) fail("close failed");
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    fail(fmt::format("rename from '{}' failed", tmp.string()));
  renamed = true;
  sync_dir(parent_of(path));
}

std::filesystem::path staging_dir_of(const std::filesystem::path& dir) {
  const std::filesystem::path d = without_trailing_separator(dir);
  return parent_of(d) / fmt::format(".{}.partial", d.filename().string());
}

void sync_tree(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_directory(ec)) sync_dir(it->path());
  }
  sync_dir(dir);
}

void replace_dir_atomic(const std::filesystem::path& staging, const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  const fs::path target = without_trailing_separator(dir);
  sync_tree(staging);
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(target, ec);
  if (st.type() == fs::file_type::not_found) {
    if (::rename(staging.c_str(), target.c_str()) != 0) {
      throw Error(fmt::format("cannot rename '{}' to '{}': {}", staging.string(), target.string(),
                              errno_text()));
    }
  } else if (st.type() != fs::file_type::directory) {
    throw Error(
        fmt::format("'{}' exists and is not a folder; it is not replaced", target.string()));
  } else {
    // One atomic exchange: the folder holds either the complete old or the complete new content
    // at every moment; the old content, now under the staging name, is removed after.
    if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
      fs::remove_all(staging, ec);  // the old content; a leftover is removed by the next save
    } else if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) {
      // A file system without the exchange: the old folder moves aside first, so a crash
      // between the two renames leaves both complete folders, under their temporary names.
      const fs::path old = parent_of(target) / fmt::format(".{}.old", target.filename().string());
      fs::remove_all(old, ec);
      if (::rename(target.c_str(), old.c_str()) != 0 ||
          ::rename(staging.c_str(), target.c_str()) != 0) {
        throw Error(fmt::format("cannot replace '{}' with '{}': {}", target.string(),
                                staging.string(), errno_text()));
      }
      fs::remove_all(old, ec);
    } else {
      throw Error(fmt::format("cannot exchange '{}' with '{}': {}", staging.string(),
                              target.string(), errno_text()));
    }
  }
  sync_dir(parent_of(target));
}

FolderLock::FolderLock(const std::filesystem::path& dir, std::string_view what) {
  lock(dir / kFolderLockName, dir, what);
}

FolderLock FolderLock::of_file(const std::filesystem::path& lock_file,
                               const std::filesystem::path& subject, std::string_view what) {
  FolderLock out;
  out.lock(lock_file, subject, what);
  return out;
}

void FolderLock::lock(const std::filesystem::path& file, const std::filesystem::path& dir,
                      std::string_view what) {
  fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw Error(
        fmt::format("{}: cannot open the lock file '{}': {}", what, file.string(), errno_text()));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder;
    if (err == EWOULDBLOCK) {
      char buf[256] = {};
      const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
      if (n > 0) holder = std::string(buf, static_cast<std::size_t>(n));
      while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0'))
        holder.pop_back();
    }
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) {
      throw Error(fmt::format("{}: cannot lock '{}': {}", what, file.string(), std::strerror(err)));
    }
    const auto space = holder.find(' ');
    const std::string who = space == std::string::npos
                                ? std::string("another process")
                                : fmt::format("process {} on host {}", holder.substr(0, space),
                                              holder.substr(space + 1));
    throw Error(fmt::format(
        "{}: '{}' is in use by another run ({} holds its lock '{}'); wait for that run to end or "
        "choose another folder",
        what, dir.string(), who, file.string()));
  }
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  const std::string line = fmt::format("{} {}\n", ::getpid(), host);
  // The holder's line is a courtesy for the next one's message: a failure here is not an error.
  if (::ftruncate(fd_, 0) == 0) {
    const ssize_t n = ::pwrite(fd_, line.data(), line.size(), 0);
    (void)n;
  }
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

FolderLock::FolderLock(FolderLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

FolderLock& FolderLock::operator=(FolderLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

std::vector<char> read_file_bytes(const std::filesystem::path& path) {
  // A device or a FIFO is refused before it is read (it may never end), and the bytes must fit in
  // memory (a checkpoint file on a smaller node): checked from the size, before reading.
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw Error(fmt::format("cannot open '{}': {}", path.string(), std::strerror(ENOENT)));
  const std::uint64_t size =
      check_input_file(path, "file", std::numeric_limits<std::uint64_t>::max());
  check_memory_fits(static_cast<double>(size), fmt::format("reading '{}'", path.string()));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("cannot open '{}': {}", path.string(), std::strerror(errno)));
  std::vector<char> bytes(static_cast<std::size_t>(size));
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  if (in.bad() || static_cast<std::uint64_t>(in.gcount()) != size)
    throw Error(fmt::format("read of '{}' failed: {}", path.string(),
                            in.bad() ? std::strerror(errno) : "the file shrank while it was read"));
  return bytes;
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  const std::vector<char> bytes = read_file_bytes(path);
  try {
    return nlohmann::json::parse(bytes.begin(), bytes.end());
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("'{}' is not valid JSON: {}", path.string(), json_error_text(e)));
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
