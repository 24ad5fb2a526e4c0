#include "core/huge_page_buffer.h"

#include <cstdint>

#include <gtest/gtest.h>

namespace qf {
namespace {

TEST(HugePageBuffer, ZeroedWritableAndOnA2MiBBoundary) {
  const size_t n = (size_t{3} << 20) + 1;  // not a whole number of huge pages
  HugePageBuffer b(n, "test");
  ASSERT_NE(b.data(), nullptr);
  EXPECT_EQ(b.size(), n);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % (size_t{2} << 20), 0u);
  size_t nonzero = 0;
  for (size_t i = 0; i < n; ++i) nonzero += b.data()[i] != 0;
  EXPECT_EQ(nonzero, 0u);
  for (size_t i = 0; i < n; ++i) b.data()[i] = static_cast<uint8_t>(i * 7);
  b.make_read_only();
  EXPECT_EQ(b.data()[n - 1], static_cast<uint8_t>((n - 1) * 7));
  HugePageBuffer empty(0, "test");
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.size(), 0u);
  empty.make_read_only();  // nothing to protect
}

}  // namespace
}  // namespace qf
