// Fuzz target: a .safetensors file (header length, JSON header, tiling of the
// data section), opened as a file and as a one-file checkpoint, every tensor
// converted to f32 through its zero-copy view.
#include "formats/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = qf::fuzz::write_file("safetensors/model.safetensors", data, size);
  qf::fuzz::run([&] {
    const qf::SafetensorsFile f = qf::SafetensorsFile::open(path);
    uint64_t total = 0;
    for (const qf::TensorInfo& t : f.tensors()) {
      const qf::Tensor v = f.tensor(t.name);
      if (v.nbytes() != t.nbytes()) qf::fuzz::fail("tensor view size differs from its data_offsets");
      total += t.nbytes();
      // Reads every byte of the view (ASan catches a read past the mapping).
      if (qf::dtype_is_float(v.dtype()) && v.numel() <= (1 << 16)) v.to_f32_vector();
    }
    if (total + 8 + f.header_size() != size) qf::fuzz::fail("tensors do not tile the data section");
    const qf::Checkpoint ck = qf::Checkpoint::open(path);
    if (ck.total_bytes() != total) qf::fuzz::fail("checkpoint and file disagree on the tensor bytes");
  });
  return 0;
}
