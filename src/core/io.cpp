#include "core/io.h"

#include <fcntl.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "core/error.h"
#include "core/temporaries.h"

namespace qf {

namespace fs = std::filesystem;

static std::string errno_text() { return std::strerror(errno); }

namespace {

// The read-only file maps of this process (start -> end), so that
// release_mapped_pages can tell a file's pages, which the kernel reads again
// when they are touched, from memory whose contents only live in RAM.
std::mutex& map_registry_mutex() {
  static std::mutex mu;
  return mu;
}
std::map<uintptr_t, uintptr_t>& map_registry() {
  static std::map<uintptr_t, uintptr_t> r;
  return r;
}

// The whole file read into a HugePageBuffer (writable: the caller seals it).
std::unique_ptr<HugePageBuffer> read_into_memory(int fd, const fs::path& path, size_t size) {
  auto buf = std::make_unique<HugePageBuffer>(size, path.string());
  size_t done = 0;
  while (done < size) {
    const size_t want = std::min<size_t>(size - done, size_t{1} << 26);
    const ssize_t got = pread(fd, buf->data() + done, want, static_cast<off_t>(done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw io_error(path.string(), "read failed at byte " + std::to_string(done) + ": " + errno_text());
    if (got == 0)
      throw io_error(path.string(), "file ended at byte " + std::to_string(done) + " of " + std::to_string(size) +
                                        " (it changed while being read)");
    done += static_cast<size_t>(got);
  }
  return buf;
}

}  // namespace

std::shared_ptr<MappedFile> MappedFile::open(const fs::path& path, FileResidency residency, MemorySeal seal) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) throw not_found(path.string(), "no such file");
    throw io_error(path.string(), "cannot open: " + errno_text());
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    throw io_error(path.string(), "cannot stat: " + errno_text());
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw invalid_input(path.string(), S_ISDIR(st.st_mode) ? "is a folder, not a regular file" : "not a regular file");
  }
  std::shared_ptr<MappedFile> m(new MappedFile());
  m->path_ = path;
  m->size_ = static_cast<size_t>(st.st_size);
  m->residency_ = residency;
  if (m->size_ > 0 && residency == FileResidency::InMemory) {
    try {
      m->buffer_ = read_into_memory(fd, path, m->size_);
    } catch (...) {
      ::close(fd);
      throw;
    }
    m->data_ = m->buffer_->data();
    m->writable_ = true;
    if (seal == MemorySeal::Sealed) m->seal();
  } else if (m->size_ > 0) {
    void* p = mmap(nullptr, m->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw io_error(path.string(), "cannot mmap: " + errno_text());
    }
    m->region_ = p;
    m->region_size_ = m->size_;
    m->data_ = static_cast<const uint8_t*>(p);
    std::lock_guard<std::mutex> lock(map_registry_mutex());
    map_registry()[reinterpret_cast<uintptr_t>(p)] = reinterpret_cast<uintptr_t>(p) + m->size_;
  }
  ::close(fd);
  return m;
}

void MappedFile::seal() {
  if (!writable_) return;
  buffer_->make_read_only();
  writable_ = false;
}

MappedFile::~MappedFile() {
  if (!region_) return;
  {
    std::lock_guard<std::mutex> lock(map_registry_mutex());
    map_registry().erase(reinterpret_cast<uintptr_t>(region_));
  }
  munmap(region_, region_size_);
}

void release_free_heap() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

void release_mapped_pages(const void* data, size_t bytes) {
  if (!data || bytes == 0) return;
  const uintptr_t b = reinterpret_cast<uintptr_t>(data), e = b + bytes;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (b + page - 1) / page * page, hi = e / page * page;  // whole pages inside the range only
  if (lo >= hi) return;
  std::lock_guard<std::mutex> lock(map_registry_mutex());
  auto it = map_registry().upper_bound(b);
  if (it == map_registry().begin()) return;
  --it;
  if (b < it->first || e > it->second) return;  // not (wholly) inside one file map
  // A private read-only file map: dropping the pages loses nothing (the
  // next touch reads them from the file or the page cache again).
  madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

namespace {

// fs::status without the exception: "no such file" is not_found_error (not an error).
fs::file_status checked_status(const fs::path& path) {
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (ec && st.type() != fs::file_type::not_found) throw io_error(path.string(), "cannot access: " + ec.message());
  return st;
}

}  // namespace

bool path_exists(const fs::path& path) { return fs::exists(checked_status(path)); }
bool is_folder(const fs::path& path) { return fs::is_directory(checked_status(path)); }
bool is_file(const fs::path& path) { return fs::is_regular_file(checked_status(path)); }

std::string read_text_file(const fs::path& path) {
  if (is_folder(path)) throw invalid_input(path.string(), "is a folder, not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!path_exists(path)) throw not_found(path.string(), "no such file");
    throw io_error(path.string(), "cannot open for reading");
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw io_error(path.string(), "read failed");
  return ss.str();
}

AtomicFile::AtomicFile(fs::path final_path) : final_(std::move(final_path)) {
  fs::path dir = final_.parent_path();
  if (dir.empty()) dir = ".";
  remove_stale_temporaries(final_);
  for (int attempt = 0; attempt < 16 && fd_ < 0; ++attempt) {
    temp_ = temp_sibling(final_, "tmp");
    int e = 0;
    const bool open = create_registered_temporary(temp_, [&] {
      fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      e = errno;
      return fd_ >= 0;
    });
    if (!open) throw io_error(final_.string(), "interrupted");
    if (fd_ < 0) {
      errno = e;
      if (e != EEXIST) break;
    }
  }
  if (fd_ < 0) throw io_error(final_.string(), "cannot create a temporary file in " + dir.string() + ": " + errno_text());
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
  unregister_temporary(temp_);
}

void AtomicFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw io_error(final_.string(), "write failed: " + errno_text());
    }
    p += w;
    n -= static_cast<size_t>(w);
    written_ += static_cast<uint64_t>(w);
  }
}

void AtomicFile::commit() {
  if (committed_) return;
  if (fsync(fd_) != 0) throw io_error(final_.string(), "fsync failed: " + errno_text());
  if (::close(fd_) != 0) {
    fd_ = -1;
    throw io_error(final_.string(), "close failed: " + errno_text());
  }
  fd_ = -1;
  if (::rename(temp_.c_str(), final_.c_str()) != 0)
    throw io_error(final_.string(), "cannot rename " + temp_.string() + ": " + errno_text());
  committed_ = true;
  unregister_temporary(temp_);
  fs::path dir = final_.parent_path();
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const fs::path& path, std::string_view contents) {
  AtomicFile f(path);
  f.write(contents);
  f.commit();
}

StagingDir::StagingDir(fs::path final_dir) : final_(std::move(final_dir)) {
  if (final_.filename().empty()) final_ = final_.parent_path();
  std::error_code ec;
  if (fs::exists(final_, ec) && !(fs::is_directory(final_, ec) && fs::is_empty(final_, ec)))
    throw io_error(final_.string(), "already exists and is not an empty folder; remove it or choose another output");
  fs::path dir = final_.parent_path();
  if (dir.empty()) dir = ".";
  if (!fs::is_directory(dir, ec)) throw io_error(final_.string(), "the parent folder " + dir.string() + " does not exist");
  remove_stale_temporaries(final_);
  temp_ = create_temporary_folder(final_, "tmp", 0755);
  if (temp_.empty()) throw io_error(final_.string(), "cannot create a temporary folder in " + dir.string() + ": " + errno_text());
}

StagingDir::~StagingDir() {
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(temp_, ec);
  }
  unregister_temporary(temp_);
}

void StagingDir::commit() {
  std::error_code ec;
  if (fs::is_directory(final_, ec) && fs::is_empty(final_, ec)) fs::remove(final_, ec);
  if (::rename(temp_.c_str(), final_.c_str()) != 0)
    throw io_error(final_.string(), "cannot rename " + temp_.string() + " into place: " + errno_text());
  committed_ = true;
  unregister_temporary(temp_);
  fs::path dir = final_.parent_path();
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

namespace {

void write_through(const fs::path& path, std::string_view contents) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) throw io_error(path.string(), "cannot open for writing: " + errno_text());
  const char* p = contents.data();
  size_t n = contents.size();
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      const std::string e = errno_text();
      ::close(fd);
      throw io_error(path.string(), "write failed: " + e);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  if (::close(fd) != 0) throw io_error(path.string(), "close failed: " + errno_text());
}

}  // namespace

void write_output_file(const fs::path& path, std::string_view contents) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);  // follows symbolic links
  if (fs::exists(st)) {
    if (fs::is_directory(st)) throw io_error(path.string(), "is a folder; give a file name");
    if (!fs::is_regular_file(st)) return write_through(path, contents);
  }
  fs::path target = path;
  if (fs::is_symlink(fs::symlink_status(path, ec))) {
    target = fs::exists(st) ? fs::canonical(path, ec) : fs::weakly_canonical(path, ec);
    if (ec) throw io_error(path.string(), "cannot resolve the symbolic link: " + ec.message());
  }
  write_file_atomic(target, contents);
}

bool same_entry(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  const bool eq = fs::equivalent(a, b, ec);
  return !ec && eq;
}

bool is_within(const fs::path& path, const fs::path& dir) {
  std::error_code ec;
  fs::path at = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) at = fs::absolute(path, ec).lexically_normal();
  for (;;) {
    if (same_entry(at, dir)) return true;
    if (!at.has_relative_path()) return false;  // the root
    at = at.parent_path();
  }
}

void check_output_file(const fs::path& out, const std::vector<fs::path>& inputs, bool force, bool special_ok,
                       const std::string& flag) {
  std::error_code ec;
  const fs::file_status st = fs::status(out, ec);
  const bool exists = fs::exists(st);
  if (exists) {
    for (const fs::path& in : inputs) {
      if (in.empty()) continue;
      bool hit = same_entry(in, out);
      if (!hit && fs::is_directory(fs::status(in, ec))) {
        fs::recursive_directory_iterator it(in, fs::directory_options::skip_permission_denied, ec), end;
        for (; !ec && it != end && !hit; it.increment(ec)) {
          if (it.depth() >= 2) it.disable_recursion_pending();  // model folders are flat; HF caches nest little
          hit = same_entry(it->path(), out);
        }
      }
      if (hit)
        throw io_error(out.string(), flag + " would overwrite an input of this run (" + in.string() +
                                         "); write the output elsewhere");
    }
    if (fs::is_directory(st)) throw io_error(out.string(), flag + " is a folder; give a file name");
    if (!fs::is_regular_file(st)) {
      if (!special_ok) throw io_error(out.string(), flag + " is not a regular file; give a file name");
      return;
    }
    if (!force) throw io_error(out.string(), flag + " already exists; pass --force to replace it");
  }
  fs::path dir = out.parent_path();
  if (!dir.empty() && !fs::is_directory(dir, ec))
    throw io_error(out.string(), "the folder " + dir.string() + " does not exist");
}

}  // namespace qf
