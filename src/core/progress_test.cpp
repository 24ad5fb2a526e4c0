#include "core/progress.h"

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

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

// Bars from a factory (the Python module's) replace stderr: every update
// reaches them, quiet silences them, and an update that throws stops the work
// with the bar closed.
struct RecordingBar final : ProgressBar {
  std::vector<uint64_t>* updates;
  int* closed;
  bool throw_at_3;
  RecordingBar(std::vector<uint64_t>* u, int* c, bool t) : updates(u), closed(c), throw_at_3(t) {}
  void update(uint64_t done) override {
    updates->push_back(done);
    if (throw_at_3 && done == 3) throw std::runtime_error("cancelled");
  }
  void close() noexcept override { ++*closed; }
};

TEST(Progress, BarFactoryReceivesEveryUpdate) {
  std::vector<uint64_t> updates;
  int closed = 0;
  std::string label;
  Progress::set_bar_factory([&](const std::string& l, uint64_t total, const std::string&) {
    label = l + "/" + std::to_string(total);
    return std::make_unique<RecordingBar>(&updates, &closed, true);
  });
  {
    Progress p("eval", 5, "spans");
    p.add();
    p.add();
  }
  EXPECT_EQ(label, "eval/5");
  EXPECT_EQ(updates, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(closed, 1);
  updates.clear();
  EXPECT_THROW(
      {
        Progress p("eval", 5, "spans");
        for (int i = 0; i < 5; ++i) p.add();
      },
      std::runtime_error);
  EXPECT_EQ(updates, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(closed, 2);  // closed while unwinding
  Progress::set_quiet(true);
  updates.clear();
  {
    Progress p("eval", 5, "spans");
    p.add();
  }
  EXPECT_TRUE(updates.empty());
  EXPECT_EQ(closed, 2);
  Progress::set_quiet(false);
  Progress::set_bar_factory({});
}

}  // namespace
}  // namespace qf
