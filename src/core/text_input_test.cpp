#include "core/text_input.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace qf {
namespace {

TEST(TextInput, Utf8PassesUnchanged) {
  const std::string s = "plain ASCII, caf\xC3\xA9, \xE4\xB8\xAD\xE6\x96\x87, \xF0\x9F\x98\x80\n";
  CheckedText t = check_text_input(s, "t.txt");
  EXPECT_EQ(t.text, s);
  EXPECT_EQ(t.warning, "");
  EXPECT_EQ(check_text_input("", "t.txt").text, "");
}

TEST(TextInput, Utf8BomIsDropped) {
  CheckedText t = check_text_input("\xEF\xBB\xBFhello", "t.txt");
  EXPECT_EQ(t.text, "hello");
  EXPECT_EQ(t.warning, "");
}

TEST(TextInput, Utf16Utf32AndNulAreErrors) {
  EXPECT_QF_ERROR(check_text_input(std::string("\xFF\xFEh\0i\0", 6), "a.txt"), ErrorKind::InvalidInput,
                  "a.txt: is UTF-16 text (byte-order mark), not UTF-8; convert it to UTF-8");
  EXPECT_QF_ERROR(check_text_input(std::string("\xFE\xFF\0h", 4), "a.txt"), ErrorKind::InvalidInput, "is UTF-16 text");
  EXPECT_QF_ERROR(check_text_input(std::string("\xFF\xFE\0\0h\0\0\0", 8), "a.txt"), ErrorKind::InvalidInput, "is UTF-32 text");
  EXPECT_QF_ERROR(check_text_input(std::string("h\0i\0", 4), "a.txt"), ErrorKind::InvalidInput,
                  "a.txt: has a NUL byte at offset 1: not a text file");
}

TEST(TextInput, InvalidUtf8IsKeptWithOneWarning) {
  // Latin-1 e-acute, a lone continuation byte, an overlong '/', a surrogate, a truncated 3-byte sequence at the end.
  const std::string s = "caf\xE9 \x80 \xC0\xAF \xED\xA0\x80 \xE2\x82";
  CheckedText t = check_text_input(s, "b.txt");
  EXPECT_EQ(t.text, s);
  // Counted per byte that starts no valid sequence: E9, 80, C0, AF, ED, A0, 80, E2, 82.
  EXPECT_EQ(t.warning, "b.txt: 9 bytes of invalid UTF-8 (the first at offset 3); they are tokenized as bytes, "
                       "which may not be what the model saw in training");
  EXPECT_NE(check_text_input("\xF4\x90\x80\x80", "c").warning, "");  // above U+10FFFF
  EXPECT_EQ(check_text_input("\xF4\x8F\xBF\xBF", "c").warning, "");  // U+10FFFF itself
}

TEST(TextInput, ReadNamesTheFileAndRefusesFolders) {
  test::TempDir d;
  test::write_file(d / "latin1.txt", "caf\xE9");
  std::string warning;
  EXPECT_EQ(read_text_input(d / "latin1.txt", [&](const std::string& w) { warning = w; }), "caf\xE9");
  EXPECT_NE(warning.find("latin1.txt: 1 byte of invalid UTF-8 (the first at offset 3)"), std::string::npos) << warning;
  EXPECT_QF_ERROR(read_text_input(d.path()), ErrorKind::InvalidInput, "is a folder, not a regular file");
  EXPECT_QF_ERROR(read_text_input(d / "missing.txt"), ErrorKind::NotFound, "missing.txt");
}

}  // namespace
}  // namespace qf
