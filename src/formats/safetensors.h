// safetensors: validated mmap reader (single files and sharded checkpoints via
// model.safetensors.index.json) and an atomic, sharding streaming writer.
//
// Format: 8-byte little-endian header length N, N bytes of JSON (an object;
// may be padded with trailing spaces), then the data section. Each tensor
// entry is {"dtype", "shape", "data_offsets": [begin, end]} relative to the
// data section; "__metadata__" is an optional string->string map.
// Validation rules (the reference implementation's, written down in docs/formats.md):
//   - N must be >= 2, <= 100,000,000 and 8 + N <= file size;
//   - the header is valid UTF-8 JSON, an object, starting with '{';
//   - every dtype is known, every shape dim is a non-negative integer;
//   - end - begin == numel(shape) * dtype size, begin <= end;
//   - sorted by begin, the ranges tile the data section exactly from 0 with
//     no gap and no overlap, and the last end equals the data section size
//     (trailing bytes after the last tensor are an error).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/io.h"
#include "core/tensor.h"
#include "formats/tensor_naming.h"

namespace qf {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0;  // offsets within the data section
  uint64_t end = 0;
  std::filesystem::path file;  // the .safetensors file holding it
  uint64_t nbytes() const { return end - begin; }
};

class SafetensorsFile {
 public:
  // Maps (or reads into memory, see FileResidency) and validates; throws
  // qf::Error naming the file and the problem.
  static SafetensorsFile open(const std::filesystem::path& path, FileResidency residency = FileResidency::Mapped);

  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Tensors in the order of their data offsets.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  // Zero-copy view on the mapped data; throws NotFound for an unknown name.
  Tensor tensor(const std::string& name) const;
  uint64_t header_size() const { return header_size_; }

 private:
  std::filesystem::path path_;
  std::shared_ptr<MappedFile> map_;
  std::map<std::string, std::string> metadata_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  uint64_t header_size_ = 0;
};

// A whole checkpoint: one model.safetensors, or the shards named by
// model.safetensors.index.json ("weight_map": tensor -> file; every file is
// opened and validated; every listed tensor must exist in its file; a tensor
// present in two shards is an error), or a single .safetensors file path.
class Checkpoint {
 public:
  static Checkpoint open(const std::filesystem::path& dir_or_file, FileResidency residency = FileResidency::Mapped);

  const std::vector<std::string>& names() const { return names_; }  // sorted
  const TensorInfo& info(const std::string& name) const;             // NotFound if absent
  bool contains(const std::string& name) const;
  Tensor tensor(const std::string& name) const;
  const std::vector<SafetensorsFile>& files() const { return files_; }
  const std::map<std::string, std::string>& metadata() const;  // of the first file
  std::filesystem::path index_path() const { return index_path_; }  // empty if unsharded
  uint64_t total_bytes() const;  // sum of tensor bytes

  // A transform of some tensors' values that tensor() applies, such as a
  // LoRA merge (checkpoint/lora_merge.h): names, dtypes and shapes stay the
  // stored ones, so every reader of the checkpoint sees the transformed model.
  class Overlay {
   public:
    virtual ~Overlay() = default;
    virtual bool covers(const std::string& name) const = 0;
    // The value of `name` (covered), computed from the stored tensors of `ck`.
    virtual Tensor tensor(const std::string& name, const Checkpoint& ck) const = 0;
  };
  void set_overlay(std::shared_ptr<const Overlay> overlay) { overlay_ = std::move(overlay); }
  const Overlay* overlay() const { return overlay_.get(); }
  // The tensor as the files store it, whatever the overlay.
  Tensor stored_tensor(const std::string& name) const;

  // Presents the tensors under their working names (formats/tensor_naming.h):
  // names(), info(), contains() and tensor() take and give working names,
  // TensorInfo::name stays the stored one. InvalidInput when two stored names
  // would get one working name. Set before anything reads through the
  // checkpoint (an overlay's names are working names).
  void set_naming(TensorNaming naming);
  const TensorNaming& naming() const { return naming_; }

 private:
  TensorNaming naming_;
  std::shared_ptr<const Overlay> overlay_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::pair<size_t, size_t>> where_;  // name -> (file, tensor index)
  std::vector<std::string> names_;
  std::filesystem::path index_path_;
};

// Streams tensors into <dir>/<stem>.safetensors, or, when the total exceeds
// max_shard_bytes, into <stem>-00001-of-0000N.safetensors shards plus
// <stem>.safetensors.index.json ({"metadata": {"total_size": ...}, "weight_map": {...}}).
// Tensors are written in the order added. Nothing appears under a final name
// until finish(); a writer destroyed before finish() leaves no files behind.
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::filesystem::path dir, std::string stem = "model",
                    uint64_t max_shard_bytes = 5ull << 30);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  void set_metadata(std::map<std::string, std::string> metadata);  // "__metadata__" of every shard
  // Tensors added later are stored under naming.to_stored(name).
  void set_naming(TensorNaming naming);
  void add(const std::string& name, const Tensor& tensor);          // duplicate name -> error
  void add(const std::string& name, DType dtype, const Shape& shape, const void* data, size_t nbytes);
  // Writes headers, renames shards into place, writes the index when sharded.
  // Returns the paths written (shards, then the index if any).
  std::vector<std::filesystem::path> finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qf
