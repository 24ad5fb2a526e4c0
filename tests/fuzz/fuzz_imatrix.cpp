// Fuzz target: an importance matrix, GGUF or legacy .dat (chosen by the
// magic, as read_imatrix does). A file that reads is written back as GGUF
// and read again: the entries must survive unchanged.
#include <cstring>

#include "formats/gguf/imatrix.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = qf::fuzz::write_file("imatrix/imatrix.dat", data, size);
  qf::Imatrix m;
  bool ok = false;
  qf::fuzz::run([&] {
    m = qf::read_imatrix(path);
    ok = true;
  });
  if (!ok) return 0;
  for (const auto& [name, e] : m.entries) {
    const std::vector<float> imp = m.importance(name);
    if (imp.size() != e.in_sum2.size()) qf::fuzz::fail("importance size differs from the entry");
    for (float x : imp)
      if (!(x >= 0)) qf::fuzz::fail("importance of '" + name + "' is negative or NaN");
  }
  const auto copy = qf::fuzz::scratch_dir() / "imatrix" / "copy.gguf";
  qf::fuzz::run([&] {
    qf::write_imatrix_gguf(m, copy);
    const qf::Imatrix back = qf::read_imatrix(copy);
    if (back.entries.size() != m.entries.size()) qf::fuzz::fail("imatrix round trip changed the entry count");
    for (const auto& [name, e] : m.entries) {
      auto it = back.entries.find(name);
      if (it == back.entries.end() || it->second.count != e.count || it->second.in_sum2 != e.in_sum2)
        qf::fuzz::fail("imatrix round trip changed entry '" + name + "'");
    }
  });
  return 0;
}
