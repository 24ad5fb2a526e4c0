#include "core/progress.h"

#include <cstdio>
#include <string>

#include <gtest/gtest.h>

namespace qf {
namespace {

std::string run_with(bool terminal, bool quiet) {
  std::FILE* f = std::tmpfile();
  Progress::set_output(f, terminal);
  Progress::set_quiet(quiet);
  {
    Progress p("quantize", 10, "layer");
    for (int i = 0; i < 10; ++i) p.add();
  }
  Progress::set_output(nullptr, false);
  Progress::set_quiet(false);
  std::rewind(f);
  std::string s;
  char buf[256];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s;
}

TEST(Progress, PlainModeEndsWithOneDoneLine) {
  std::string s = run_with(false, false);
  EXPECT_NE(s.find("quantize: 100.0% 10/10 layer"), std::string::npos) << s;
  EXPECT_NE(s.find(" done\n"), std::string::npos) << s;
  EXPECT_EQ(s.find('\r'), std::string::npos) << "no carriage returns in logs";
}

TEST(Progress, TerminalModeDrawsABar) {
  std::string s = run_with(true, false);
  EXPECT_NE(s.find("\r\033[Kquantize [############################] 10/10"), std::string::npos) << s;
}

TEST(Progress, QuietPrintsNothing) { EXPECT_EQ(run_with(false, true), ""); }

TEST(Progress, Formatting) {
  EXPECT_EQ(Progress::format_duration(3723), "1:02:03");
  EXPECT_EQ(Progress::format_duration(125), "02:05");
  EXPECT_EQ(Progress::format_rate(12345, "tok"), "12.3k tok/s");
  EXPECT_EQ(Progress::format_rate(2.5e6, "tok"), "2.5M tok/s");
  EXPECT_EQ(Progress::format_rate(12.34, "tok"), "12.3 tok/s");
}

}  // namespace
}  // namespace qf
