#include "core/interrupt.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "core/io.h"
#include "test_util.h"

namespace qf {
namespace {

// In a child process: an interrupt hook runs before the process ends by the
// signal, late enough that interrupted() is true and early enough that it can
// still write a file atomically (the temporaries registry is still open); a
// hook whose owner is gone does not run.
TEST(InterruptHook, RunsBeforeTheProcessEndsByTheSignal) {
  test::TempDir t;
  const std::filesystem::path ran = t / "ran", gone = t / "gone";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    install_interrupt_cleanup();
    { const InterruptHook dropped([&] { write_file_atomic(gone, "x"); }); }
    const InterruptHook hook([&] { write_file_atomic(ran, interrupted() ? "interrupted" : "not yet"); });
    kill(getpid(), SIGTERM);  // process-directed, so the clean-up thread takes it
    for (int i = 0; i < 1000; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    _exit(3);  // the signal never came
  }
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 1000 && done == 0; ++i) {
    done = waitpid(pid, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "the child did not end";
  }
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit status " << status;
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_EQ(read_text_file(ran), "interrupted");
  EXPECT_FALSE(std::filesystem::exists(gone));
}

}  // namespace
}  // namespace qf
