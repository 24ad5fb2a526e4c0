#include "core/file_lock.h"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

namespace qf {
namespace {


using test::TempDir;


TEST(FileLock, ExcludesOthersAndIsReleasedWithItsHolder) {
  TempDir dir;
  const auto path = dir.path() / "job.lock";
  std::optional<FileLock> a = FileLock::try_acquire(path);
  ASSERT_TRUE(a);
  std::string holder;
  EXPECT_FALSE(FileLock::try_acquire(path, &holder)) << "a second open of the file must not get the lock";
  EXPECT_NE(holder.find("pid " + std::to_string(getpid())), std::string::npos) << holder;
  a.reset();
  EXPECT_TRUE(FileLock::try_acquire(path)) << "released on destruction";

  // A holder killed with SIGKILL leaves no stale lock.
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::optional<FileLock> held = FileLock::try_acquire(path);
    const char c = held ? 'y' : 'n';
    [[maybe_unused]] const ssize_t w = write(ready[1], &c, 1);
    pause();
    _exit(0);
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  EXPECT_EQ(c, 'y');
  EXPECT_FALSE(FileLock::try_acquire(path)) << "held by the child";
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_TRUE(FileLock::try_acquire(path)) << "the kernel dropped the dead child's lock";
  close(ready[0]);
  close(ready[1]);
}

}  // namespace
}  // namespace qf
