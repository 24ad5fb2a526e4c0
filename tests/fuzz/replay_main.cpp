// qf_fuzz_replay TARGET PATH...: feeds every file (folders: every file in
// them, sorted) to the fuzz target's LLVMFuzzerTestOneInput, without
// libFuzzer. ctest runs it on tests/fuzz/corpus/TARGET (fuzz_replay.TARGET),
// so every seed and every input that once crashed keeps passing in CI. A
// finding aborts, and the last "replay:" line names the input.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

// The build renames each target's LLVMFuzzerTestOneInput to qf_fuzz_<name>
// and lists the names in fuzz_targets.inc as QF_FUZZ_TARGET(name).
#define QF_FUZZ_TARGET(name) extern "C" int qf_fuzz_##name(const uint8_t*, size_t);
#include "fuzz_targets.inc"
#undef QF_FUZZ_TARGET

namespace {

struct Target {
  const char* name;
  int (*fn)(const uint8_t*, size_t);
};

const Target kTargets[] = {
#define QF_FUZZ_TARGET(name) {#name, qf_fuzz_##name},
#include "fuzz_targets.inc"
#undef QF_FUZZ_TARGET
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: qf_fuzz_replay TARGET FILE_OR_FOLDER...\ntargets:");
    for (const Target& t : kTargets) std::fprintf(stderr, " %s", t.name);
    std::fprintf(stderr, "\n");
    return 2;
  }
  const Target* target = nullptr;
  for (const Target& t : kTargets)
    if (std::strcmp(t.name, argv[1]) == 0) target = &t;
  if (!target) {
    std::fprintf(stderr, "qf_fuzz_replay: unknown target '%s'\n", argv[1]);
    return 2;
  }
  std::vector<std::filesystem::path> files;
  for (int i = 2; i < argc; ++i) {
    const std::filesystem::path p(argv[i]);
    if (std::filesystem::is_directory(p)) {
      for (const auto& e : std::filesystem::recursive_directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
    } else {
      files.push_back(p);
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "qf_fuzz_replay: no input files\n");
    return 1;
  }
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "qf_fuzz_replay: cannot read %s\n", f.c_str());
      return 1;
    }
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "replay: %s (%zu bytes)\n", f.c_str(), bytes.size());
    target->fn(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("%s: %zu inputs replayed\n", target->name, files.size());
  return 0;
}
