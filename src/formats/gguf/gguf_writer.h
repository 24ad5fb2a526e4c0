// A streaming GGUF v3 writer.
//
// Usage: add metadata (add_*), then tensors. A tensor is either given with its
// bytes (add_tensor: copied, written at finish()) or declared (declare_tensor)
// and streamed later with write_tensor_data(), in declaration order; the first
// write_tensor_data() call freezes the header (no more metadata or tensors).
// finish() writes what is left and renames the file into place. Nothing
// appears under the final name before finish(); a writer destroyed without it
// (an exception) leaves no file behind.
//
// Every tensor's data starts at a multiple of the alignment (32, or the value
// given as general.alignment) and is followed by zero padding up to the next
// multiple, as llama.cpp writes it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "formats/gguf/gguf.h"

namespace qf {

struct Vocab;

class GgufWriter {
 public:
  explicit GgufWriter(std::filesystem::path path);
  ~GgufWriter();
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  // Metadata. Misuse (a duplicate key or tensor name, a size mismatch, adding
  // after the header is frozen) throws InvalidInput naming the output file.
  void add_u8(const std::string& key, uint8_t v);
  void add_i8(const std::string& key, int8_t v);
  void add_u16(const std::string& key, uint16_t v);
  void add_i16(const std::string& key, int16_t v);
  void add_u32(const std::string& key, uint32_t v);  // "general.alignment" also sets the alignment
  void add_i32(const std::string& key, int32_t v);
  void add_u64(const std::string& key, uint64_t v);
  void add_i64(const std::string& key, int64_t v);
  void add_f32(const std::string& key, float v);
  void add_f64(const std::string& key, double v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);
  void add_string_array(const std::string& key, const std::vector<std::string>& v);
  void add_f32_array(const std::string& key, const std::vector<float>& v);
  void add_i32_array(const std::string& key, const std::vector<int32_t>& v);
  void add_u32_array(const std::string& key, const std::vector<uint32_t>& v);
  void add_i64_array(const std::string& key, const std::vector<int64_t>& v);
  void add_bool_array(const std::string& key, const std::vector<bool>& v);
  // Any scalar-element array from raw little-endian element bytes (count elements of `elem`).
  void add_raw_array(const std::string& key, GgufType elem, uint64_t count, const void* data);

  // Tensors. dims[0] is the row length; nbytes must equal what type and dims imply.
  void add_tensor(const std::string& name, uint32_t ggml_type, const std::vector<uint64_t>& dims, const void* data,
                  size_t nbytes);
  void declare_tensor(const std::string& name, uint32_t ggml_type, const std::vector<uint64_t>& dims);
  void write_tensor_data(const std::string& name, const void* data, size_t nbytes);

  // Writes the rest, fsyncs and renames into place; returns the final path.
  std::filesystem::path finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Writes a vocabulary as llama.cpp's tokenizer.ggml.* keys: model, pre, tokens,
// scores (if any), token_type (if any), merges (if any), the special ids that
// are >= 0, add_bos_token, add_eos_token, and add_space_prefix for "llama" models.
void write_tokenizer_metadata(GgufWriter& w, const Vocab& vocab);

}  // namespace qf
