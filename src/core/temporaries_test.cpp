#include "core/temporaries.h"

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "core/io.h"
#include "test_util.h"

namespace qf {
namespace {

namespace fs = std::filesystem;

// The pid of a process that has exited (and been reaped).
long dead_pid() {
  const pid_t p = fork();
  if (p == 0) _exit(0);
  int status = 0;
  waitpid(p, &status, 0);
  return p;
}

fs::path temp_of(const fs::path& final_path, const std::string& kind, const std::string& host, long pid) {
  std::string name = ".";
  name += final_path.filename().string();
  for (const std::string& part : {kind, host, std::to_string(pid), std::string("0123abcd")}) name += "." + part;
  return final_path.parent_path() / name;
}

TEST(Temporaries, NamesSayWhatTheyAreAndWhoOwnsThem) {
  const fs::path t = temp_sibling("/data/out/model.gguf", "tmp");
  EXPECT_EQ(t.parent_path(), fs::path("/data/out"));
  const std::string prefix = ".model.gguf.tmp." + temp_host_tag() + "." + std::to_string(getpid()) + ".";
  EXPECT_EQ(t.filename().string().substr(0, prefix.size()), prefix);
  EXPECT_EQ(t.filename().string().size(), prefix.size() + 8);  // 8 hex digits
  EXPECT_NE(temp_sibling("/data/out/model.gguf", "tmp"), t);
  EXPECT_EQ(temp_host_tag().find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-"),
            std::string::npos);
}

TEST(Temporaries, StaleOnesOfDeadProcessesOnThisHostAreRemoved) {
  test::TempDir d;
  const fs::path out = d / "q";
  const long dead = dead_pid();
  const fs::path stale_dir = temp_of(out, "tmp", temp_host_tag(), dead);
  const fs::path stale_spill = temp_of(out, "spill", temp_host_tag(), dead);
  const fs::path live = temp_of(out, "tmp", temp_host_tag(), getppid());
  const fs::path mine = temp_of(out, "tmp", temp_host_tag(), getpid());
  const fs::path other_host = temp_of(out, "tmp", temp_host_tag() + "x", dead);
  const fs::path other_output = temp_of(d / "q2", "tmp", temp_host_tag(), dead);
  fs::create_directories(stale_dir / "sub");
  test::write_file(stale_dir / "sub" / "model.safetensors", "half");
  fs::create_directory(stale_spill);
  for (const fs::path& p : {live, mine, other_host, other_output}) fs::create_directory(p);
  test::write_file(d / ".q.tmp.notes", "not a temporary name");
  const auto removed = remove_stale_temporaries(out);
  EXPECT_EQ(removed.size(), 2u);
  EXPECT_FALSE(fs::exists(stale_dir));
  EXPECT_FALSE(fs::exists(stale_spill));
  for (const fs::path& p : {live, mine, other_host, other_output}) EXPECT_TRUE(fs::exists(p)) << p;
  EXPECT_TRUE(fs::exists(d / ".q.tmp.notes"));
}

TEST(Temporaries, AWriterRemovesTheStaleTemporariesOfItsOutput) {
  test::TempDir d;
  const fs::path stale = temp_of(d / "x.json", "tmp", temp_host_tag(), dead_pid());
  test::write_file(stale, "half");
  write_file_atomic(d / "x.json", "{}");
  EXPECT_FALSE(fs::exists(stale));
  const fs::path stale_dir = temp_of(d / "out", "tmp", temp_host_tag(), dead_pid());
  fs::create_directory(stale_dir);
  StagingDir s(d / "out");
  EXPECT_FALSE(fs::exists(stale_dir));
}

TEST(Temporaries, RegisteredOnesAreRemovedOnInterrupt) {
  // remove_registered_temporaries() ends registration for good (the process
  // is about to exit), so it runs in a child process.
  test::TempDir d;
  const pid_t p = fork();
  if (p == 0) {
    auto made = [](const std::function<void()>& make) {
      return [make] {
        make();
        return true;
      };
    };
    bool ok = create_registered_temporary(d / "a", made([&] {
                fs::create_directories(d / "a" / "b");
                test::write_file(d / "a" / "b" / "f", "x");
              })) &&
              create_registered_temporary(d / "c", made([&] { test::write_file(d / "c", "x"); })) &&
              create_registered_temporary(d / "kept", made([&] { test::write_file(d / "kept", "x"); }));
    // A creation that fails registers nothing.
    ok = ok && create_registered_temporary(d / "failed", [] { return false; });
    unregister_temporary(d / "kept");
    // After the clean-up no temporary can be created: `create` is not even called.
    bool called = false;
    ok = ok && remove_registered_temporaries() == 2 &&
         !create_registered_temporary(d / "late", [&] { return called = true; }) && !called;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  waitpid(p, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_FALSE(fs::exists(d / "a"));
  EXPECT_FALSE(fs::exists(d / "c"));
  EXPECT_TRUE(fs::exists(d / "kept"));
}

}  // namespace
}  // namespace qf
