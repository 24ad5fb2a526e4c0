// Progress reporting on stderr.
//
// On a terminal: one bar redrawn in place with rate and ETA. Otherwise (logs,
// CI): a plain line at most every few seconds and one at the end. Quiet mode
// (the CLI's --quiet) silences both.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace qf {

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
};

}  // namespace qf
