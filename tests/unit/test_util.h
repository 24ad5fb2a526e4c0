// Small helpers shared by the unit tests.
#pragma once

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"

namespace qf::test {

// A fresh folder under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("qf-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// n normally distributed values (mean 0, standard deviation `scale`) drawn
// from std::mt19937(seed), the same sequence on every run.
template <class T = float>
std::vector<T> randn(size_t n, uint32_t seed, T scale = T(1)) {
  std::mt19937 rng(seed);
  std::normal_distribution<T> d(T(0), scale);
  std::vector<T> v(n);
  for (T& x : v) x = d(rng);
  return v;
}

inline void write_file(const std::filesystem::path& p, const std::string& data) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << data;
}

// The project's source tree (tests/data) and the shared folder beside it.
inline std::filesystem::path source_dir() { return QF_SOURCE_DIR; }
inline std::filesystem::path shared_dir() { return QF_SHARED_DIR; }

}  // namespace qf::test

// Expects `stmt` to throw qf::Error of `kind` whose message contains `fragment`.
#define EXPECT_QF_ERROR(stmt, want_kind, want_fragment)                                              \
  do {                                                                                     \
    try {                                                                                  \
      stmt;                                                                                \
      ADD_FAILURE() << "expected qf::Error containing '" << (want_fragment) << "'";             \
    } catch (const qf::Error& e) {                                                         \
      EXPECT_EQ(e.kind(), (want_kind)) << e.what();                                             \
      EXPECT_NE(std::string(e.what()).find(want_fragment), std::string::npos) << e.what();      \
    }                                                                                      \
  } while (0)
