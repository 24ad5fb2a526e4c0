// File helpers: read-only memory maps and atomic writes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/huge_page_buffer.h"

namespace qf {

// Where a MappedFile's bytes live.
//   Mapped    a read-only memory map of the file (pages come from the page
//             cache on first touch; nothing is read up front)
//   InMemory  a private copy read into anonymous memory when opened, advised
//             to use transparent huge pages and made read-only afterwards.
//             Streaming over it (decode reads every weight once per token) is
//             faster than over the file's page-cache pages: fewer TLB misses,
//             and no page-cache pages shared with other readers.
enum class FileResidency { Mapped, InMemory };

// Whether an InMemory copy is made read-only as soon as it is read (Sealed),
// or stays writable until seal() (Unsealed: a loader that rewrites some
// tensors in place, as the runtime regroups Q8_0 weights, seals after).
enum class MemorySeal { Sealed, Unsealed };

// A read-only view of a whole file's bytes. Shared so that tensor views can
// keep it alive. An empty file gives size() == 0 and data() == nullptr.
class MappedFile {
 public:
  static std::shared_ptr<MappedFile> open(const std::filesystem::path& path,
                                          FileResidency residency = FileResidency::Mapped,
                                          MemorySeal seal = MemorySeal::Sealed);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }
  FileResidency residency() const { return residency_; }
  // The bytes, writable: only for an InMemory copy opened Unsealed and not yet
  // sealed; nullptr otherwise (a file map is never written).
  uint8_t* writable_data() const { return writable_ ? buffer_->data() : nullptr; }
  // Read-only from here on (what Sealed does at open); a no-op otherwise.
  void seal();

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  void* region_ = nullptr;  // the file map (Mapped)
  size_t region_size_ = 0;
  std::unique_ptr<HugePageBuffer> buffer_;  // the copy (InMemory)
  FileResidency residency_ = FileResidency::Mapped;
  bool writable_ = false;
  std::filesystem::path path_;
};

// Gives the whole pages of [data, data + bytes) back to the kernel when the
// range lies inside one of this process's read-only file maps (a Mapped
// MappedFile): they stop counting in the process's resident memory, and a
// later read loads them from the file again. Anything else (memory of the
// heap, an InMemory copy) is left alone.
void release_mapped_pages(const void* data, size_t bytes);

// Gives the allocator's free memory back to the system (glibc: malloc_trim,
// which also drops the free pages inside its arenas), so that what a finished
// step freed stops counting in the resident memory instead of lingering as
// fragments; a no-op with other C libraries.
void release_free_heap();

// The whole file. A folder is InvalidInput, a missing file NotFound.
std::string read_text_file(const std::filesystem::path& path);

// std::filesystem::exists / is_directory / is_regular_file for paths that
// come from the user: an error other than "no such file" (a name too long, a
// parent folder without permission) is qf::Error Io naming the path, not a
// std::filesystem::filesystem_error.
bool path_exists(const std::filesystem::path& path);
bool is_folder(const std::filesystem::path& path);
bool is_file(const std::filesystem::path& path);

// Whether `a` and `b` name the same file or folder (device and inode, so
// symbolic and hard links count); false when either cannot be looked at.
bool same_entry(const std::filesystem::path& a, const std::filesystem::path& b);
// Whether `path` is the folder `dir` or lies inside it: `path` made absolute
// with its symbolic links resolved as far as it exists, then it and each of
// its parents compared with `dir` by same_entry (so a link to `dir`, or
// `dir` under a second name, counts). `path` itself need not exist.
bool is_within(const std::filesystem::path& path, const std::filesystem::path& dir);

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
