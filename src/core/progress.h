// Progress reporting on stderr.
//
// On a terminal: one bar redrawn in place with rate and ETA. Otherwise (logs,
// CI): a plain line at most every few seconds and one at the end. Quiet mode
// (the CLI's --quiet) silences both.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace qf {

// A progress display other than stderr's (a notebook's bar). update() runs in
// the thread that owns the Progress and may throw to cancel the work (the
// Python module raises KeyboardInterrupt that way); close() must not throw.
class ProgressBar {
 public:
  virtual ~ProgressBar() = default;
  virtual void update(uint64_t done) = 0;
  virtual void close() noexcept = 0;
};
using ProgressBarFactory =
    std::function<std::unique_ptr<ProgressBar>(const std::string& label, uint64_t total, const std::string& unit)>;

class Progress {
 public:
  // total may be 0 when unknown (no percentage or ETA then).
  Progress(std::string label, uint64_t total, std::string unit = "it");
  ~Progress();  // finishes if not finished, but prints no final line while an exception unwinds

  void add(uint64_t n = 1);
  void set(uint64_t done);
  void finish();

  // Process-wide switches, set once by the CLI.
  static void set_quiet(bool quiet);
  static bool quiet();
  // Process-wide: every Progress made afterwards draws through the factory's
  // bars instead of stderr (quiet still silences them); empty restores stderr.
  static void set_bar_factory(ProgressBarFactory factory);
  // Test hook: force the plain mode or the bar mode and a stream.
  static void set_output(std::FILE* out, bool terminal);

  // Formatting helpers, exposed for tests.
  static std::string format_duration(double seconds);     // "1:02:03", "02:03"
  static std::string format_rate(double per_second, const std::string& unit);  // "12.3 tok/s", "1.2k tok/s"

 private:
  void draw(bool final_line);

  std::string label_, unit_;
  uint64_t total_, done_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool finished_ = false;
  bool drawn_ = false;
  int exceptions_ = 0;  // std::uncaught_exceptions() at construction
  std::unique_ptr<ProgressBar> bar_;  // from the bar factory, if one is set
};

// The library's progress(done, total) callbacks as a Progress: the bar is
// made at the first call, when the total is known (pass std::ref(lazy) where
// a std::function is wanted). finish() draws the last line, if any was made.
class LazyProgress {
 public:
  LazyProgress(std::string label, std::string unit) : label_(std::move(label)), unit_(std::move(unit)) {}
  void operator()(int64_t done, int64_t total);
  void finish();

 private:
  std::string label_, unit_;
  std::optional<Progress> bar_;
};

}  // namespace qf
