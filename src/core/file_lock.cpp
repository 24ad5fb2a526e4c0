#include "core/file_lock.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "core/error.h"
#include "core/temporaries.h"

namespace qf {

std::optional<FileLock> FileLock::try_acquire(const std::filesystem::path& path, std::string* holder) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw io_error(path.string(), std::string("cannot open the lock file: ") + std::strerror(errno));
  struct flock fl = {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = 0;
  fl.l_len = 0;  // the whole file
  if (::fcntl(fd, F_OFD_SETLK, &fl) != 0) {
    const int e = errno;
    if (e == EAGAIN || e == EACCES) {
      if (holder) {
        char buf[256] = {};
        const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
        *holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("another process");
        while (!holder->empty() && (holder->back() == '\n' || holder->back() == ' ')) holder->pop_back();
      }
      ::close(fd);
      return std::nullopt;
    }
    ::close(fd);
    throw io_error(path.string(), std::string("cannot lock the file (does this filesystem support locks?): ") + std::strerror(e));
  }
  char when[32] = "?";
  const std::time_t now = std::time(nullptr);
  struct tm t = {};
  if (gmtime_r(&now, &t)) std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &t);
  char info[160];
  const int n = std::snprintf(info, sizeof info, "host %s, pid %d, since %s\n", temp_host_tag().c_str(),
                              static_cast<int>(::getpid()), when);
  if (::ftruncate(fd, 0) == 0 && n > 0) {
    // For messages only: a failed write leaves the lock valid.
    [[maybe_unused]] const ssize_t w = ::pwrite(fd, info, static_cast<size_t>(n), 0);
  }
  return FileLock(path, fd);
}

FileLock FileLock::acquire(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw io_error(path.string(), std::string("cannot open the lock file: ") + std::strerror(errno));
  struct flock fl = {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  while (::fcntl(fd, F_OFD_SETLKW, &fl) != 0) {
    if (errno == EINTR) continue;
    const int e = errno;
    ::close(fd);
    throw io_error(path.string(), std::string("cannot lock the file (does this filesystem support locks?): ") + std::strerror(e));
  }
  return FileLock(path, fd);
}

FileLock& FileLock::operator=(FileLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace qf
