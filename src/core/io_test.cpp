#include "core/io.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"

namespace qf {
namespace {

namespace fs = std::filesystem;

size_t files_in(const fs::path& d) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(d)) ++n;
  return n;
}

TEST(AtomicFile, CommitReplacesAtomically) {
  test::TempDir d;
  test::write_file(d / "out.bin", "old");
  {
    AtomicFile f(d / "out.bin");
    f.write("new ");
    f.write("contents");
    EXPECT_EQ(read_text_file(d / "out.bin"), "old");  // untouched until commit
    EXPECT_TRUE(fs::exists(f.temp_path()));
    EXPECT_EQ(f.temp_path().parent_path(), d.path());  // same folder: rename is atomic
    f.commit();
    EXPECT_EQ(f.bytes_written(), 12u);
  }
  EXPECT_EQ(read_text_file(d / "out.bin"), "new contents");
  EXPECT_EQ(files_in(d.path()), 1u);
}

TEST(AtomicFile, AbandonedWriteLeavesNothing) {
  test::TempDir d;
  try {
    AtomicFile f(d / "model.safetensors");
    f.write("partial");
    throw std::runtime_error("killed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(files_in(d.path()), 0u);
}

TEST(AtomicFile, MissingFolderIsAnIoError) {
  EXPECT_QF_ERROR(AtomicFile("/nonexistent-qf-dir/x.bin"), ErrorKind::Io, "cannot create a temporary file");
}

TEST(MappedFile, MapsContentsAndReportsErrors) {
  test::TempDir d;
  test::write_file(d / "a.bin", "hello");
  auto m = MappedFile::open(d / "a.bin");
  ASSERT_EQ(m->size(), 5u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m->data()), 5), "hello");
  test::write_file(d / "empty.bin", "");
  EXPECT_EQ(MappedFile::open(d / "empty.bin")->size(), 0u);
  EXPECT_QF_ERROR(MappedFile::open(d / "missing.bin"), ErrorKind::NotFound, "missing.bin: no such file");
  EXPECT_QF_ERROR(MappedFile::open(d.path()), ErrorKind::InvalidInput, "not a regular file");
}

// Read into memory: the same bytes as the file (a size that is not a whole
// number of 2 MiB pages, so the rounding is exercised), the start on a 2 MiB
// boundary, the same errors as a map, and an empty file as size 0.
TEST(MappedFile, InMemoryHoldsTheFileBytes) {
  test::TempDir d;
  std::string bytes((size_t{2} << 20) + 4099, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 2654435761u) >> 13);
  test::write_file(d / "w.bin", bytes);
  auto m = MappedFile::open(d / "w.bin", FileResidency::InMemory);
  EXPECT_EQ(m->residency(), FileResidency::InMemory);
  ASSERT_EQ(m->size(), bytes.size());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m->data()) % (size_t{2} << 20), 0u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m->data()), m->size()), bytes);
  auto mapped = MappedFile::open(d / "w.bin");
  EXPECT_EQ(mapped->residency(), FileResidency::Mapped);
  EXPECT_EQ(std::memcmp(mapped->data(), m->data(), bytes.size()), 0);
  test::write_file(d / "empty.bin", "");
  auto e = MappedFile::open(d / "empty.bin", FileResidency::InMemory);
  EXPECT_EQ(e->size(), 0u);
  EXPECT_EQ(e->data(), nullptr);
  EXPECT_QF_ERROR(MappedFile::open(d / "missing.bin", FileResidency::InMemory), ErrorKind::NotFound,
                  "missing.bin: no such file");
  EXPECT_QF_ERROR(MappedFile::open(d.path(), FileResidency::InMemory), ErrorKind::InvalidInput, "not a regular file");
}

// The resident bytes (smaps "Rss") of the mapping that holds `p`; -1 when
// /proc/self/smaps cannot tell.
int64_t resident_bytes_of_mapping(const void* p) {
  std::ifstream in("/proc/self/smaps");
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      inside = a >= lo && a < hi;
      continue;
    }
    if (inside && line.rfind("Rss:", 0) == 0) return std::stoll(line.substr(4)) * 1024;
  }
  return -1;
}

// A file map's pages, once released, leave the process's resident memory
// and read back the same bytes; memory that is not a file map (the heap, a
// file read into memory) is left as it is.
TEST(ReleaseMappedPages, DropsAFileMapsPagesAndNothingElse) {
  test::TempDir d;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE)), size = 64 * page;
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>((i * 2654435761u) >> 11);
  test::write_file(d / "w.bin", bytes);
  auto m = MappedFile::open(d / "w.bin");
  ASSERT_EQ(m->size(), size);
  EXPECT_EQ(std::memcmp(m->data(), bytes.data(), size), 0);  // every page touched
  const int64_t before = resident_bytes_of_mapping(m->data());
  if (before < 0) GTEST_SKIP() << "/proc/self/smaps does not list the map";
  EXPECT_GE(before, static_cast<int64_t>(size));
  release_mapped_pages(m->data(), size);
  EXPECT_EQ(resident_bytes_of_mapping(m->data()), 0);
  EXPECT_EQ(std::memcmp(m->data(), bytes.data(), size), 0);  // read again from the file

  std::vector<char> heap(bytes.begin(), bytes.end());
  release_mapped_pages(heap.data(), heap.size());
  EXPECT_TRUE(std::equal(heap.begin(), heap.end(), bytes.begin()));
  auto copy = MappedFile::open(d / "w.bin", FileResidency::InMemory);
  release_mapped_pages(copy->data(), copy->size());
  EXPECT_EQ(std::memcmp(copy->data(), bytes.data(), size), 0);
  release_mapped_pages(m->data() + 1, page);  // no whole page inside: nothing to do
  EXPECT_EQ(std::memcmp(m->data(), bytes.data(), size), 0);
}

TEST(WriteOutputFile, ReplacesFilesFollowsLinksAndWritesThroughFifos) {
  test::TempDir d;
  write_output_file(d / "new.json", "{}");
  EXPECT_EQ(read_text_file(d / "new.json"), "{}");
  test::write_file(d / "target.json", "old");
  fs::create_symlink(d / "target.json", d / "link.json");
  write_output_file(d / "link.json", "new");
  EXPECT_TRUE(fs::is_symlink(d / "link.json"));  // the link stays a link
  EXPECT_EQ(read_text_file(d / "target.json"), "new");
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0600), 0);
  std::string got;
  std::thread reader([&] { got = read_text_file(d / "fifo"); });
  write_output_file(d / "fifo", "through");
  reader.join();
  EXPECT_EQ(got, "through");
  EXPECT_TRUE(fs::is_fifo(d / "fifo"));
  EXPECT_QF_ERROR(write_output_file(d.path(), "x"), ErrorKind::Io, "is a folder");
  if (::access("/dev/full", W_OK) == 0) EXPECT_QF_ERROR(write_output_file("/dev/full", "x"), ErrorKind::Io, "write failed");
}

TEST(CheckOutputFile, RefusesInputsFoldersAndExistingFilesUnlessForced) {
  test::TempDir d;
  fs::create_directory(d / "model");
  test::write_file(d / "model" / "model.safetensors", "weights");
  test::write_file(d / "text.txt", "text");
  fs::create_hard_link(d / "text.txt", d / "alias.txt");
  const std::vector<fs::path> inputs = {d / "model", d / "text.txt"};
  EXPECT_NO_THROW(check_output_file(d / "out.gguf", inputs, false, false, "-o"));
  EXPECT_QF_ERROR(check_output_file(d / "model" / "model.safetensors", inputs, true, false, "-o"), ErrorKind::Io,
                  "-o would overwrite an input of this run");
  EXPECT_QF_ERROR(check_output_file(d / "alias.txt", inputs, true, false, "-o"), ErrorKind::Io, "would overwrite an input");
  test::write_file(d / "old.gguf", "x");
  EXPECT_QF_ERROR(check_output_file(d / "old.gguf", inputs, false, false, "-o"), ErrorKind::Io,
                  "-o already exists; pass --force to replace it");
  EXPECT_NO_THROW(check_output_file(d / "old.gguf", inputs, true, false, "-o"));
  EXPECT_QF_ERROR(check_output_file(d.path(), inputs, true, false, "-o"), ErrorKind::Io, "-o is a folder");
  EXPECT_QF_ERROR(check_output_file(d / "nodir" / "x.gguf", inputs, false, false, "-o"), ErrorKind::Io, "does not exist");
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0600), 0);
  EXPECT_NO_THROW(check_output_file(d / "fifo", inputs, false, true, "--json"));
  EXPECT_QF_ERROR(check_output_file(d / "fifo", inputs, true, false, "-o"), ErrorKind::Io, "not a regular file");
}

TEST(PathChecks, FoldersAndUnreachableNamesAreQfErrors) {
  test::TempDir d;
  test::write_file(d / "a.txt", "x");
  EXPECT_TRUE(path_exists(d / "a.txt"));
  EXPECT_TRUE(is_file(d / "a.txt"));
  EXPECT_FALSE(is_folder(d / "a.txt"));
  EXPECT_TRUE(is_folder(d.path()));
  EXPECT_FALSE(path_exists(d / "missing"));
  EXPECT_FALSE(path_exists(d / "a.txt" / "below-a-file"));  // ENOTDIR counts as absent
  const auto long_name = d / std::string(300, 'n');           // beyond NAME_MAX: ENAMETOOLONG
  EXPECT_QF_ERROR(path_exists(long_name), ErrorKind::Io, "cannot access: File name too long");
  EXPECT_QF_ERROR(read_text_file(long_name), ErrorKind::Io, "File name too long");
  EXPECT_QF_ERROR(read_text_file(d.path()), ErrorKind::InvalidInput, "is a folder, not a regular file");
  EXPECT_QF_ERROR(read_text_file(d / "missing"), ErrorKind::NotFound, "no such file");
}

}  // namespace
}  // namespace qf
