#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io.h"
#include "formats/safetensors.h"

namespace qf {

namespace fs = std::filesystem;
// ordered_json keeps the header's key order, so tensors that share an offset
// (zero-sized ones) keep the order their writer gave them.
using ojson = nlohmann::ordered_json;

namespace {

constexpr uint64_t kMaxHeaderSize = 100'000'000;
// Legit headers nest three levels deep; the cap stops a 100 MB "[[[[..." from
// building a huge DOM.
constexpr int kMaxJsonDepth = 32;
constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

std::string squote(std::string_view s) { return "'" + std::string(s) + "'"; }

// A short rendering of an untrusted JSON value for error messages.
std::string brief(const ojson& v) {
  std::string s = v.dump(-1, ' ', false, ojson::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::string u64_pair(uint64_t a, uint64_t b) {
  return "[" + std::to_string(a) + ", " + std::to_string(b) + "]";
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Parses JSON, rejecting duplicate object keys at any depth (nlohmann would
// silently keep one of them) and absurd nesting.
ojson parse_json_strict(std::string_view text, const std::string& where, const std::string& what) {
  std::vector<std::set<std::string>> keys;
  auto cb = [&](int depth, ojson::parse_event_t ev, ojson& parsed) {
    using E = ojson::parse_event_t;
    if ((ev == E::object_start || ev == E::array_start) && depth >= kMaxJsonDepth)
      throw invalid_input(where, what + " is nested more than " + std::to_string(kMaxJsonDepth) + " levels deep");
    if (ev == E::object_start) keys.emplace_back();
    if (ev == E::object_end) keys.pop_back();
    if (ev == E::key && !keys.back().insert(parsed.get<std::string>()).second)
      throw invalid_input(where, what + " has a duplicate key " + squote(parsed.get<std::string>()));
    return true;
  };
  try {
    return ojson::parse(text.begin(), text.end(), cb);
  } catch (const ojson::parse_error& e) {
    std::string msg = e.what();
    if (auto p = msg.find("] "); p != std::string::npos) msg = msg.substr(p + 2);
    throw invalid_input(where, what + " is not valid JSON (at byte " + std::to_string(e.byte) + "): " + msg);
  } catch (const ojson::exception& e) {  // out_of_range: a number beyond double, such as 1e999
    std::string msg = e.what();
    if (auto p = msg.find("] "); p != std::string::npos) msg = msg.substr(p + 2);
    throw invalid_input(where, what + " is not valid JSON: " + msg);
  }
}

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// ---- one tensor entry -------------------------------------------------------

struct EntryContext {
  const std::string& where;
  const std::string& name;
  Error fail(const std::string& what) const { return invalid_input(where, "tensor " + squote(name) + ": " + what); }
};

DType parse_dtype(const EntryContext& cx, const ojson& v) {
  if (!v.is_string()) throw cx.fail("dtype must be a string, got " + brief(v));
  const std::string& s = v.get_ref<const std::string&>();
  std::optional<DType> t = dtype_from_safetensors(s);
  if (!t) throw unsupported(cx.where, "tensor " + squote(cx.name) + ": unknown dtype " + squote(s));
  return *t;
}

// A JSON integer in [0, max]; nlohmann stores non-negative literals as unsigned
// and negative ones as signed, so floats and negatives fail the first test.
bool as_u64(const ojson& v, uint64_t max, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  uint64_t x = v.get<uint64_t>();
  if (x > max) return false;
  *out = x;
  return true;
}

Shape parse_shape(const EntryContext& cx, const ojson& v) {
  if (!v.is_array()) throw cx.fail("shape must be an array of non-negative integers, got " + brief(v));
  Shape shape;
  shape.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    uint64_t d = 0;
    if (!as_u64(v[i], static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), &d))
      throw cx.fail("shape[" + std::to_string(i) + "] is " + brief(v[i]) + ", dimensions must be non-negative integers below 2^63");
    shape.push_back(static_cast<int64_t>(d));
  }
  return shape;
}

std::pair<uint64_t, uint64_t> parse_offsets(const EntryContext& cx, const ojson& v) {
  uint64_t b = 0, e = 0;
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  if (!v.is_array() || v.size() != 2 || !as_u64(v[0], max, &b) || !as_u64(v[1], max, &e))
    throw cx.fail("data_offsets must be [begin, end] with non-negative integers, got " + brief(v));
  if (b > e) throw cx.fail("data_offsets " + u64_pair(b, e) + " have begin > end");
  return {b, e};
}

uint64_t checked_nbytes(const EntryContext& cx, DType dtype, const Shape& shape) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n))
      throw cx.fail("shape " + shape_str(shape) + " of " + safetensors_dtype_name(dtype) + " overflows a 64-bit byte count");
  }
  return n;
}

const ojson& require_key(const EntryContext& cx, const ojson& entry, const char* key) {
  auto it = entry.find(key);
  if (it == entry.end()) throw cx.fail(std::string("missing key '") + key + "'");
  return *it;
}

TensorInfo parse_entry(const std::string& where, const std::string& name, const ojson& entry) {
  EntryContext cx{where, name};
  if (!entry.is_object()) throw cx.fail("entry must be a JSON object, got " + brief(entry));
  for (const auto& [key, _] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") throw cx.fail("unknown key " + squote(key));
  }
  TensorInfo t;
  t.name = name;
  t.dtype = parse_dtype(cx, require_key(cx, entry, "dtype"));
  t.shape = parse_shape(cx, require_key(cx, entry, "shape"));
  std::tie(t.begin, t.end) = parse_offsets(cx, require_key(cx, entry, "data_offsets"));
  uint64_t need = checked_nbytes(cx, t.dtype, t.shape);
  if (t.end - t.begin != need) {
    throw cx.fail("data_offsets " + u64_pair(t.begin, t.end) + " hold " + std::to_string(t.end - t.begin) +
                  " bytes but shape " + shape_str(t.shape) + " of " + safetensors_dtype_name(t.dtype) + " needs " +
                  std::to_string(need));
  }
  return t;
}

std::map<std::string, std::string> parse_metadata(const std::string& where, const ojson& v) {
  if (!v.is_object()) throw invalid_input(where, "__metadata__ must be an object of strings, got " + brief(v));
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string())
      throw invalid_input(where, "__metadata__ value for " + squote(key) + " must be a string, got " + brief(value));
    out[key] = value.get<std::string>();
  }
  return out;
}

// Sorted by (begin, end), the ranges must cover [0, data_size) exactly once.
void check_tiling(const std::string& where, const std::vector<TensorInfo>& sorted, uint64_t data_size) {
  uint64_t expected = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : sorted) {
    const std::string range = "tensor " + squote(t.name) + ": data_offsets " + u64_pair(t.begin, t.end);
    if (t.end > data_size)
      throw invalid_input(where, range + " run past the end of the " + std::to_string(data_size) +
                                     "-byte data section (truncated file?)");
    if (t.begin < expected)
      throw invalid_input(where, range + " overlap tensor " + squote(prev->name) + " (ends at " + std::to_string(expected) + ")");
    if (t.begin > expected)
      throw invalid_input(where, range + " leave a gap of " + std::to_string(t.begin - expected) + " bytes after " +
                                     (prev ? "tensor " + squote(prev->name) : std::string("the start of the data section")));
    expected = t.end;
    prev = &t;
  }
  if (expected != data_size)
    throw invalid_input(where, "data section has " + std::to_string(data_size - expected) +
                                   " trailing bytes after the last tensor (ends at " + std::to_string(expected) +
                                   ", data section is " + std::to_string(data_size) + " bytes)");
}

// Returns N, the header length, after the checks that need only the prefix.
uint64_t check_prefix(const std::string& where, const MappedFile& m) {
  if (m.size() == 0) throw invalid_input(where, "file is empty (expected an 8-byte header length, then a JSON header)");
  if (m.size() < 8)
    throw invalid_input(where, "file is " + std::to_string(m.size()) + " bytes, shorter than the 8-byte header length");
  uint64_t n = read_le64(m.data());
  if (n < 2) throw invalid_input(where, "header length " + std::to_string(n) + " is less than 2");
  if (n > kMaxHeaderSize)
    throw invalid_input(where, "header length " + std::to_string(n) + " exceeds the limit of " +
                                   std::to_string(kMaxHeaderSize) + " bytes");
  if (n > m.size() - 8)
    throw invalid_input(where, "header length " + std::to_string(n) + " runs past the end of the file (" +
                                   std::to_string(m.size()) + " bytes)");
  if (m.data()[8] != '{')
    throw invalid_input(where, "header must be a JSON object starting with '{'");
  return n;
}

bool plain_file_name(const std::string& s) {
  return !s.empty() && s.find('/') == std::string::npos && s.find('\\') == std::string::npos &&
         s.find("..") == std::string::npos && s.find('\0') == std::string::npos;
}

}  // namespace

// ---- SafetensorsFile --------------------------------------------------------

SafetensorsFile SafetensorsFile::open(const fs::path& path, FileResidency residency) {
  SafetensorsFile f;
  f.path_ = path;
  f.map_ = MappedFile::open(path, residency);
  const std::string where = path.string();
  f.header_size_ = check_prefix(where, *f.map_);
  std::string_view text(reinterpret_cast<const char*>(f.map_->data()) + 8, f.header_size_);
  ojson header = parse_json_strict(text, where, "header");
  if (!header.is_object()) throw invalid_input(where, "header must be a JSON object");
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      f.metadata_ = parse_metadata(where, value);
    } else {
      f.tensors_.push_back(parse_entry(where, key, value));
      f.tensors_.back().file = path;
    }
  }
  std::stable_sort(f.tensors_.begin(), f.tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
  });
  check_tiling(where, f.tensors_, f.map_->size() - 8 - f.header_size_);
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_[f.tensors_[i].name] = i;
  return f;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) throw not_found(path_.string(), "no tensor " + squote(name));
  const uint8_t* p = map_->data() + 8 + header_size_ + t->begin;
  return Tensor::view_of(map_, p, t->dtype, t->shape);
}

// ---- Checkpoint: locating the files ----------------------------------------

namespace {

struct IndexFile {
  fs::path path;
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
};

IndexFile read_index(const fs::path& path) {
  const std::string where = path.string();
  ojson j = parse_json_strict(read_text_file(path), where, "index");
  if (!j.is_object()) throw invalid_input(where, "index must be a JSON object, got " + brief(j));
  auto wm = j.find("weight_map");
  if (wm == j.end()) throw invalid_input(where, "index has no \"weight_map\"");
  if (!wm->is_object()) throw invalid_input(where, "\"weight_map\" must be an object, got " + brief(*wm));
  if (wm->empty()) throw invalid_input(where, "\"weight_map\" is empty");
  IndexFile idx{path, {}};
  for (const auto& [name, file] : wm->items()) {
    if (!file.is_string())
      throw invalid_input(where, "weight_map: tensor " + squote(name) + " maps to " + brief(file) + ", expected a file name");
    const std::string& s = file.get_ref<const std::string&>();
    if (!plain_file_name(s))
      throw invalid_input(where, "weight_map: tensor " + squote(name) + " names shard " + squote(s) +
                                     ", which is not a plain file name in the index's folder");
    idx.weight_map[name] = s;
  }
  return idx;
}

std::vector<fs::path> list_safetensors(const fs::path& dir, const char* suffix) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec) && ends_with(it->path().filename().string(), suffix)) out.push_back(it->path());
  }
  if (ec) throw io_error(dir.string(), "cannot list folder: " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

std::string join_names(const std::vector<fs::path>& paths) {
  std::string s;
  for (const auto& p : paths) s += (s.empty() ? "" : ", ") + p.filename().string();
  return s;
}

// What a folder holds: an index, or one .safetensors file.
fs::path pick_in_folder(const fs::path& dir) {
  if (path_exists(dir / kIndexName)) return dir / kIndexName;
  if (path_exists(dir / kSingleName)) return dir / kSingleName;
  std::vector<fs::path> files = list_safetensors(dir, ".safetensors");
  if (files.size() == 1) return files[0];
  if (files.empty()) throw not_found(dir.string(), "no .safetensors file in this folder");
  // Our own writer with a stem other than "model" leaves <stem>.safetensors.index.json.
  std::vector<fs::path> indexes = list_safetensors(dir, ".safetensors.index.json");
  if (indexes.size() == 1) return indexes[0];
  throw invalid_input(dir.string(), "several .safetensors files and no " + std::string(kIndexName) + ": " + join_names(files));
}

using Locations = std::map<std::string, std::pair<size_t, size_t>>;  // name -> (file, tensor index)

Locations locate_tensors(const std::vector<SafetensorsFile>& files, const std::string& where) {
  Locations loc;
  for (size_t fi = 0; fi < files.size(); ++fi) {
    const auto& tensors = files[fi].tensors();
    for (size_t ti = 0; ti < tensors.size(); ++ti) {
      auto [it, fresh] = loc.emplace(tensors[ti].name, std::pair(fi, ti));
      if (!fresh)
        throw invalid_input(where, "tensor " + squote(tensors[ti].name) + " is in both " +
                                       files[it->second.first].path().filename().string() + " and " +
                                       files[fi].path().filename().string());
    }
  }
  return loc;
}

// The index and the shards must agree tensor for tensor, in both directions.
void check_against_index(const std::vector<SafetensorsFile>& files, const Locations& loc, const IndexFile& idx) {
  const std::string where = idx.path.string();
  auto file_of = [&](size_t fi) { return files[fi].path().filename().string(); };
  for (const auto& [name, file] : idx.weight_map) {
    auto it = loc.find(name);
    if (it == loc.end() || file_of(it->second.first) != file) {
      std::string found = it == loc.end() ? "" : " (it is in " + file_of(it->second.first) + ")";
      throw invalid_input(where, "weight_map lists tensor " + squote(name) + " in " + squote(file) +
                                     ", but that shard does not contain it" + found);
    }
  }
  for (const auto& [name, l] : loc) {
    if (!idx.weight_map.count(name))
      throw invalid_input(where, "tensor " + squote(name) + " in shard " + file_of(l.first) + " is not listed in weight_map");
  }
}

std::vector<SafetensorsFile> open_shards(const IndexFile& idx, FileResidency residency) {
  const fs::path dir = idx.path.parent_path();
  std::set<std::string> shards;
  for (const auto& [name, file] : idx.weight_map) {
    if (!path_exists(dir / file))
      throw not_found(idx.path.string(), "shard " + squote(file) + " (listed for tensor " + squote(name) + ") does not exist");
    shards.insert(file);
  }
  std::vector<SafetensorsFile> files;
  for (const auto& file : shards) files.push_back(SafetensorsFile::open(dir / file, residency));
  return files;
}

}  // namespace

Checkpoint Checkpoint::open(const fs::path& dir_or_file, FileResidency residency) {
  fs::path p = dir_or_file;
  std::error_code ec;
  if (fs::is_directory(p, ec)) p = pick_in_folder(p);
  Checkpoint ck;
  if (ends_with(p.filename().string(), ".index.json")) {
    IndexFile idx = read_index(p);
    ck.index_path_ = p;
    ck.files_ = open_shards(idx, residency);
    ck.where_ = locate_tensors(ck.files_, p.string());
    check_against_index(ck.files_, ck.where_, idx);
  } else {
    ck.files_.push_back(SafetensorsFile::open(p, residency));
    ck.where_ = locate_tensors(ck.files_, p.string());
  }
  for (const auto& [name, _] : ck.where_) ck.names_.push_back(name);
  return ck;
}

const TensorInfo& Checkpoint::info(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    std::string where = index_path_.empty() && !files_.empty() ? files_[0].path().string() : index_path_.string();
    throw not_found(where, "no tensor " + squote(name));
  }
  return files_[it->second.first].tensors()[it->second.second];
}

bool Checkpoint::contains(const std::string& name) const { return where_.count(name) > 0; }

Tensor Checkpoint::tensor(const std::string& name) const {
  if (overlay_ && overlay_->covers(name)) return overlay_->tensor(name, *this);
  return stored_tensor(name);
}

Tensor Checkpoint::stored_tensor(const std::string& name) const {
  const TensorInfo& t = info(name);
  return files_[where_.at(name).first].tensor(t.name);
}

void Checkpoint::set_naming(TensorNaming naming) {
  std::map<std::string, std::pair<size_t, size_t>> renamed;
  for (const auto& [stored, at] : where_) {
    const std::string working = naming.to_working(stored);
    if (!renamed.emplace(working, at).second) {
      std::string where = index_path_.empty() && !files_.empty() ? files_[0].path().string() : index_path_.string();
      throw invalid_input(where, "tensors " + squote(stored) + " and " +
                                     squote(files_[renamed[working].first].tensors()[renamed[working].second].name) +
                                     " are the same tensor " + squote(working) + " under two namings");
    }
  }
  where_ = std::move(renamed);
  names_.clear();
  for (const auto& [name, _] : where_) names_.push_back(name);
  naming_ = std::move(naming);
}

const std::map<std::string, std::string>& Checkpoint::metadata() const {
  static const std::map<std::string, std::string> kEmpty;
  return files_.empty() ? kEmpty : files_[0].metadata();
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t total = 0;
  for (const auto& f : files_)
    for (const auto& t : f.tensors()) total += t.nbytes();
  return total;
}

}  // namespace qf
