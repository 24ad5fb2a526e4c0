#include "core/huge_page_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace qf {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;
#ifdef MADV_POPULATE_WRITE
constexpr int kMadvPopulateWrite = MADV_POPULATE_WRITE;
#else
constexpr int kMadvPopulateWrite = 23;  // its value in <linux/mman.h> since Linux 5.14
#endif

size_t whole_huge_pages(size_t bytes) { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }

}  // namespace

HugePageBuffer::HugePageBuffer(size_t bytes, const std::string& what) : size_(bytes) {
  if (bytes == 0) return;
  const size_t rounded = whole_huge_pages(bytes);
  region_size_ = rounded + kHugePage;  // one page more, to start on a boundary
  region_ = mmap(nullptr, region_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (region_ == MAP_FAILED) {
    region_ = nullptr;
    throw io_error(what, "cannot allocate " + std::to_string(bytes) + " bytes: " + std::strerror(errno));
  }
  data_ = reinterpret_cast<uint8_t*>(whole_huge_pages(reinterpret_cast<uintptr_t>(region_)));
#ifdef MADV_HUGEPAGE
  madvise(data_, rounded, MADV_HUGEPAGE);  // advice only: failure leaves ordinary pages
#endif
  // Fault the pages in with one call (Linux 5.14+; older kernels refuse it and
  // first touches fault them one by one): several times faster than
  // first-touch faults, most of all with ordinary 4 KiB pages.
  madvise(data_, rounded, kMadvPopulateWrite);
}

HugePageBuffer::~HugePageBuffer() {
  if (region_) munmap(region_, region_size_);
}

void HugePageBuffer::make_read_only() {
  if (data_) mprotect(data_, whole_huge_pages(size_), PROT_READ);
}

}  // namespace qf
