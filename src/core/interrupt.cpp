#include "core/interrupt.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "core/temporaries.h"

namespace qf {

namespace {

std::atomic<bool> g_interrupted{false};

struct Hooks {
  std::mutex mu;  // held while the hooks run, so none runs after its owner is gone
  std::map<unsigned long, std::function<void()>> hooks;
  unsigned long next = 0;
};

Hooks& hooks() {
  static Hooks* h = new Hooks();  // never destroyed: the clean-up thread may use it at exit
  return *h;
}

void run_hooks() {
  Hooks& h = hooks();
  std::lock_guard<std::mutex> lock(h.mu);
  for (auto& [id, f] : h.hooks) {
    try {
      f();
    } catch (...) {
      // The process is ending by the signal either way.
    }
  }
}

sigset_t interrupt_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  return set;
}

[[noreturn]] void wait_and_clean(sigset_t set) {
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  g_interrupted.store(true);
  run_hooks();
  const int removed = remove_registered_temporaries();
  std::fprintf(stderr, "quantforge: interrupted by %s%s\n", sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP",
               removed > 0 ? "; temporary outputs removed" : "");
  std::fflush(stderr);
  // End by the signal itself, so that the parent sees how the process ended.
  signal(sig, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  raise(sig);
  _exit(128 + sig);
}

}  // namespace

bool interrupted() { return g_interrupted.load(); }

void await_interrupt_exit() {
  for (;;) pause();  // the clean-up thread raises the signal
}

InterruptHook::InterruptHook(std::function<void()> hook) {
  Hooks& h = hooks();
  std::lock_guard<std::mutex> lock(h.mu);
  id_ = h.next++;
  h.hooks.emplace(id_, std::move(hook));
}

InterruptHook::~InterruptHook() {
  Hooks& h = hooks();
  std::lock_guard<std::mutex> lock(h.mu);
  h.hooks.erase(id_);
}

void install_interrupt_cleanup() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  const sigset_t set = interrupt_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread(wait_and_clean, set).detach();
}

}  // namespace qf
