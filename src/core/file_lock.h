// An exclusive lock on a file that dies with its holder.
//
// Open-file-description locks (fcntl F_OFD_SETLK) on the whole file: the
// kernel drops them when the process ends, kill -9 included, so no lock is
// ever left stale; on NFS they go through the lock manager, so processes on
// different hosts of a shared filesystem exclude each other too. The file's
// content names the holder ("HOST PID TIME"), for messages only.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace qf {

class FileLock {
 public:
  // Creates `path` if needed and takes the lock without waiting. nullopt when
  // another process holds it (*holder then gets what the file says about the
  // holder, when given). Io error naming `path` when the file cannot be
  // created or the filesystem refuses locks.
  static std::optional<FileLock> try_acquire(const std::filesystem::path& path, std::string* holder = nullptr);

  // Waits until the lock is free. Io error as above.
  static FileLock acquire(const std::filesystem::path& path);

  FileLock(FileLock&& o) noexcept : path_(std::move(o.path_)), fd_(o.fd_) { o.fd_ = -1; }
  FileLock& operator=(FileLock&& o) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();  // releases (the file stays)

  const std::filesystem::path& path() const { return path_; }

 private:
  FileLock(std::filesystem::path p, int fd) : path_(std::move(p)), fd_(fd) {}
  std::filesystem::path path_;
  int fd_ = -1;
};

}  // namespace qf
