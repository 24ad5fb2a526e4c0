// SHA-256 (FIPS 180-4): a streaming hasher, hex formatting, and a file digest
// read in fixed-size chunks (never the whole file in memory).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace qf {

class Sha256 {
 public:
  using Digest = std::array<uint8_t, 32>;

  Sha256() { reset(); }
  void reset();
  void update(const void* data, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  // Pads, returns the digest and resets the hasher for reuse.
  Digest finish();

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_{};
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_ = 0;  // bytes hashed so far
};

// Lower-case hex of any byte string ("ba7816bf...").
std::string to_hex(const uint8_t* data, size_t n);
inline std::string to_hex(const Sha256::Digest& d) { return to_hex(d.data(), d.size()); }

// One-shot digest of a byte string, as lower-case hex.
std::string sha256_hex(std::string_view data);

// Digest of a file, streamed in 1 MiB chunks. Throws qf::Error: NotFound when
// the file is missing, Io when it cannot be opened or read.
Sha256::Digest sha256_file(const std::filesystem::path& path);
inline std::string sha256_file_hex(const std::filesystem::path& path) { return to_hex(sha256_file(path)); }

}  // namespace qf
