// File helpers: read-only memory maps and atomic writes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace qf {

// A read-only memory map of a whole file. Shared so that tensor views can keep
// the mapping alive. An empty file maps to size() == 0 and data() == nullptr.
class MappedFile {
 public:
  static std::shared_ptr<MappedFile> open(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::filesystem::path path_;
};

// The whole file. A folder is InvalidInput, a missing file NotFound.
std::string read_text_file(const std::filesystem::path& path);

// std::filesystem::exists / is_directory / is_regular_file for paths that
// come from the user: an error other than "no such file" (a name too long, a
// parent folder without permission) is qf::Error Io naming the path, not a
// std::filesystem::filesystem_error.
bool path_exists(const std::filesystem::path& path);
bool is_folder(const std::filesystem::path& path);
bool is_file(const std::filesystem::path& path);

// Writes a file under a temporary name in the target folder (see
// temporaries.h: ".NAME.tmp.HOST.PID.RAND"), then fsyncs and renames it over
// the final name. If the writer is destroyed without commit() (an exception,
// an interrupt), the temporary file is removed and the final name is
// untouched; after kill -9 the next writer of the same name removes it.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path final_path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  uint64_t bytes_written() const { return written_; }
  const std::filesystem::path& final_path() const { return final_; }
  const std::filesystem::path& temp_path() const { return temp_; }
  // Flush, fsync, rename to the final name, fsync the folder.
  void commit();

 private:
  std::filesystem::path final_, temp_;
  int fd_ = -1;
  uint64_t written_ = 0;
  bool committed_ = false;
};

// An output folder built under a temporary name beside its final name
// (".NAME.tmp.HOST.PID.RAND") and renamed into place by commit(). The final name
// must not exist, or be an empty folder. Destroyed without commit(), the
// temporary folder and everything in it are removed, so a failed or killed
// run never leaves a half-written folder under the final name.
class StagingDir {
 public:
  explicit StagingDir(std::filesystem::path final_dir);
  ~StagingDir();
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;

  const std::filesystem::path& path() const { return temp_; }  // write here
  const std::filesystem::path& final_path() const { return final_; }
  void commit();

 private:
  std::filesystem::path final_, temp_;
  bool committed_ = false;
};

// Convenience: atomically replace `path` with `contents`.
void write_file_atomic(const std::filesystem::path& path, std::string_view contents);

// Writes a user-named output such as a --json report. A regular file (or a
// new name) is replaced atomically; a symbolic link is followed and its target
// replaced, so the link stays; a FIFO, character device or socket is opened and
// written through (a pipe, /dev/stdout), never replaced. Write errors (a full
// disk, /dev/full) are Io errors.
void write_output_file(const std::filesystem::path& path, std::string_view contents);

// Checks an output file's path before any work, with one Io error naming
// `flag`. Always refused: a path that is one of `inputs` (the same file by
// device and inode, so symbolic and hard links count; a folder in `inputs`
// stands for every file under it) and an existing folder. An existing regular
// file is refused unless `force`. Special files (FIFO, character device) are
// accepted only when `special_ok` (outputs written by write_output_file).
void check_output_file(const std::filesystem::path& out, const std::vector<std::filesystem::path>& inputs, bool force,
                       bool special_ok, const std::string& flag);

}  // namespace qf
