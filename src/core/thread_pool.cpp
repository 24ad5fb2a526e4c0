#include "core/thread_pool.h"

#include <chrono>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace qf {
namespace {

// A worker polls for the next job, and the caller for the workers to
// finish, for up to kSpin before sleeping on a condition variable. Decode
// runs hundreds of short jobs per token; waking a sleeping thread costs more
// than many of them take. Short enough that an idle pool costs nothing
// noticeable.
constexpr auto kSpin = std::chrono::microseconds(50);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Polls done() until it holds (true) or kSpin has passed (false).
template <typename Done>
bool spin_until(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (unsigned i = 0;; ++i) {
    if (done()) return true;
    cpu_relax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) return false;
  }
}

}  // namespace

std::vector<Chunk> partition(int64_t n, int64_t grain) {
  std::vector<Chunk> chunks;
  if (n <= 0) return chunks;
  if (grain < 1) grain = 1;
  chunks.reserve(static_cast<size_t>((n + grain - 1) / grain));
  for (int64_t b = 0, i = 0; b < n; b += grain, ++i) chunks.push_back({i, b, std::min(n, b + grain)});
  return chunks;
}

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

// Claims chunks until none are left. Called with mu_ unlocked.
void ThreadPool::run_chunks() {
  for (;;) {
    Chunk c;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (next_ >= chunks_.size() || error_) return;
      c = chunks_[next_++];
    }
    try {
      (*fn_)(c);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; });
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      ++active_;
    }
    run_chunks();
    {
      std::lock_guard<std::mutex> lock(mu_);
      --active_;
    }
    done_.notify_all();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(const Chunk&)>& fn) {
  std::vector<Chunk> chunks = partition(n, grain);
  if (chunks.empty()) return;
  if (chunks.size() == 1 || workers_.empty()) {
    for (const Chunk& c : chunks) fn(c);
    return;
  }
  std::lock_guard<std::mutex> job(job_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    chunks_ = std::move(chunks);
    next_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  run_chunks();
  spin_until([&] { return active_.load(std::memory_order_acquire) == 0; });
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return active_ == 0 && (next_ >= chunks_.size() || error_); });
    err = error_;
    fn_ = nullptr;
    chunks_.clear();
  }
  if (err) std::rethrow_exception(err);
}

int ThreadPool::max_threads() {
  return std::max(64, 8 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    const char* env = std::getenv("QF_THREADS");
    if (!env || !*env) return 0;
    const std::string v = env;
    size_t pos = 0;
    long n = 0;
    try {
      n = std::stol(v, &pos, 10);
    } catch (...) {
      pos = 0;
    }
    if (pos != v.size() || n < 1 || n > max_threads())
      throw Error(ErrorKind::Usage, "QF_THREADS must be an integer from 1 to " + std::to_string(max_threads()) +
                                        ", got '" + v + "'");
    return static_cast<int>(n);
  }());
  return pool;
}

}  // namespace qf
