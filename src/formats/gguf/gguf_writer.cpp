#include "formats/gguf/gguf_writer.h"

#include <cstring>
#include <set>

#include "core/error.h"
#include "core/io.h"
#include "formats/tokenizer/tokenizer.h"

namespace qf {

namespace fs = std::filesystem;

namespace {

// Little-endian serialization into a growing buffer (the header is small
// next to tensor data, so it is assembled in memory and written once).
struct Bytes {
  std::string buf;
  void uint(uint64_t v, int n) {
    for (int k = 0; k < n; ++k) buf.push_back(static_cast<char>((v >> (8 * k)) & 0xff));
  }
  void str(const std::string& s) {
    uint(s.size(), 8);
    buf += s;
  }
  void f32(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    uint(bits, 4);
  }
  void f64(double d) {
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    uint(bits, 8);
  }
};

struct PendingTensor {
  std::string name;
  uint32_t type;
  std::vector<uint64_t> dims;
  uint64_t nbytes = 0;
  uint64_t offset = 0;
  bool has_data = false;  // add_tensor(): bytes owned here
  std::string data;
};

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

struct GgufWriter::Impl {
  fs::path path;
  std::unique_ptr<AtomicFile> file;
  Bytes kv;
  uint64_t kv_count = 0;
  std::set<std::string> keys, names;
  std::vector<PendingTensor> tensors;
  uint64_t data_size = 0;  // running, aligned
  uint32_t alignment = kGgufDefaultAlignment;
  bool frozen = false;     // header written
  size_t next = 0;         // next tensor to write
  bool finished = false;

  Error fail(const std::string& what) const { return invalid_input(path.string(), what); }

  void begin_key(const std::string& key, GgufType t) {
    if (frozen) throw fail("metadata " + key + " added after tensor data started");
    if (!keys.insert(key).second) throw fail("duplicate metadata key '" + key + "'");
    kv.str(key);
    kv.uint(static_cast<uint32_t>(t), 4);
    ++kv_count;
  }
  void begin_array(const std::string& key, GgufType elem, uint64_t count) {
    begin_key(key, GgufType::Array);
    kv.uint(static_cast<uint32_t>(elem), 4);
    kv.uint(count, 8);
  }

  PendingTensor& declare(const std::string& name, uint32_t type, const std::vector<uint64_t>& dims) {
    if (frozen) throw fail("tensor '" + name + "' added after tensor data started");
    if (!names.insert(name).second) throw fail("duplicate tensor name '" + name + "'");
    const GgmlTypeInfo* info = ggml_type_info(type);
    if (!info) throw unsupported(path.string(), "tensor '" + name + "': unknown ggml type " + std::to_string(type));
    if (dims.empty() || dims.size() > 4) throw fail("tensor '" + name + "' must have 1 to 4 dims");
    uint64_t numel = 1;
    for (uint64_t d : dims)
      if (d == 0 || __builtin_mul_overflow(numel, d, &numel)) throw fail("tensor '" + name + "' has invalid dims");
    if (dims[0] % info->block_size != 0)
      throw fail("tensor '" + name + "' row length " + std::to_string(dims[0]) + " is not a multiple of the " +
                 info->name + " block size " + std::to_string(info->block_size));
    PendingTensor t{name, type, dims, numel / info->block_size * info->type_size, data_size, false, {}};
    data_size = align_up(data_size + t.nbytes, alignment);
    tensors.push_back(std::move(t));
    return tensors.back();
  }

  void write_header() {
    Bytes h;
    h.uint(kGgufMagic, 4);
    h.uint(3, 4);
    h.uint(tensors.size(), 8);
    h.uint(kv_count, 8);
    h.buf += kv.buf;
    for (const auto& t : tensors) {
      h.str(t.name);
      h.uint(t.dims.size(), 4);
      for (uint64_t d : t.dims) h.uint(d, 8);
      h.uint(t.type, 4);
      h.uint(t.offset, 8);
    }
    h.buf.resize(align_up(h.buf.size(), alignment), '\0');
    file = std::make_unique<AtomicFile>(path);
    file->write(h.buf);
    frozen = true;
  }

  void write_data(const PendingTensor& t, const void* data) {
    static const char zeros[256] = {};
    file->write(data, t.nbytes);
    uint64_t pad = align_up(t.nbytes, alignment) - t.nbytes;
    while (pad > 0) {
      uint64_t n = std::min<uint64_t>(pad, sizeof zeros);
      file->write(zeros, n);
      pad -= n;
    }
  }

  // Writes the owned tensors that come before the next streamed one.
  void flush_owned() {
    while (next < tensors.size() && tensors[next].has_data) {
      write_data(tensors[next], tensors[next].data.data());
      tensors[next].data = std::string();
      ++next;
    }
  }
};

GgufWriter::GgufWriter(fs::path path) : impl_(std::make_unique<Impl>()) { impl_->path = std::move(path); }
GgufWriter::~GgufWriter() = default;  // AtomicFile removes the temporary file unless committed

#define QF_SCALAR(fn, T, TYPE, WRITE) \
  void GgufWriter::fn(const std::string& key, T v) { impl_->begin_key(key, GgufType::TYPE); impl_->kv.WRITE; }
QF_SCALAR(add_u8, uint8_t, U8, uint(v, 1))
QF_SCALAR(add_i8, int8_t, I8, uint(static_cast<uint8_t>(v), 1))
QF_SCALAR(add_u16, uint16_t, U16, uint(v, 2))
QF_SCALAR(add_i16, int16_t, I16, uint(static_cast<uint16_t>(v), 2))
QF_SCALAR(add_i32, int32_t, I32, uint(static_cast<uint32_t>(v), 4))
QF_SCALAR(add_u64, uint64_t, U64, uint(v, 8))
QF_SCALAR(add_i64, int64_t, I64, uint(static_cast<uint64_t>(v), 8))
QF_SCALAR(add_f32, float, F32, f32(v))
QF_SCALAR(add_f64, double, F64, f64(v))
QF_SCALAR(add_bool, bool, Bool, uint(v ? 1 : 0, 1))
QF_SCALAR(add_string, const std::string&, String, str(v))
#undef QF_SCALAR

void GgufWriter::add_u32(const std::string& key, uint32_t v) {
  if (key == "general.alignment") {
    // Offsets already assigned would be wrong under another alignment.
    if (v == 0 || (v & (v - 1)) != 0) throw impl_->fail("general.alignment " + std::to_string(v) + " is not a power of two");
    if (!impl_->tensors.empty()) throw impl_->fail("general.alignment must be set before any tensor is added");
    impl_->alignment = v;
  }
  impl_->begin_key(key, GgufType::U32);
  impl_->kv.uint(v, 4);
}

void GgufWriter::add_string_array(const std::string& key, const std::vector<std::string>& v) {
  impl_->begin_array(key, GgufType::String, v.size());
  for (const auto& s : v) impl_->kv.str(s);
}
void GgufWriter::add_f32_array(const std::string& key, const std::vector<float>& v) {
  impl_->begin_array(key, GgufType::F32, v.size());
  for (float f : v) impl_->kv.f32(f);
}
void GgufWriter::add_i32_array(const std::string& key, const std::vector<int32_t>& v) {
  impl_->begin_array(key, GgufType::I32, v.size());
  for (int32_t x : v) impl_->kv.uint(static_cast<uint32_t>(x), 4);
}
void GgufWriter::add_u32_array(const std::string& key, const std::vector<uint32_t>& v) {
  impl_->begin_array(key, GgufType::U32, v.size());
  for (uint32_t x : v) impl_->kv.uint(x, 4);
}
void GgufWriter::add_i64_array(const std::string& key, const std::vector<int64_t>& v) {
  impl_->begin_array(key, GgufType::I64, v.size());
  for (int64_t x : v) impl_->kv.uint(static_cast<uint64_t>(x), 8);
}
void GgufWriter::add_bool_array(const std::string& key, const std::vector<bool>& v) {
  impl_->begin_array(key, GgufType::Bool, v.size());
  for (bool b : v) impl_->kv.uint(b ? 1 : 0, 1);
}

void GgufWriter::add_raw_array(const std::string& key, GgufType elem, uint64_t count, const void* data) {
  int size = 0;
  switch (elem) {
    case GgufType::U8: case GgufType::I8: case GgufType::Bool: size = 1; break;
    case GgufType::U16: case GgufType::I16: size = 2; break;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: size = 4; break;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: size = 8; break;
    default: throw impl_->fail("metadata '" + key + "': add_raw_array takes scalar element types only");
  }
  impl_->begin_array(key, elem, count);
  impl_->kv.buf.append(static_cast<const char*>(data), count * size);
}

void GgufWriter::add_tensor(const std::string& name, uint32_t ggml_type, const std::vector<uint64_t>& dims,
                            const void* data, size_t nbytes) {
  PendingTensor& t = impl_->declare(name, ggml_type, dims);
  if (nbytes != t.nbytes) {
    uint64_t want = t.nbytes;
    impl_->names.erase(name);
    impl_->data_size = t.offset;
    impl_->tensors.pop_back();
    throw impl_->fail("tensor '" + name + "': got " + std::to_string(nbytes) + " bytes, type and dims need " +
                      std::to_string(want));
  }
  t.has_data = true;
  t.data.assign(static_cast<const char*>(data), nbytes);
}

void GgufWriter::declare_tensor(const std::string& name, uint32_t ggml_type, const std::vector<uint64_t>& dims) {
  impl_->declare(name, ggml_type, dims);
}

void GgufWriter::write_tensor_data(const std::string& name, const void* data, size_t nbytes) {
  Impl& m = *impl_;
  if (m.finished) throw m.fail("write_tensor_data after finish()");
  if (!m.frozen) m.write_header();
  m.flush_owned();
  if (m.next >= m.tensors.size() || m.tensors[m.next].name != name)
    throw m.fail("tensor '" + name + "' written out of order (expected " +
                 (m.next < m.tensors.size() ? "'" + m.tensors[m.next].name + "'" : std::string("no more tensors")) + ")");
  const PendingTensor& t = m.tensors[m.next];
  if (nbytes != t.nbytes)
    throw m.fail("tensor '" + name + "': got " + std::to_string(nbytes) + " bytes, type and dims need " + std::to_string(t.nbytes));
  m.write_data(t, data);
  ++m.next;
}

fs::path GgufWriter::finish() {
  Impl& m = *impl_;
  if (m.finished) throw m.fail("finish() called twice");
  if (!m.frozen) m.write_header();
  m.flush_owned();
  if (m.next < m.tensors.size()) throw m.fail("tensor '" + m.tensors[m.next].name + "' was declared but never written");
  m.file->commit();
  m.finished = true;
  return m.path;
}

// ---- tokenizer metadata -----------------------------------------------------------

void write_tokenizer_metadata(GgufWriter& w, const Vocab& vocab) {
  w.add_string("tokenizer.ggml.model", vocab.model);
  w.add_string("tokenizer.ggml.pre", vocab.pre.empty() ? "default" : vocab.pre);
  w.add_string_array("tokenizer.ggml.tokens", vocab.tokens);
  if (!vocab.scores.empty()) w.add_f32_array("tokenizer.ggml.scores", vocab.scores);
  if (!vocab.types.empty()) {
    std::vector<int32_t> types;
    types.reserve(vocab.types.size());
    for (TokenType t : vocab.types) types.push_back(static_cast<int32_t>(t));
    w.add_i32_array("tokenizer.ggml.token_type", types);
  }
  if (!vocab.merges.empty()) w.add_string_array("tokenizer.ggml.merges", vocab.merges);
  auto id = [&](const char* key, int32_t v) {
    if (v >= 0) w.add_u32(key, static_cast<uint32_t>(v));
  };
  id("tokenizer.ggml.bos_token_id", vocab.bos_id);
  id("tokenizer.ggml.eos_token_id", vocab.eos_id);
  id("tokenizer.ggml.unknown_token_id", vocab.unk_id);
  id("tokenizer.ggml.padding_token_id", vocab.pad_id);
  w.add_bool("tokenizer.ggml.add_bos_token", vocab.add_bos);
  w.add_bool("tokenizer.ggml.add_eos_token", vocab.add_eos);
  if (vocab.model == "llama") w.add_bool("tokenizer.ggml.add_space_prefix", vocab.add_space_prefix);
}

}  // namespace qf
