#include "core/thread_pool.h"

#include <atomic>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include <gtest/gtest.h>

namespace qf {
namespace {

TEST(Partition, DependsOnlyOnSizeAndGrain) {
  auto c = partition(10, 4);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].begin, 0);
  EXPECT_EQ(c[1].begin, 4);
  EXPECT_EQ(c[2].begin, 8);
  EXPECT_EQ(c[2].end, 10);
  EXPECT_EQ(c[2].index, 2);
  EXPECT_TRUE(partition(0, 4).empty());
  EXPECT_EQ(partition(5, 0).size(), 5u);  // grain < 1 treated as 1
}

TEST(ThreadPool, VisitsEveryElementOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    std::vector<std::atomic<int>> hits(1000);
    pool.parallel_for(1000, 7, [&](const Chunk& c) {
      for (int64_t i = c.begin; i < c.end; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1) << threads << " threads";
  }
}

// Per-chunk float sums combined in chunk order give the same bits at any thread count.
TEST(ThreadPool, ChunkReductionIsBitIdenticalAcrossThreadCounts) {
  std::vector<float> x(100003);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(static_cast<double>(i)) * 1e3);
  auto sum_with = [&](int threads) {
    ThreadPool pool(threads);
    auto chunks = partition(static_cast<int64_t>(x.size()), 997);
    std::vector<float> partial(chunks.size());
    pool.parallel_for(static_cast<int64_t>(x.size()), 997, [&](const Chunk& c) {
      float s = 0;
      for (int64_t i = c.begin; i < c.end; ++i) s += x[static_cast<size_t>(i)];
      partial[static_cast<size_t>(c.index)] = s;
    });
    return std::accumulate(partial.begin(), partial.end(), 0.0f);
  };
  float one = sum_with(1);
  for (int t : {2, 4, 7}) EXPECT_EQ(sum_with(t), one);
}

TEST(ThreadPool, RethrowsAndStaysUsable) {
  ThreadPool pool(4);
  EXPECT_THROW(pool.parallel_for(100, 1, [](const Chunk& c) {
    if (c.index == 37) throw std::runtime_error("boom");
  }), std::runtime_error);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, 3, [&](const Chunk& c) { sum += c.end - c.begin; });
  EXPECT_EQ(sum.load(), 100);
}

TEST(ThreadPool, ManySmallJobs) {
  ThreadPool pool(3);
  for (int round = 0; round < 2000; ++round) {
    std::atomic<int> n{0};
    pool.parallel_for(5, 1, [&](const Chunk&) { n++; });
    ASSERT_EQ(n.load(), 5);
  }
}

}  // namespace
}  // namespace qf
