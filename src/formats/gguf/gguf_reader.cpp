#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "formats/gguf/gguf.h"

namespace qf {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMaxStringLength = 1ull << 30;  // no legitimate key or value comes near 1 GiB
constexpr uint32_t kMaxDims = 4;                   // GGML_MAX_DIMS
// Smallest encodings, used to cap counts before anything is allocated:
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;           // empty key, type, one-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // empty name, n_dims, one dim, type, offset

std::string squote(const std::string& s) { return "'" + s + "'"; }

// Fixed size of one scalar of a value type; 0 for STRING and ARRAY, -1 when unknown.
int scalar_size(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::Bool: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
    case GgufType::String: case GgufType::Array: return 0;
  }
  return -1;
}

bool is_integer(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::U16: case GgufType::I16:
    case GgufType::U32: case GgufType::I32: case GgufType::U64: case GgufType::I64: return true;
    default: return false;
  }
}
bool is_signed(GgufType t) {
  return t == GgufType::I8 || t == GgufType::I16 || t == GgufType::I32 || t == GgufType::I64;
}

uint64_t load_le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int k = n - 1; k >= 0; --k) v = (v << 8) | p[k];
  return v;
}

// Sign-extends an n-byte two's-complement value.
int64_t sign_extend(uint64_t v, int n) {
  if (n == 8) return static_cast<int64_t>(v);
  const uint64_t sign = 1ull << (8 * n - 1);
  return static_cast<int64_t>((v ^ sign) - sign);
}

double load_float(const uint8_t* p, GgufType t) {
  if (t == GgufType::F32) {
    uint32_t bits = static_cast<uint32_t>(load_le(p, 4));
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  uint64_t bits = load_le(p, 8);
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}

// A bounds-checked little-endian cursor over the mapping.
struct Cursor {
  const uint8_t* data;
  uint64_t size;
  uint64_t pos = 0;
  const std::string& where;

  uint64_t remaining() const { return size - pos; }
  void need(uint64_t n, const std::string& what) const {
    if (n > remaining())
      throw invalid_input(where, "truncated: " + what + " needs " + std::to_string(n) + " bytes at offset " +
                                     std::to_string(pos) + ", but the file is " + std::to_string(size) + " bytes");
  }
  uint64_t uint(int n, const std::string& what) {
    need(n, what);
    uint64_t v = load_le(data + pos, n);
    pos += n;
    return v;
  }
  uint32_t u32(const std::string& what) { return static_cast<uint32_t>(uint(4, what)); }
  uint64_t u64(const std::string& what) { return uint(8, what); }
  std::string string(const std::string& what) {
    uint64_t n = u64(what + " length");
    if (n > kMaxStringLength)
      throw invalid_input(where, what + " length " + std::to_string(n) + " exceeds the 1 GiB limit");
    need(n, what + " (" + std::to_string(n) + " bytes)");
    std::string s(reinterpret_cast<const char*>(data + pos), n);
    pos += n;
    return s;
  }
  // Skips one string (validating its length) without copying it.
  void skip_string(const std::string& what) {
    uint64_t n = u64(what + " length");
    if (n > kMaxStringLength)
      throw invalid_input(where, what + " length " + std::to_string(n) + " exceeds the 1 GiB limit");
    need(n, what);
    pos += n;
  }
  // A count of items each at least `min_bytes` long must fit in the rest of the file.
  void check_count(uint64_t count, uint64_t min_bytes, const std::string& what) const {
    if (count > remaining() / min_bytes)
      throw invalid_input(where, what + " " + std::to_string(count) + " cannot fit in the remaining " +
                                     std::to_string(remaining()) + " bytes of the file");
  }
};

GgufType read_value_type(Cursor& c, const std::string& what) {
  uint32_t t = c.u32(what + " type");
  if (t > static_cast<uint32_t>(GgufType::F64))
    throw invalid_input(c.where, what + " has unknown value type " + std::to_string(t));
  return static_cast<GgufType>(t);
}

void read_scalar(Cursor& c, GgufType t, GgufValue& v, const std::string& what) {
  const int n = scalar_size(t);
  uint64_t raw = c.uint(n, what);
  if (t == GgufType::F32 || t == GgufType::F64) {
    v.f = load_float(c.data + c.pos - n, t);
  } else if (t == GgufType::Bool) {
    if (raw > 1) throw invalid_input(c.where, what + " is a BOOL with byte value " + std::to_string(raw) + " (must be 0 or 1)");
    v.u = raw;
  } else if (is_signed(t)) {
    v.i = sign_extend(raw, n);
  } else {
    v.u = raw;
  }
}

// Validates an array's elements and leaves the cursor after them.
void read_array(Cursor& c, GgufValue& v, const std::string& what) {
  v.elem_type = read_value_type(c, what + " element");
  if (v.elem_type == GgufType::Array)
    throw unsupported(c.where, what + " is an array of arrays, which this reader does not support");
  v.count = c.u64(what + " count");
  const int n = scalar_size(v.elem_type);
  c.check_count(v.count, n == 0 ? 8 : n, what + " count");
  v.offset = c.pos;
  if (v.elem_type == GgufType::String) {
    for (uint64_t k = 0; k < v.count; ++k) c.skip_string(what + " element " + std::to_string(k));
  } else if (v.elem_type == GgufType::Bool) {
    for (uint64_t k = 0; k < v.count; ++k) {
      GgufValue b;
      read_scalar(c, GgufType::Bool, b, what + " element " + std::to_string(k));
    }
  } else {
    c.pos += v.count * n;  // fits: checked by check_count
  }
}

GgufValue read_value(Cursor& c, GgufType t, const std::string& what) {
  GgufValue v;
  v.type = t;
  if (t == GgufType::String) v.s = c.string(what);
  else if (t == GgufType::Array) read_array(c, v, what);
  else read_scalar(c, t, v, what);
  return v;
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

// ---- type names and the ggml table ----------------------------------------------

std::string gguf_type_name(GgufType t) {
  static const char* const names[] = {"UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
                                      "BOOL", "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64"};
  uint32_t i = static_cast<uint32_t>(t);
  return i < std::size(names) ? names[i] : "type " + std::to_string(i);
}

const GgmlTypeInfo* ggml_type_info(uint32_t id) {
  // Block sizes and bytes per block as ggml defines them (QK_K = 256).
  static const GgmlTypeInfo table[] = {
      {0, "f32", 1, 4},        {1, "f16", 1, 2},        {2, "q4_0", 32, 18},     {3, "q4_1", 32, 20},
      {6, "q5_0", 32, 22},     {7, "q5_1", 32, 24},     {8, "q8_0", 32, 34},     {9, "q8_1", 32, 36},
      {10, "q2_K", 256, 84},   {11, "q3_K", 256, 110},  {12, "q4_K", 256, 144},  {13, "q5_K", 256, 176},
      {14, "q6_K", 256, 210},  {15, "q8_K", 256, 292},  {16, "iq2_xxs", 256, 66}, {17, "iq2_xs", 256, 74},
      {18, "iq3_xxs", 256, 98}, {19, "iq1_s", 256, 50}, {20, "iq4_nl", 32, 18},  {21, "iq3_s", 256, 110},
      {22, "iq2_s", 256, 82},  {23, "iq4_xs", 256, 136}, {24, "i8", 1, 1},       {25, "i16", 1, 2},
      {26, "i32", 1, 4},       {27, "i64", 1, 8},       {28, "f64", 1, 8},       {29, "iq1_m", 256, 56},
      {30, "bf16", 1, 2},      {34, "tq1_0", 256, 54},  {35, "tq2_0", 256, 66},
  };
  for (const auto& t : table)
    if (t.id == id) return &t;
  return nullptr;
}

uint64_t GgufTensorInfo::numel() const {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;  // validated not to overflow at open time
  return n;
}

// ---- parsing ----------------------------------------------------------------------

struct GgufParser {
  GgufFile& f;
  Cursor c;

  void header(uint64_t* tensor_count, uint64_t* kv_count) {
    if (c.size == 0) throw invalid_input(c.where, "file is empty (expected a GGUF header)");
    c.need(4, "magic");
    uint32_t magic = c.u32("magic");
    if (magic != kGgufMagic) throw invalid_input(c.where, "not a GGUF file (bad magic; expected \"GGUF\")");
    f.version_ = c.u32("version");
    if (f.version_ != 2 && f.version_ != 3)
      throw unsupported(c.where, "GGUF version " + std::to_string(f.version_) + " is not supported (only 2 and 3)");
    *tensor_count = c.u64("tensor count");
    *kv_count = c.u64("metadata count");
    c.check_count(*kv_count, kMinKvBytes, "metadata count");
  }

  void metadata(uint64_t kv_count) {
    for (uint64_t k = 0; k < kv_count; ++k) {
      std::string key = c.string("key of metadata entry " + std::to_string(k));
      const std::string what = "metadata " + squote(key);
      GgufType t = read_value_type(c, what);
      GgufValue v = read_value(c, t, what);
      if (!f.values_.emplace(key, std::move(v)).second) throw invalid_input(c.where, "duplicate metadata key " + squote(key));
      f.keys_.push_back(std::move(key));
    }
  }

  void alignment() {
    auto it = f.values_.find("general.alignment");
    if (it == f.values_.end()) return;
    const GgufValue& v = it->second;
    if (v.type != GgufType::U32)
      throw invalid_input(c.where, "metadata 'general.alignment' must be UINT32, got " + gguf_type_name(v.type));
    if (v.u == 0 || (v.u & (v.u - 1)) != 0)
      throw invalid_input(c.where, "general.alignment " + std::to_string(v.u) + " is not a nonzero power of two");
    f.alignment_ = static_cast<uint32_t>(v.u);
  }

  GgufTensorInfo tensor_info(uint64_t k) {
    GgufTensorInfo t;
    t.name = c.string("name of tensor " + std::to_string(k));
    const std::string what = "tensor " + squote(t.name);
    uint32_t n_dims = c.u32(what + " n_dims");
    if (n_dims == 0 || n_dims > kMaxDims)
      throw invalid_input(c.where, what + " has " + std::to_string(n_dims) + " dims (must be 1 to 4)");
    for (uint32_t d = 0; d < n_dims; ++d) t.dims.push_back(c.u64(what + " dims"));
    t.type = c.u32(what + " type");
    t.offset = c.u64(what + " offset");
    size_tensor(t, what);
    if (t.offset % f.alignment_ != 0)
      throw invalid_input(c.where, what + " offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                                       std::to_string(f.alignment_));
    return t;
  }

  // Checks dims against the type and computes the byte size without overflow.
  void size_tensor(GgufTensorInfo& t, const std::string& what) {
    const GgmlTypeInfo* info = ggml_type_info(t.type);
    if (!info) throw unsupported(c.where, what + " has unknown ggml type " + std::to_string(t.type));
    uint64_t numel = 1;
    for (uint64_t d : t.dims) {
      if (d == 0 || d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) || __builtin_mul_overflow(numel, d, &numel) ||
          numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw invalid_input(c.where, what + " has invalid dims (each must be > 0, and their product must fit in 63 bits)");
    }
    if (t.dims[0] % info->block_size != 0)
      throw invalid_input(c.where, what + " row length " + std::to_string(t.dims[0]) + " is not a multiple of the " +
                                       info->name + " block size " + std::to_string(info->block_size));
    if (__builtin_mul_overflow(numel / info->block_size, static_cast<uint64_t>(info->type_size), &t.nbytes))
      throw invalid_input(c.where, what + " byte size overflows 64 bits");
  }

  void tensor_infos(uint64_t tensor_count) {
    c.check_count(tensor_count, kMinTensorInfoBytes, "tensor count");
    for (uint64_t k = 0; k < tensor_count; ++k) {
      GgufTensorInfo t = tensor_info(k);
      if (!f.tensor_index_.emplace(t.name, f.tensors_.size()).second)
        throw invalid_input(c.where, "duplicate tensor name " + squote(t.name));
      f.tensors_.push_back(std::move(t));
    }
  }

  // Every tensor lies inside the data section, and no two share a byte.
  void check_placement() {
    f.data_offset_ = align_up(c.pos, f.alignment_);
    if (f.tensors_.empty()) return;
    const uint64_t data_size = f.data_offset_ <= c.size ? c.size - f.data_offset_ : 0;
    std::vector<const GgufTensorInfo*> sorted;
    for (const auto& t : f.tensors_) sorted.push_back(&t);
    std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    const GgufTensorInfo* prev = nullptr;
    for (const GgufTensorInfo* t : sorted) {
      if (t->offset > data_size || t->nbytes > data_size - t->offset)
        throw invalid_input(c.where, "tensor " + squote(t->name) + " data [" + std::to_string(t->offset) + ", +" +
                                         std::to_string(t->nbytes) + ") runs past the end of the " +
                                         std::to_string(data_size) + "-byte data section (truncated file?)");
      if (prev && t->offset < prev->offset + prev->nbytes)
        throw invalid_input(c.where, "tensor " + squote(t->name) + " at offset " + std::to_string(t->offset) +
                                         " overlaps tensor " + squote(prev->name));
      prev = t;
    }
  }
};

GgufFile GgufFile::open(const fs::path& path, FileResidency residency, MemorySeal seal) {
  GgufFile f;
  f.path_ = path;
  f.map_ = MappedFile::open(path, residency, seal);
  const std::string where = path.string();
  GgufParser p{f, Cursor{f.map_->data(), f.map_->size(), 0, where}};
  uint64_t tensor_count = 0, kv_count = 0;
  p.header(&tensor_count, &kv_count);
  p.metadata(kv_count);
  p.alignment();
  p.tensor_infos(tensor_count);
  p.check_placement();
  return f;
}

// ---- lookups ------------------------------------------------------------------------

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

const GgufValue& GgufFile::value(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) throw not_found(path_.string(), "no metadata key " + squote(key));
  return *v;
}

const GgufValue& GgufFile::expect(const std::string& key, GgufType want) const {
  const GgufValue& v = value(key);
  if (v.type != want)
    throw invalid_input(path_.string(), "metadata " + squote(key) + ": expected " + gguf_type_name(want) + ", got " +
                                            gguf_type_name(v.type));
  return v;
}

const GgufValue& GgufFile::expect_array(const std::string& key, const char* want) const {
  const GgufValue& v = value(key);
  if (v.type != GgufType::Array)
    throw invalid_input(path_.string(), "metadata " + squote(key) + ": expected " + want + ", got " + gguf_type_name(v.type));
  return v;
}

std::string GgufFile::get_string(const std::string& key) const { return expect(key, GgufType::String).s; }

bool GgufFile::get_bool(const std::string& key) const { return expect(key, GgufType::Bool).u != 0; }

int64_t GgufFile::get_i64(const std::string& key) const {
  const GgufValue& v = value(key);
  if (!is_integer(v.type))
    throw invalid_input(path_.string(), "metadata " + squote(key) + ": expected an integer, got " + gguf_type_name(v.type));
  if (is_signed(v.type)) return v.i;
  if (v.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    throw invalid_input(path_.string(), "metadata " + squote(key) + ": value " + std::to_string(v.u) + " does not fit in INT64");
  return static_cast<int64_t>(v.u);
}

uint32_t GgufFile::get_u32(const std::string& key) const {
  const GgufValue& v = value(key);
  if (!is_integer(v.type))
    throw invalid_input(path_.string(), "metadata " + squote(key) + ": expected UINT32, got " + gguf_type_name(v.type));
  bool fits = is_signed(v.type) ? (v.i >= 0 && v.i <= 0xffffffffll) : v.u <= 0xffffffffull;
  if (!fits)
    throw invalid_input(path_.string(), "metadata " + squote(key) + ": value " +
                                            (is_signed(v.type) ? std::to_string(v.i) : std::to_string(v.u)) +
                                            " does not fit in UINT32");
  return static_cast<uint32_t>(is_signed(v.type) ? v.i : v.u);
}

float GgufFile::get_f32(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufType::F32 && v.type != GgufType::F64)
    throw invalid_input(path_.string(), "metadata " + squote(key) + ": expected FLOAT32, got " + gguf_type_name(v.type));
  return static_cast<float>(v.f);
}

uint64_t GgufFile::get_array_size(const std::string& key) const { return expect_array(key, "ARRAY").count; }

std::vector<std::string> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = expect_array(key, "ARRAY of STRING");
  if (v.elem_type != GgufType::String)
    throw invalid_input(path_.string(), "metadata " + squote(key) + ": expected ARRAY of STRING, got ARRAY of " +
                                            gguf_type_name(v.elem_type));
  std::vector<std::string> out;
  out.reserve(v.count);
  const uint8_t* p = map_->data() + v.offset;
  for (uint64_t k = 0; k < v.count; ++k) {  // lengths were validated at open time
    uint64_t n = load_le(p, 8);
    out.emplace_back(reinterpret_cast<const char*>(p + 8), n);
    p += 8 + n;
  }
  return out;
}

std::vector<int64_t> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue& v = expect_array(key, "ARRAY of integers");
  if (!is_integer(v.elem_type))
    throw invalid_input(path_.string(), "metadata " + squote(key) + ": expected ARRAY of integers, got ARRAY of " +
                                            gguf_type_name(v.elem_type));
  const int n = scalar_size(v.elem_type);
  std::vector<int64_t> out(v.count);
  const uint8_t* p = map_->data() + v.offset;
  for (uint64_t k = 0; k < v.count; ++k, p += n) {
    uint64_t raw = load_le(p, n);
    if (v.elem_type == GgufType::U64 && raw > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw invalid_input(path_.string(), "metadata " + squote(key) + ": element " + std::to_string(k) + " does not fit in INT64");
    out[k] = is_signed(v.elem_type) ? sign_extend(raw, n) : static_cast<int64_t>(raw);
  }
  return out;
}

std::vector<float> GgufFile::get_float_array(const std::string& key) const {
  const GgufValue& v = expect_array(key, "ARRAY of FLOAT32");
  if (v.elem_type != GgufType::F32 && v.elem_type != GgufType::F64)
    throw invalid_input(path_.string(), "metadata " + squote(key) + ": expected ARRAY of FLOAT32, got ARRAY of " +
                                            gguf_type_name(v.elem_type));
  const int n = scalar_size(v.elem_type);
  std::vector<float> out(v.count);
  const uint8_t* p = map_->data() + v.offset;
  for (uint64_t k = 0; k < v.count; ++k, p += n) out[k] = static_cast<float>(load_float(p, v.elem_type));
  return out;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const uint8_t* GgufFile::tensor_data(const std::string& name) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (!t) throw not_found(path_.string(), "no tensor " + squote(name));
  return tensor_data(*t);
}

}  // namespace qf
