// Clean exit on SIGINT, SIGTERM and SIGHUP: the registered temporaries (see
// temporaries.h) are removed, one line is printed on stderr, and the process
// ends by the signal (exit status 128 + signal number in a shell).
//
// How: install_interrupt_cleanup() blocks the three signals in the calling
// thread, so every thread started afterwards inherits the mask, and starts
// one thread that waits for them with sigwait(). The clean-up therefore runs
// as ordinary code, not inside a signal handler, and may use the filesystem
// library. Call it first thing in main(), before any other thread exists.
// kill -9 cannot be caught: what it leaves behind is removed by the next run
// to the same output (remove_stale_temporaries).
#pragma once

#include <functional>

namespace qf {

void install_interrupt_cleanup();

// True once an interrupt signal has been taken: the clean-up thread is
// removing the temporaries and will end the process by the signal. Work that
// fails meanwhile (a temporary refused as "interrupted", a folder removed
// under a writer) must not decide the exit status: call
// await_interrupt_exit(), which waits for the clean-up thread to end the
// process.
bool interrupted();
[[noreturn]] void await_interrupt_exit();

// Work to do when an interrupt signal is taken, for the lifetime of this
// object (for example, rewriting a record that says "running" to say what
// happened).
// The hooks run on the clean-up thread, after interrupted() turns true and
// before the temporaries are removed (so a hook may still write a file
// atomically), while the other threads go on; a hook must be short, must not
// wait for the thread it interrupts, and its exceptions are swallowed. The
// destructor waits for a hook that is running.
class InterruptHook {
 public:
  explicit InterruptHook(std::function<void()> hook);
  ~InterruptHook();
  InterruptHook(const InterruptHook&) = delete;
  InterruptHook& operator=(const InterruptHook&) = delete;

 private:
  unsigned long id_;
};

}  // namespace qf
