#include "core/io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"

namespace qf {

namespace fs = std::filesystem;

static std::string errno_text() { return std::strerror(errno); }

// ".NAME.tmp.PID.RAND" in `dir`: a hidden temporary beside the final name.
// Built with append(): GCC 12's -Wrestrict misfires on chained operator+.
static fs::path temp_sibling(const fs::path& dir, const fs::path& final_path, unsigned random) {
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, ".tmp.%d.%08x", static_cast<int>(getpid()), random);
  std::string name = ".";
  name.append(final_path.filename().string()).append(suffix);
  return dir / name;
}

std::shared_ptr<MappedFile> MappedFile::open(const fs::path& path) {
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
  if (m->size_ > 0) {
    void* p = mmap(nullptr, m->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw io_error(path.string(), "cannot mmap: " + errno_text());
    }
    m->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return m;
}

MappedFile::~MappedFile() {
  if (data_) munmap(const_cast<uint8_t*>(data_), size_);
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
  std::random_device rd;
  for (int attempt = 0; attempt < 16 && fd_ < 0; ++attempt) {
    temp_ = temp_sibling(dir, final_, rd());
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0 && errno != EEXIST) break;
  }
  if (fd_ < 0) throw io_error(final_.string(), "cannot create a temporary file in " + dir.string() + ": " + errno_text());
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
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
  std::random_device rd;
  for (int attempt = 0; attempt < 16; ++attempt) {
    temp_ = temp_sibling(dir, final_, rd());
    if (::mkdir(temp_.c_str(), 0755) == 0) return;
    if (errno != EEXIST) break;
  }
  throw io_error(final_.string(), "cannot create a temporary folder in " + dir.string() + ": " + errno_text());
}

StagingDir::~StagingDir() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(temp_, ec);
}

void StagingDir::commit() {
  std::error_code ec;
  if (fs::is_directory(final_, ec) && fs::is_empty(final_, ec)) fs::remove(final_, ec);
  if (::rename(temp_.c_str(), final_.c_str()) != 0)
    throw io_error(final_.string(), "cannot rename " + temp_.string() + " into place: " + errno_text());
  committed_ = true;
  fs::path dir = final_.parent_path();
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace qf
