// A fixed-size thread pool with deterministic partitioning.
//
// parallel_for splits [0, n) into chunks whose boundaries depend only on n and
// the grain, never on the number of threads or on timing. Code that reduces
// per chunk (and combines the chunk results in chunk order) therefore gets
// bit-identical results whatever the thread count.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace qf {

struct Chunk {
  int64_t index;  // chunk number, 0-based
  int64_t begin;  // first element
  int64_t end;    // one past the last element
};

// The chunks parallel_for would use: ceil(n / grain) pieces of `grain`
// elements, the last one shorter.
std::vector<Chunk> partition(int64_t n, int64_t grain);

class ThreadPool {
 public:
  // threads <= 0: one per hardware thread.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }  // workers + the caller

  // Runs fn on every chunk of partition(n, grain); the calling thread works
  // too. Blocks until all chunks are done. The first exception thrown by fn is
  // rethrown here (after the remaining chunks are skipped).
  void parallel_for(int64_t n, int64_t grain, const std::function<void(const Chunk&)>& fn);

  // The process-wide pool (size from QF_THREADS or the hardware). A QF_THREADS
  // that is not an integer from 1 to max_threads() is a Usage error.
  static ThreadPool& global();
  // The largest pool a user may ask for: 8 threads per hardware thread, at
  // least 64. Far beyond any speed-up, and never thousands of threads.
  static int max_threads();

 private:
  void worker_loop();
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  bool stop_ = false;
  // Written under mu_; also read without it by workers and the caller that
  // spin briefly before sleeping (see thread_pool.cpp).
  std::atomic<uint64_t> generation_{0};
  // the job in flight
  const std::function<void(const Chunk&)>* fn_ = nullptr;
  std::vector<Chunk> chunks_;
  size_t next_ = 0;
  std::atomic<int> active_{0};
  std::exception_ptr error_;
  std::mutex job_mu_;  // one parallel_for at a time
};

}  // namespace qf
