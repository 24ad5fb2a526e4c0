#include "core/progress.h"

#include <algorithm>

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>

namespace qf {

namespace {
std::atomic<bool> g_quiet{false};
std::FILE* g_out = nullptr;  // nullptr: stderr
int g_terminal = -1;         // -1: ask isatty
std::mutex g_factory_mutex;
ProgressBarFactory g_factory;

std::FILE* out() { return g_out ? g_out : stderr; }
bool terminal() { return g_terminal >= 0 ? g_terminal == 1 : isatty(fileno(out())) == 1; }
}  // namespace

void Progress::set_quiet(bool q) { g_quiet = q; }
void Progress::set_bar_factory(ProgressBarFactory f) {
  std::lock_guard<std::mutex> lock(g_factory_mutex);
  g_factory = std::move(f);
}
bool Progress::quiet() { return g_quiet; }
void Progress::set_output(std::FILE* o, bool is_terminal) {
  g_out = o;
  g_terminal = is_terminal ? 1 : 0;
}

std::string Progress::format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  long t = std::lround(s);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%02ld:%02ld", t / 60, t % 60);
  return buf;
}

std::string Progress::format_rate(double r, const std::string& unit) {
  char buf[64];
  if (!std::isfinite(r) || r <= 0) return "- " + unit + "/s";
  if (r >= 1e6)
    std::snprintf(buf, sizeof buf, "%.1fM %s/s", r / 1e6, unit.c_str());
  else if (r >= 1e4)
    std::snprintf(buf, sizeof buf, "%.1fk %s/s", r / 1e3, unit.c_str());
  else
    std::snprintf(buf, sizeof buf, "%.1f %s/s", r, unit.c_str());
  return buf;
}

Progress::Progress(std::string label, uint64_t total, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total),
      start_(std::chrono::steady_clock::now()), last_draw_(start_), exceptions_(std::uncaught_exceptions()) {
  if (g_quiet) return;
  ProgressBarFactory f;
  {
    std::lock_guard<std::mutex> lock(g_factory_mutex);
    f = g_factory;
  }
  if (f) bar_ = f(label_, total_, unit_);
}

Progress::~Progress() {
  if (std::uncaught_exceptions() <= exceptions_) {
    finish();
    return;
  }
  // Unwinding from an error: no "done" line (the error is the one line that
  // follows); a bar drawn in place gets its line ended.
  finished_ = true;
  if (bar_) {
    bar_->close();
    return;
  }
  if (!g_quiet && drawn_ && terminal()) {
    std::fputs("\n", out());
    std::fflush(out());
  }
}

void Progress::add(uint64_t n) { set(done_ + n); }

void Progress::set(uint64_t done) {
  done_ = done;
  if (g_quiet || finished_) return;
  if (bar_) {
    bar_->update(done_);
    return;
  }
  auto now = std::chrono::steady_clock::now();
  auto interval = terminal() ? std::chrono::milliseconds(100) : std::chrono::milliseconds(5000);
  if (now - last_draw_ >= interval) {
    last_draw_ = now;
    draw(false);
  }
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (bar_) {
    bar_->close();
    return;
  }
  if (!g_quiet && (drawn_ || total_ > 0 || done_ > 0)) draw(true);
}

void Progress::draw(bool final_line) {
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0.0;
  std::string counts = total_ ? std::to_string(done_) + "/" + std::to_string(total_) : std::to_string(done_);
  std::string eta = "";
  if (total_ && !final_line && rate > 0) eta = " eta " + format_duration(static_cast<double>(total_ - std::min(done_, total_)) / rate);
  std::string tail = counts + " " + unit_ + " " + format_rate(rate, unit_) + " " + format_duration(elapsed) + eta;
  drawn_ = true;
  if (terminal()) {
    std::string bar;
    if (total_) {
      const int width = 28;
      int fill = static_cast<int>(width * std::min(1.0, static_cast<double>(done_) / static_cast<double>(total_)));
      bar = "[";  // appended piecewise: GCC 12's -Wrestrict misfires on "literal" + std::string
      bar.append(static_cast<size_t>(fill), '#').append(static_cast<size_t>(width - fill), '.').append("] ");
    }
    std::fprintf(out(), "\r\033[K%s %s%s%s", label_.c_str(), bar.c_str(), tail.c_str(), final_line ? "\n" : "");
  } else {
    std::string pct;
    if (total_) {
      char b[16];
      std::snprintf(b, sizeof b, "%5.1f%% ", 100.0 * static_cast<double>(done_) / static_cast<double>(total_));
      pct = b;
    }
    std::fprintf(out(), "%s: %s%s%s\n", label_.c_str(), pct.c_str(), tail.c_str(), final_line ? " done" : "");
  }
  std::fflush(out());
}

void LazyProgress::operator()(int64_t done, int64_t total) {
  if (!bar_) bar_.emplace(label_, static_cast<uint64_t>(std::max<int64_t>(0, total)), unit_);
  bar_->set(static_cast<uint64_t>(std::max<int64_t>(0, done)));
}

void LazyProgress::finish() {
  if (bar_) bar_->finish();
}

}  // namespace qf
