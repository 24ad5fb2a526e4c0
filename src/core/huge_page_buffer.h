// Anonymous memory for large read-mostly data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace qf {

// At least `bytes` of zeroed anonymous memory starting on a 2 MiB boundary,
// advised to use transparent huge pages (a no-op where they are off) and
// faulted in up front. What FileResidency::InMemory reads a file into, and
// what bench's read-bandwidth probe streams over, so that both read memory
// the same way. A failed allocation is an Io error naming `what`.
class HugePageBuffer {
 public:
  HugePageBuffer(size_t bytes, const std::string& what);
  ~HugePageBuffer();
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // From here on a write faults, as it would on a read-only file map.
  void make_read_only();

 private:
  void* region_ = nullptr;
  size_t region_size_ = 0;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace qf
