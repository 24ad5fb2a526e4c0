#include "core/sha256.h"

#include <string>

#include <gtest/gtest.h>

#include "test_util.h"

namespace qf {
namespace {

// FIPS 180-2, appendix B.
TEST(Sha256, Fips180Vectors) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 h;
  const std::string chunk(1000, 'a');
  for (int i = 0; i < 1000; ++i) h.update(chunk);
  EXPECT_EQ(to_hex(h.finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, EmptyAndReuse) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  Sha256 h;
  h.update("abc");
  (void)h.finish();  // finish resets
  h.update("abc");
  EXPECT_EQ(to_hex(h.finish()), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// Every split of a message across update() calls gives the same digest, including
// lengths around the 55/56/64-byte padding boundaries.
TEST(Sha256, SplitsAndPaddingBoundaries) {
  std::string msg;
  for (int i = 0; i < 200; ++i) msg.push_back(static_cast<char>((i * 37 + 11) & 0xff));
  for (size_t len : {0u, 1u, 55u, 56u, 57u, 63u, 64u, 65u, 119u, 120u, 128u, 200u}) {
    const std::string m = msg.substr(0, len);
    const std::string want = sha256_hex(m);
    for (size_t cut = 0; cut <= len; cut += 7) {
      Sha256 h;
      h.update(m.substr(0, cut));
      h.update(m.substr(cut));
      EXPECT_EQ(to_hex(h.finish()), want) << "len " << len << " cut " << cut;
    }
  }
  // 56 bytes of 'a' is a known edge (padding spills into a second block).
  EXPECT_EQ(sha256_hex(std::string(56, 'a')), "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
}

TEST(Sha256, FileDigestStreamsAndReportsErrors) {
  test::TempDir d;
  std::string big(3 * (1 << 20) + 17, 'a');  // more than one read chunk
  test::write_file(d / "big.bin", big);
  EXPECT_EQ(sha256_file_hex(d / "big.bin"), sha256_hex(big));
  test::write_file(d / "abc.txt", "abc");
  EXPECT_EQ(sha256_file_hex(d / "abc.txt"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_QF_ERROR(sha256_file(d / "missing.bin"), ErrorKind::NotFound, "missing.bin");
}

}  // namespace
}  // namespace qf
