// GGUF: a validated, zero-copy reader (versions 2 and 3) and the ggml type table.
//
// Layout (all little-endian):
//   "GGUF" magic (uint32 0x46554747), uint32 version, uint64 tensor_count, uint64 kv_count;
//   kv_count pairs: key (gguf string = uint64 length + bytes), uint32 value type, value;
//     an ARRAY value is uint32 element type + uint64 count + elements;
//   tensor_count infos: name (gguf string), uint32 n_dims, uint64 dims[n_dims]
//     (dims[0] is the row length, the fastest-varying axis), uint32 ggml type,
//     uint64 offset relative to the data section;
//   the data section, at the next multiple of general.alignment (uint32, default 32)
//   after the infos.
//
// Validation, so that a crafted file can neither crash the reader nor make it
// allocate more than a small multiple of the file size:
//   - every read is bounds-checked; strings are capped at the remaining bytes and 1 GiB;
//   - kv_count, tensor_count and array counts are capped by the remaining bytes
//     divided by the smallest possible encoding of one item;
//   - value types are the 13 known ones; bools are 0 or 1; arrays of arrays are
//     rejected as Unsupported (no known producer writes them; llama.cpp rejects them too);
//   - duplicate keys and duplicate tensor names are errors;
//   - general.alignment, when present, is a UINT32 nonzero power of two;
//   - tensors have 1..4 dims, each > 0, whose product (and byte size) does not
//     overflow; the ggml type is known (else Unsupported, naming the tensor);
//     dims[0] is a multiple of the type's block size; offsets are multiples of
//     the alignment; data lies inside the file; tensors do not overlap.
// A file with zero tensors (a "vocab-only" file) is valid, and may end before
// the data section's alignment padding.
// Array values are not decoded at open time (only validated): the typed
// getters decode them on demand from the mapping.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/io.h"

namespace qf {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint32_t kGgufDefaultAlignment = 32;

enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7,
  String = 8, Array = 9, U64 = 10, I64 = 11, F64 = 12,
};
// "UINT8", "INT32", "STRING", "ARRAY", ... (the spec's names); "type N" when unknown.
std::string gguf_type_name(GgufType t);

// ---- ggml tensor types --------------------------------------------------------

struct GgmlTypeInfo {
  uint32_t id;
  const char* name;        // "f32", "q4_0", "q4_K", ...
  uint32_t block_size;     // elements per block
  uint32_t type_size;      // bytes per block
};
// nullptr for an unknown (or removed) id.
const GgmlTypeInfo* ggml_type_info(uint32_t id);

namespace ggml_type {
constexpr uint32_t F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
                   Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, IQ4_NL = 20, I8 = 24,
                   I16 = 25, I32 = 26, I64 = 27, F64 = 28, BF16 = 30;
}

// ---- the reader ---------------------------------------------------------------

// One metadata value. Scalars are held decoded; arrays as a validated byte
// range of the mapping (decoded by GgufFile's getters).
struct GgufValue {
  GgufType type = GgufType::U8;
  uint64_t u = 0;       // unsigned integers and bools
  int64_t i = 0;        // signed integers
  double f = 0;         // F32 / F64
  std::string s;        // STRING
  GgufType elem_type = GgufType::U8;  // ARRAY
  uint64_t count = 0;                 // ARRAY: number of elements
  uint64_t offset = 0;                // ARRAY: file offset of the first element
};

struct GgufTensorInfo {
  std::string name;
  uint32_t type = 0;               // ggml type id
  std::vector<uint64_t> dims;      // dims[0] = row length (ggml's ne[0])
  uint64_t offset = 0;             // relative to the data section
  uint64_t nbytes = 0;
  uint64_t numel() const;
};

class GgufFile {
 public:
  // Maps (or reads into memory, see FileResidency) and validates; throws
  // qf::Error naming the file and the problem.
  static GgufFile open(const std::filesystem::path& path, FileResidency residency = FileResidency::Mapped,
                       MemorySeal seal = MemorySeal::Sealed);

  const std::filesystem::path& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // file offset of the data section

  // ---- metadata
  const std::vector<std::string>& keys() const { return keys_; }  // in file order
  bool has(const std::string& key) const { return values_.count(key) > 0; }
  const GgufValue* find(const std::string& key) const;
  const GgufValue& value(const std::string& key) const;  // NotFound when absent
  // Typed getters: NotFound when the key is absent; InvalidInput naming the key,
  // the expected and the actual type on a mismatch. Integer getters accept any
  // integer type whose value fits; get_f32 accepts F32 and F64.
  std::string get_string(const std::string& key) const;
  uint32_t get_u32(const std::string& key) const;
  int64_t get_i64(const std::string& key) const;
  float get_f32(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;  // any integer element type (U64 must fit int64)
  std::vector<float> get_float_array(const std::string& key) const;  // F32 or F64 elements
  uint64_t get_array_size(const std::string& key) const;             // any ARRAY

  // ---- tensors, in file order
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;
  // Zero-copy pointer to a tensor's bytes (NotFound for an unknown name); valid
  // while this object or mapping() lives.
  const uint8_t* tensor_data(const std::string& name) const;
  const uint8_t* tensor_data(const GgufTensorInfo& t) const { return map_->data() + data_offset_ + t.offset; }
  const std::shared_ptr<MappedFile>& mapping() const { return map_; }
  // A tensor's bytes, writable while the mapping is (MappedFile::writable_data);
  // nullptr otherwise.
  uint8_t* writable_tensor_data(const GgufTensorInfo& t) const {
    uint8_t* base = map_->writable_data();
    return base ? base + data_offset_ + t.offset : nullptr;
  }

 private:
  std::filesystem::path path_;
  std::shared_ptr<MappedFile> map_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<std::string> keys_;
  std::map<std::string, GgufValue> values_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;

  const GgufValue& expect(const std::string& key, GgufType want) const;
  const GgufValue& expect_array(const std::string& key, const char* want) const;
  friend struct GgufParser;
};

}  // namespace qf
