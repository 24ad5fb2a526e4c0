// Importance-matrix files (llama.cpp's GGUF and legacy .dat formats); see imatrix.h.
#include "formats/gguf/imatrix.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/io.h"
#include "formats/gguf/gguf.h"
#include "formats/gguf/gguf_writer.h"

namespace qf {

namespace fs = std::filesystem;

namespace {

constexpr const char* kKeyType = "general.type";
constexpr const char* kKeyDatasets = "imatrix.datasets";
constexpr const char* kKeyChunkCount = "imatrix.chunk_count";
constexpr const char* kKeyChunkSize = "imatrix.chunk_size";
const std::string kSumsSuffix = ".in_sum2";
const std::string kCountsSuffix = ".counts";

bool strip_suffix(std::string& s, const std::string& suffix) {
  if (s.size() <= suffix.size() || s.compare(s.size() - suffix.size(), suffix.size(), suffix) != 0) return false;
  s.resize(s.size() - suffix.size());
  return true;
}

// Finite, non-negative values and a positive finite count; `where` names file and tensor.
void check_entry(const std::string& where, const ImatrixEntry& e) {
  if (e.in_sum2.empty()) throw invalid_input(where, "imatrix entry has no values");
  if (!std::isfinite(e.count) || e.count <= 0)
    throw invalid_input(where, "imatrix count " + std::to_string(e.count) + " is not a positive number");
  if (e.in_sum2.size() % static_cast<size_t>(e.nmat()) != 0)
    throw invalid_input(where, "imatrix entry of " + std::to_string(e.nmat()) + " matrices holds " +
                                   std::to_string(e.in_sum2.size()) + " values, not a multiple");
  for (float c : e.expert_counts)
    if (!std::isfinite(c) || c < 0)
      throw invalid_input(where, "imatrix expert count " + std::to_string(c) + " is not a count");
  // Sums of squares (legacy .dat: mean squares times ncall) cannot be negative.
  for (size_t j = 0; j < e.in_sum2.size(); ++j)
    if (!std::isfinite(e.in_sum2[j]) || e.in_sum2[j] < 0)
      throw invalid_input(where, "imatrix value " + std::to_string(j) + " is " + std::to_string(e.in_sum2[j]) +
                                     " (must be finite and not negative: a sum of squared activations)");
}

// ---- legacy .dat --------------------------------------------------------------

struct Reader {
  const uint8_t* data;
  size_t size, pos;
  const std::string& where;

  size_t left() const { return size - pos; }
  void need(size_t n, const std::string& what) const {
    if (left() < n)
      throw invalid_input(where, "truncated legacy imatrix: " + what + " needs " + std::to_string(n) +
                                     " bytes at offset " + std::to_string(pos) + ", " + std::to_string(left()) +
                                     " left");
  }
  int32_t i32(const std::string& what) {
    need(4, what);
    uint32_t v = uint32_t(data[pos]) | uint32_t(data[pos + 1]) << 8 | uint32_t(data[pos + 2]) << 16 |
                 uint32_t(data[pos + 3]) << 24;
    pos += 4;
    return static_cast<int32_t>(v);
  }
  std::string bytes(size_t n, const std::string& what) {
    need(n, what);
    std::string s(reinterpret_cast<const char*>(data + pos), n);
    pos += n;
    return s;
  }
};

float le_f32(const uint8_t* p) {
  uint32_t u = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

Imatrix read_legacy(const MappedFile& file, const std::string& where) {
  Reader r{file.data(), file.size(), 0, where};
  Imatrix m;
  const int32_t n_entries = r.i32("the entry count");
  if (n_entries < 1)
    throw invalid_input(where, "not an imatrix file: no \"GGUF\" magic, and as a legacy .dat its entry count is " +
                                   std::to_string(n_entries));
  for (int32_t i = 0; i < n_entries; ++i) {
    const std::string entry = "entry " + std::to_string(i);
    const int32_t len = r.i32(entry + " name length");
    if (len < 1 || static_cast<size_t>(len) > r.left())
      throw invalid_input(where, "legacy imatrix " + entry + ": name length " + std::to_string(len) +
                                     " is out of range (" + std::to_string(r.left()) + " bytes left)");
    const std::string name = r.bytes(static_cast<size_t>(len), entry + " name");
    const std::string at = where + ": " + name;
    const int32_t ncall = r.i32(entry + " ncall");
    const int32_t nval = r.i32(entry + " nval");
    if (nval < 1) throw invalid_input(at, "legacy imatrix nval " + std::to_string(nval) + " is not positive");
    r.need(static_cast<size_t>(nval) * 4, name + " values");
    ImatrixEntry e;
    e.count = static_cast<float>(ncall);
    e.in_sum2.resize(static_cast<size_t>(nval));
    for (int32_t j = 0; j < nval; ++j) e.in_sum2[j] = le_f32(r.data + r.pos + 4 * size_t(j));
    r.pos += static_cast<size_t>(nval) * 4;
    if (ncall <= 0) throw invalid_input(at, "legacy imatrix ncall " + std::to_string(ncall) + " is not positive");
    check_entry(at, e);
    if (!m.entries.emplace(name, std::move(e)).second) throw invalid_input(at, "duplicate imatrix entry");
  }
  // Optional trailer (written by llama-imatrix since early 2024): chunk count and dataset name.
  if (r.left() > 0) {
    const int32_t last_call = r.i32("the chunk count");
    if (last_call < 0) throw invalid_input(where, "legacy imatrix chunk count " + std::to_string(last_call) + " is negative");
    m.chunk_count = static_cast<uint32_t>(last_call);
    const int32_t len = r.i32("the dataset name length");
    if (len < 0 || static_cast<size_t>(len) > r.left())
      throw invalid_input(where, "legacy imatrix dataset name length " + std::to_string(len) +
                                     " is out of range (" + std::to_string(r.left()) + " bytes left)");
    std::string dataset = r.bytes(static_cast<size_t>(len), "the dataset name");
    if (!dataset.empty()) m.datasets.push_back(std::move(dataset));
    if (r.left() > 0)
      throw invalid_input(where, std::to_string(r.left()) + " unexpected bytes after the legacy imatrix data");
  }
  return m;
}

// ---- GGUF ---------------------------------------------------------------------

std::vector<float> read_f32_tensor(const GgufFile& f, const GgufTensorInfo& t) {
  std::vector<float> v(t.numel());
  const uint8_t* p = f.tensor_data(t);
  for (size_t i = 0; i < v.size(); ++i) v[i] = le_f32(p + 4 * i);
  return v;
}

Imatrix read_gguf(const fs::path& path) {
  const GgufFile f = GgufFile::open(path);
  const std::string where = path.string();
  if (f.has(kKeyType)) {
    const std::string type = f.get_string(kKeyType);
    if (type != "imatrix")
      throw invalid_input(where, "general.type is '" + type + "', not 'imatrix': this GGUF is not an imatrix file");
  }
  for (const char* key : {kKeyDatasets, kKeyChunkCount, kKeyChunkSize})
    if (!f.has(key))
      throw invalid_input(where, std::string("missing imatrix metadata '") + key + "' (not an imatrix file?)");
  Imatrix m;
  m.datasets = f.get_string_array(kKeyDatasets);
  m.chunk_count = f.get_u32(kKeyChunkCount);
  m.chunk_size = f.get_u32(kKeyChunkSize);

  std::map<std::string, std::pair<const GgufTensorInfo*, const GgufTensorInfo*>> pairs;  // sums, counts
  for (const GgufTensorInfo& t : f.tensors()) {
    std::string name = t.name;
    if (strip_suffix(name, kSumsSuffix)) pairs[name].first = &t;
    else if (strip_suffix(name, kCountsSuffix)) pairs[name].second = &t;
    // other tensors (NAME.in_sum from newer llama-imatrix) are ignored, as llama-quantize does
  }
  for (const auto& [name, pc] : pairs) {
    const std::string at = where + ": " + name;
    const GgufTensorInfo* sums = pc.first;
    const GgufTensorInfo* counts = pc.second;
    if (!sums || !counts)
      throw invalid_input(at, std::string("imatrix has ") + (sums ? kSumsSuffix : kCountsSuffix) + " but no " +
                                  (sums ? kCountsSuffix : kSumsSuffix));
    for (const GgufTensorInfo* t : {sums, counts})
      if (t->type != ggml_type::F32)
        throw invalid_input(where + ": " + t->name,
                            std::string("imatrix tensor type is ") + ggml_type_info(t->type)->name + ", expected f32");
    if (sums->dims.size() > 2)
      throw invalid_input(where + ": " + sums->name,
                          "imatrix sums have " + std::to_string(sums->dims.size()) + " dimensions, expected 1 or 2");
    const uint64_t nmat = sums->dims.size() == 2 ? sums->dims[1] : 1;
    if (counts->numel() != nmat || counts->dims[0] != 1)
      throw invalid_input(where + ": " + counts->name,
                          "imatrix counts hold " + std::to_string(counts->numel()) + " values, expected " +
                              std::to_string(nmat));
    ImatrixEntry e;
    e.in_sum2 = read_f32_tensor(f, *sums);
    const std::vector<float> c = read_f32_tensor(f, *counts);
    if (nmat > 1) {
      e.expert_counts = c;
      e.count = 0;
      for (float v : c) e.count += v;
    } else {
      e.count = c[0];
    }
    check_entry(at, e);
    m.entries.emplace(name, std::move(e));
  }
  if (m.entries.empty()) throw invalid_input(where, "imatrix file has no entries (no NAME.in_sum2 tensors)");
  return m;
}

}  // namespace

std::vector<float> Imatrix::importance(const std::string& tensor) const {
  auto it = entries.find(tensor);
  if (it == entries.end()) return {};
  const ImatrixEntry& e = it->second;
  std::vector<float> out(e.in_sum2.size());
  if (e.expert_counts.empty()) {
    for (size_t j = 0; j < out.size(); ++j) out[j] = e.in_sum2[j] / e.count;
    return out;
  }
  const size_t in = out.size() / e.expert_counts.size();
  for (size_t x = 0; x < e.expert_counts.size(); ++x)
    for (size_t j = x * in; j < (x + 1) * in; ++j) out[j] = e.expert_counts[x] > 0 ? e.in_sum2[j] / e.expert_counts[x] : 1.0f;
  return out;
}

Imatrix read_imatrix(const fs::path& path) {
  auto file = MappedFile::open(path);
  const std::string where = path.string();
  if (file->size() >= 4) {
    uint32_t magic = uint32_t(file->data()[0]) | uint32_t(file->data()[1]) << 8 | uint32_t(file->data()[2]) << 16 |
                     uint32_t(file->data()[3]) << 24;
    if (magic == kGgufMagic) return read_gguf(path);
  }
  return read_legacy(*file, where);
}

void write_imatrix_gguf(const Imatrix& m, const fs::path& path) {
  const std::string where = path.string();
  if (m.entries.empty()) throw invalid_input(where, "refusing to write an imatrix with no entries");
  for (const auto& [name, e] : m.entries) {
    if (name.empty()) throw invalid_input(where, "imatrix entry with an empty name");
    check_entry(where + ": " + name, e);
  }
  GgufWriter w(path);
  w.add_string(kKeyType, "imatrix");
  w.add_string_array(kKeyDatasets, m.datasets);
  w.add_u32(kKeyChunkCount, m.chunk_count);
  w.add_u32(kKeyChunkSize, m.chunk_size);
  for (const auto& [name, e] : m.entries) {  // std::map: sorted names, as llama-imatrix writes them
    if (!e.expert_counts.empty()) {  // ne = [in_features, nmat] and [1, nmat]
      const uint64_t nmat = e.expert_counts.size();
      w.add_tensor(name + kSumsSuffix, ggml_type::F32, {e.in_sum2.size() / nmat, nmat}, e.in_sum2.data(),
                   e.in_sum2.size() * sizeof(float));
      w.add_tensor(name + kCountsSuffix, ggml_type::F32, {1, nmat}, e.expert_counts.data(), nmat * sizeof(float));
      continue;
    }
    w.add_tensor(name + kSumsSuffix, ggml_type::F32, {e.in_sum2.size()}, e.in_sum2.data(),
                 e.in_sum2.size() * sizeof(float));
    const float count = e.count;
    w.add_tensor(name + kCountsSuffix, ggml_type::F32, {1}, &count, sizeof(float));
  }
  w.finish();
}

}  // namespace qf
