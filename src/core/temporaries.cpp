#include "core/temporaries.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "core/error.h"

namespace qf {

namespace fs = std::filesystem;

const std::string& temp_host_tag() {
  static const std::string tag = [] {
    char buf[256] = {};
    std::string h;
    if (gethostname(buf, sizeof buf - 1) == 0) h = buf;
    std::string t;
    for (char c : h) {
      if (t.size() >= 32) break;
      const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
      t.push_back(keep ? c : '-');
    }
    return t.empty() ? std::string("host") : t;
  }();
  return tag;
}

fs::path temp_sibling(const fs::path& final_path, const std::string& kind) {
  static std::mutex mu;
  static std::mt19937 rng{std::random_device{}()};
  unsigned r;
  {
    std::lock_guard<std::mutex> lock(mu);
    r = static_cast<unsigned>(rng());
  }
  char tail[48];
  std::snprintf(tail, sizeof tail, ".%d.%08x", static_cast<int>(getpid()), r);
  // Built with append(): GCC 12's -Wrestrict misfires on chained operator+.
  std::string name = ".";
  name.append(final_path.filename().string()).append(".").append(kind).append(".").append(temp_host_tag()).append(tail);
  fs::path dir = final_path.parent_path();
  return dir.empty() ? fs::path(name) : dir / name;
}

namespace {

// "HOST.PID.RAND" -> pid of a temporary of this host, or -1.
long owner_pid(const std::string& rest) {
  const size_t r = rest.rfind('.');
  if (r == std::string::npos || r == 0) return -1;
  const size_t p = rest.rfind('.', r - 1);
  if (p == std::string::npos) return -1;
  if (rest.substr(0, p) != temp_host_tag()) return -1;
  const std::string pid = rest.substr(p + 1, r - p - 1);
  if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) return -1;
  const std::string rnd = rest.substr(r + 1);
  if (rnd.size() != 8 || rnd.find_first_not_of("0123456789abcdef") != std::string::npos) return -1;
  return std::stol(pid);
}

bool process_gone(long pid) { return pid > 0 && pid != getpid() && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

}  // namespace

std::vector<fs::path> remove_stale_temporaries(const fs::path& final_path) {
  std::vector<fs::path> removed;
  fs::path target = final_path;
  if (target.filename().empty()) target = target.parent_path();
  fs::path dir = target.parent_path();
  if (dir.empty()) dir = ".";
  std::string base = ".";  // built in steps: "." + string&& trips a false -Wrestrict in GCC 12
  base += target.filename().string();
  base += '.';
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return removed;
  for (const fs::directory_entry& e : it) {
    const std::string name = e.path().filename().string();
    if (name.compare(0, base.size(), base) != 0) continue;
    const std::string rest = name.substr(base.size());
    std::string owner;
    for (const char* kind : {"tmp.", "spill."})
      if (rest.compare(0, std::char_traits<char>::length(kind), kind) == 0) owner = rest.substr(std::char_traits<char>::length(kind));
    if (owner.empty() || !process_gone(owner_pid(owner))) continue;
    std::error_code rec;
    fs::remove_all(e.path(), rec);
    if (!rec) removed.push_back(e.path());
  }
  return removed;
}

namespace {

struct Registry {
  std::mutex mu;
  std::set<fs::path> paths;
  bool closed = false;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: used until the process ends
  return *r;
}

}  // namespace

bool create_registered_temporary(const fs::path& p, const std::function<bool()>& create) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.closed) return false;
  if (create()) r.paths.insert(p);
  return true;
}

void unregister_temporary(const fs::path& p) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.paths.erase(p);
}

int remove_registered_temporaries() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.closed = true;
  int n = 0;
  for (const fs::path& p : r.paths) {
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(p, ec))) continue;
    ++n;
    // Until it is gone: a worker thread may create a file inside a folder
    // while a pass runs (its rmdir then fails, not empty). Once the folder
    // is removed, no file can be created in it any more. A busy machine can
    // need several passes; at most about 200 ms in all.
    for (int pass = 0; pass < 100 && fs::exists(fs::symlink_status(p, ec)); ++pass) {
      if (pass > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      fs::remove_all(p, ec);
    }
  }
  r.paths.clear();
  return n;
}

fs::path create_temporary_folder(const fs::path& final_path, const std::string& kind, unsigned mode) {
  for (int attempt = 0; attempt < 16; ++attempt) {
    const fs::path d = temp_sibling(final_path, kind);
    int e = 0;
    bool made = false;
    const bool open = create_registered_temporary(d, [&] {
      made = ::mkdir(d.c_str(), static_cast<mode_t>(mode)) == 0;
      e = errno;
      return made;
    });
    if (!open) throw io_error(final_path.string(), "interrupted");
    if (made) return d;
    errno = e;
    if (e != EEXIST) break;
  }
  return {};
}

}  // namespace qf
