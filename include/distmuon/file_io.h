#pragma once
// File helpers shared by the optimizer's checkpoints (checkpoint.h), the trainer's checkpoints and
// the .npy writer: atomic writes, whole-file reads, JSON files and the FNV-1a 64 checksum that
// the manifests record. Every failure throws distmuon::Error naming the file and the problem.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "distmuon/hash.h"

namespace distmuon {

// Throws distmuon::Error "<what> '<path>': is a directory, not a regular file" (or a device
// node, a FIFO, a socket) unless path names nothing yet or a regular file; a symbolic link is
// judged by its target. Every command that writes a file checks its outputs with this before it
// starts, and write_file_atomic checks again: an output must never replace a folder or a device
// (`orthogonalize IN /dev/null` as root would rename a regular file over the device node).
void check_output_file(const std::filesystem::path& path, std::string_view what);

// Writes bytes to path atomically: path.tmp.<pid>, fsync, rename, fsync of the directory. A failed
// write (an error, a full disk, EFBIG, an exception) leaves the previous file (or none) and
// removes the temporary one. A path that is not a regular file or new (check_output_file), or
// more bytes than the process's file-size limit (ulimit -f, which would otherwise end the process
// with SIGXFSZ halfway), is refused before anything is written.
void write_file_atomic(const std::filesystem::path& path, const void* data, std::size_t size);

// Folders replaced as a whole (checkpoints): the new content is written into the staging folder
// staging_dir_of(dir) ("a/.b.partial" for "a/b", a sibling on the same file system), then
// replace_dir_atomic moves it into place: a rename when dir does not exist, else one atomic
// exchange (renameat2 RENAME_EXCHANGE) after which the old content is removed. At every moment
// dir holds the complete old or the complete new content; a crash before the exchange leaves the
// staging folder, which the next save of dir removes. Every folder under staging is fsynced
// first. On a file system without the exchange, the old folder is renamed aside (".b.old") and
// the staging folder into place. Throws naming both folders when a rename fails.
std::filesystem::path staging_dir_of(const std::filesystem::path& dir);
void replace_dir_atomic(const std::filesystem::path& staging, const std::filesystem::path& dir);
// fsync of dir and of every folder under it (errors ignored: not every file system supports it).
void sync_tree(const std::filesystem::path& dir);

// An exclusive lock on a folder, held by one process at a time: flock(LOCK_EX | LOCK_NB) on
// DIR/.lock (created when missing, never removed), which holds the holder's "pid host" line for
// the message of the next. The lock goes with the process: released by the destructor, and by the
// kernel when the process ends in any way (a crash or kill -9 included), so no stale lock needs
// clearing. Taking it while another process holds it throws distmuon::Error
// "<what>: '<dir>' is in use by another process (pid 123 on host h holds '<dir>/.lock') ...".
class FolderLock {
 public:
  FolderLock() = default;
  FolderLock(const std::filesystem::path& dir, std::string_view what);
  // The same lock on a named lock file that guards subject (a file: a training log guarded by
  // "<log>.lock"); the message names subject as it names the folder.
  static FolderLock of_file(const std::filesystem::path& lock_file,
                            const std::filesystem::path& subject, std::string_view what);
  ~FolderLock();
  FolderLock(FolderLock&& other) noexcept;
  FolderLock& operator=(FolderLock&& other) noexcept;
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  void lock(const std::filesystem::path& file, const std::filesystem::path& subject,
            std::string_view what);
  int fd_ = -1;
};
inline constexpr const char* kFolderLockName = ".lock";

// The whole file's bytes.
std::vector<char> read_file_bytes(const std::filesystem::path& path);

// The file parsed as JSON; throws "'<path>' is not valid JSON: ..." when it is not.
nlohmann::json read_json_file(const std::filesystem::path& path);

// The checksum is fnv1a64 (hash.h).
std::string checksum_hex(std::uint64_t checksum);  // 16 lowercase hex digits

// Throws "'<path>' fails its checksum (FNV-1a 64 <actual>, manifest <expected>)" unless the
// checksum of bytes is expected_hex (as checksum_hex writes it).
void verify_checksum(const std::filesystem::path& path, const std::vector<char>& bytes,
                     const std::string& expected_hex);

}  // namespace distmuon
