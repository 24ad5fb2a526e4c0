// The calibration hidden states between layers: one f32 array per sample,
// kept in memory, or, when they would exceed a byte budget (`--max-memory`),
// compressed with zstd into a private temporary folder and read back one
// sample at a time, so that memory stays near one layer plus one sample.
// The folder is ".NAME.spill.HOST.PID.RAND" beside `spill_beside` (the
// output being written), or ".quantforge-activations.spill.HOST.PID.RAND"
// under $TMPDIR; it is removed when the store is destroyed or the process is
// interrupted, and one left by a killed process is removed by the next store
// made beside the same name (see core/temporaries.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace qf {

class ActivationStore {
 public:
  // sizes: floats per sample. max_bytes 0: no limit (always in memory).
  ActivationStore(std::vector<size_t> sizes, uint64_t max_bytes, const std::filesystem::path& spill_beside = {});
  ~ActivationStore();
  ActivationStore(const ActivationStore&) = delete;
  ActivationStore& operator=(const ActivationStore&) = delete;

  size_t size() const { return sizes_.size(); }
  bool spilled() const { return !dir_.empty(); }
  uint64_t bytes_on_disk() const;
  // A copy of sample i (decompressed when spilled).
  std::vector<float> load(size_t i) const;
  void store(size_t i, const std::vector<float>& x);

 private:
  std::filesystem::path file(size_t i) const;
  std::vector<size_t> sizes_;
  std::vector<std::vector<float>> mem_;
  std::filesystem::path dir_;
};

// "512M", "8G", "1.5GiB", "1000000" -> bytes (K/M/G/T are powers of 1024, as
// memory limits usually are; a trailing "B"/"iB" is accepted). Usage error
// naming the flag otherwise.
uint64_t parse_memory_size(const std::string& s, const std::string& flag);

}  // namespace qf
