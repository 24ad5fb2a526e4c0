#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/safetensors.h"

namespace qf {

namespace fs = std::filesystem;

namespace {

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

// One shard's tensor bytes, streamed to a hidden temporary file in the target
// folder (same filesystem as the final file, and memory stays flat).
class ShardData {
 public:
  ShardData(const fs::path& dir, const std::string& stem, size_t k) {
    std::random_device rd;
    for (int attempt = 0; attempt < 16 && fd_ < 0; ++attempt) {
      char suffix[64];
      std::snprintf(suffix, sizeof suffix, ".shard%zu.data.tmp.%d.%08x", k, static_cast<int>(getpid()), rd());
      path_ = dir / ("." + stem + suffix);
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd_ < 0 && errno != EEXIST) break;
    }
    if (fd_ < 0) throw io_error(dir.string(), "cannot create a temporary data file: " + std::string(std::strerror(errno)));
  }
  ~ShardData() {
    close_fd();
    remove_file();
  }
  ShardData(const ShardData&) = delete;
  ShardData& operator=(const ShardData&) = delete;

  void append(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) throw io_error(path_.string(), "write failed: " + std::string(std::strerror(errno)));
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  void close_fd() {
    if (fd_ >= 0 && ::close(fd_) != 0) {
      fd_ = -1;
      throw io_error(path_.string(), "close failed: " + std::string(std::strerror(errno)));
    }
    fd_ = -1;
  }
  void remove_file() {
    if (!path_.empty()) ::unlink(path_.c_str());
    path_.clear();
  }
  const fs::path& path() const { return path_; }

  std::vector<Entry> entries;
  uint64_t bytes = 0;

 private:
  fs::path path_;
  int fd_ = -1;
};

// The header is JSON, which cannot hold invalid UTF-8; better to refuse at add()
// than to fail in finish() after all the data is written.
bool valid_utf8(const std::string& s) {
  try {
    (void)nlohmann::json(s).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

std::string header_json(const std::vector<Entry>& entries, const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  for (const Entry& e : entries) {
    h[e.name] = {{"dtype", safetensors_dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  }
  return h.dump();
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

std::string shard_name(const std::string& stem, size_t k, size_t n) {
  if (n == 1) return stem + ".safetensors";
  char buf[48];
  std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", k + 1, n);
  return stem + buf;
}

}  // namespace

struct SafetensorsWriter::Impl {
  fs::path dir;
  std::string stem;
  uint64_t max_shard_bytes;
  std::map<std::string, std::string> metadata;
  std::vector<std::unique_ptr<ShardData>> shards;
  std::set<std::string> names;
  TensorNaming naming;
  bool finished = false;
  bool broken = false;  // a failed write left a shard's data inconsistent

  std::string where() const { return (dir / (stem + ".safetensors")).string(); }
  void check_usable() const {
    if (finished) throw Error(ErrorKind::Internal, where() + ": writer already finished");
    if (broken) throw Error(ErrorKind::Internal, where() + ": writer is unusable after an earlier write error");
  }
  void check_tensor(const std::string& name, DType dtype, const Shape& shape, const void* data, size_t nbytes) const;
  ShardData& shard_for(uint64_t nbytes);
  void write_shard(AtomicFile& out, ShardData& shard) const;
  std::string index_json(const std::vector<std::string>& files) const;
};

void SafetensorsWriter::Impl::check_tensor(const std::string& name, DType dtype, const Shape& shape, const void* data,
                                           size_t nbytes) const {
  const std::string w = where();
  if (name.empty() || name == "__metadata__" || !valid_utf8(name))
    throw invalid_input(w, "invalid tensor name '" + name + "'");
  if (names.count(name)) throw invalid_input(w, "tensor '" + name + "' added twice");
  const char* st_name = safetensors_dtype_name(dtype);
  if (!st_name || !*st_name) throw unsupported(w, "tensor '" + name + "': dtype has no safetensors name");
  uint64_t need = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(need, static_cast<uint64_t>(d), &need))
      throw invalid_input(w, "tensor '" + name + "': invalid shape " + shape_str(shape));
  }
  if (need != nbytes)
    throw invalid_input(w, "tensor '" + name + "': " + std::to_string(nbytes) + " bytes given but shape " +
                               shape_str(shape) + " of " + safetensors_dtype_name(dtype) + " needs " + std::to_string(need));
  if (nbytes > 0 && data == nullptr) throw invalid_input(w, "tensor '" + name + "': null data");
}

// The current shard, or a fresh one when this tensor would push a non-empty
// shard past the limit (so a tensor bigger than the limit gets a shard alone).
ShardData& SafetensorsWriter::Impl::shard_for(uint64_t nbytes) {
  if (!shards.empty()) {
    ShardData& cur = *shards.back();
    if (cur.entries.empty() || nbytes <= max_shard_bytes - std::min(cur.bytes, max_shard_bytes)) return cur;
    cur.close_fd();  // keeps open descriptors to one however many shards there are
  }
  shards.push_back(std::make_unique<ShardData>(dir, stem, shards.size()));
  return *shards.back();
}

void SafetensorsWriter::Impl::write_shard(AtomicFile& out, ShardData& shard) const {
  std::string header = header_json(shard.entries, metadata);
  header.append((8 - header.size() % 8) % 8, ' ');  // 8 + N a multiple of 8 keeps the data aligned
  out.write(le64(header.size()));
  out.write(header);
  if (shard.bytes == 0) return;
  shard.close_fd();
  auto data = MappedFile::open(shard.path());
  if (data->size() != shard.bytes)
    throw Error(ErrorKind::Internal, shard.path().string() + ": holds " + std::to_string(data->size()) +
                                         " bytes, expected " + std::to_string(shard.bytes));
  // In slices, each slice's pages given back once copied: the shard's data
  // never sits in the process's resident memory as a whole.
  constexpr size_t kSlice = size_t{64} << 20;
  for (size_t off = 0; off < data->size(); off += kSlice) {
    const size_t n = std::min(kSlice, data->size() - off);
    out.write(data->data() + off, n);
    release_mapped_pages(data->data() + off, n);
  }
}

std::string SafetensorsWriter::Impl::index_json(const std::vector<std::string>& files) const {
  nlohmann::json wm = nlohmann::json::object();  // std::map: names come out sorted
  uint64_t total = 0;
  for (size_t k = 0; k < shards.size(); ++k) {
    for (const Entry& e : shards[k]->entries) {
      wm[e.name] = files[k];
      total += e.end - e.begin;
    }
  }
  nlohmann::json j = {{"metadata", {{"total_size", total}}}, {"weight_map", wm}};
  return j.dump(2) + "\n";
}

SafetensorsWriter::SafetensorsWriter(fs::path dir, std::string stem, uint64_t max_shard_bytes)
    : impl_(std::make_unique<Impl>()) {
  impl_->dir = std::move(dir);
  impl_->stem = std::move(stem);
  impl_->max_shard_bytes = max_shard_bytes;
  if (impl_->stem.empty() || impl_->stem.find('/') != std::string::npos)
    throw Error(ErrorKind::Usage, impl_->dir.string() + ": invalid file stem '" + impl_->stem + "'");
  std::error_code ec;
  fs::create_directories(impl_->dir, ec);
  if (ec) throw io_error(impl_->dir.string(), "cannot create folder: " + ec.message());
}

// Impl's ShardData destructors remove any temporary data files.
SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::set_metadata(std::map<std::string, std::string> metadata) {
  impl_->check_usable();
  for (const auto& [k, v] : metadata) {
    if (!valid_utf8(k) || !valid_utf8(v)) throw invalid_input(impl_->where(), "metadata '" + k + "' is not valid UTF-8");
  }
  impl_->metadata = std::move(metadata);
}

void SafetensorsWriter::add(const std::string& name, const Tensor& tensor) {
  add(name, tensor.dtype(), tensor.shape(), tensor.data(), tensor.nbytes());
}

void SafetensorsWriter::set_naming(TensorNaming naming) {
  impl_->check_usable();
  impl_->naming = std::move(naming);
}

void SafetensorsWriter::add(const std::string& working_name, DType dtype, const Shape& shape, const void* data,
                            size_t nbytes) {
  const std::string name = impl_->naming.to_stored(working_name);
  impl_->check_usable();
  impl_->check_tensor(name, dtype, shape, data, nbytes);
  impl_->broken = true;
  ShardData& shard = impl_->shard_for(nbytes);
  shard.append(data, nbytes);
  shard.entries.push_back({name, dtype, shape, shard.bytes, shard.bytes + nbytes});
  shard.bytes += nbytes;
  impl_->names.insert(name);
  impl_->broken = false;
}

std::vector<fs::path> SafetensorsWriter::finish() {
  Impl& m = *impl_;
  m.check_usable();
  m.broken = true;
  if (m.shards.empty()) m.shards.push_back(std::make_unique<ShardData>(m.dir, m.stem, 0));
  const size_t n = m.shards.size();
  std::vector<std::string> files;
  // Every final file is fully written before any is renamed into place, and
  // each shard's temporary data goes as soon as it is copied, so the disk
  // holds at most one shard twice.
  std::vector<std::unique_ptr<AtomicFile>> outs;
  for (size_t k = 0; k < n; ++k) {
    files.push_back(shard_name(m.stem, k, n));
    outs.push_back(std::make_unique<AtomicFile>(m.dir / files.back()));
    m.write_shard(*outs.back(), *m.shards[k]);
    m.shards[k]->remove_file();
  }
  if (n > 1) {
    outs.push_back(std::make_unique<AtomicFile>(m.dir / (m.stem + ".safetensors.index.json")));
    outs.back()->write(m.index_json(files));
  }
  std::vector<fs::path> written;
  for (auto& out : outs) {
    out->commit();
    written.push_back(out->final_path());
  }
  // A stale index from an earlier sharded run would shadow the new single file.
  std::error_code ec;
  if (n == 1) fs::remove(m.dir / (m.stem + ".safetensors.index.json"), ec);
  m.shards.clear();
  m.finished = true;
  m.broken = false;
  return written;
}

}  // namespace qf
