// Shared by the fuzz targets (tests/fuzz/fuzz_*.cpp). Each target defines
// LLVMFuzzerTestOneInput; it is built twice: with clang and libFuzzer under
// ASan + UBSan (QF_FUZZ=ON, scripts/fuzz.sh), and with the normal compiler into
// qf_fuzz_replay, which feeds it every file of its corpus (ctest fuzz_replay.*).
//
// The contract a target checks: for any input, the code under test returns or
// throws qf::Error. Any other exception is a finding: run() prints it and
// aborts, which libFuzzer reports as a crash and the replay test as a failure.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include "core/error.h"

namespace qf::fuzz {

// Runs f; qf::Error (the documented outcome of bad input) is swallowed.
template <class F>
void run(F&& f) {
  try {
    f();
  } catch (const qf::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: an exception other than qf::Error escaped: %s\n", e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "fuzz: a non-standard exception escaped\n");
    std::abort();
  }
}

// A folder of this process under $TMPDIR (or /tmp), made on first use and
// removed at exit: "qf-fuzz-PID".
inline const std::filesystem::path& scratch_dir() {
  struct Dir {
    std::filesystem::path path;
    Dir() {
      const char* tmp = std::getenv("TMPDIR");
      path = std::filesystem::path(tmp && *tmp ? tmp : "/tmp") / ("qf-fuzz-" + std::to_string(getpid()));
      std::filesystem::create_directories(path);
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

// Writes bytes to scratch_dir()/name (parent folders made as needed) and
// returns the path; the same name is overwritten by the next input.
inline std::filesystem::path write_file(const std::string& name, const void* data, size_t size) {
  const std::filesystem::path p = scratch_dir() / name;
  std::filesystem::create_directories(p.parent_path());
  std::FILE* f = std::fopen(p.c_str(), "wb");
  if (!f) {
    std::perror(p.c_str());
    std::abort();
  }
  if (size && std::fwrite(data, 1, size, f) != size) {
    std::perror(p.c_str());
    std::abort();
  }
  std::fclose(f);
  return p;
}

inline std::filesystem::path write_file(const std::string& name, std::string_view s) {
  return write_file(name, s.data(), s.size());
}

// A finding that is not an exception (a broken invariant): print and abort.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz: %s\n", what.c_str());
  std::abort();
}

}  // namespace qf::fuzz
