#include "calibration/resume_state.h"

#include <cstdio>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/sha256.h"
#include "core/io.h"
#include "core/temporaries.h"
#include "formats/safetensors.h"
#include "runtime/linear.h"

namespace qf {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

constexpr const char* kStateFile = "state.json";
// 2: sparse layers also hold their routers (smoothing scales them).
// 3: state.json lists each finished layer's file with its SHA-256.
constexpr int kStateVersion = 3;
constexpr const char* kLayerMeta = "qf_layer";

std::string layer_stem(int64_t li) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "layer-%05lld", static_cast<long long>(li));
  return buf;
}

DType dtype_named(const std::string& s, const std::string& where) {
  const std::optional<DType> d = dtype_from_safetensors(s);
  if (!d) throw invalid_input(where, "unknown dtype '" + s + "'");
  return *d;
}

json scheme_json(const QuantScheme& s) {
  return {{"type", quant_type_name(s.type)}, {"bits", s.bits}, {"symmetric", s.symmetric},
          {"strategy", strategy_name(s.strategy)}, {"group_size", s.group_size},
          {"scale_dtype", safetensors_dtype_name(s.scale_dtype)}, {"double_quant", s.double_quant}};
}

QuantType type_named(const std::string& s, const std::string& where) {
  if (s == "int") return QuantType::Int;
  if (s == "float") return QuantType::Float;
  if (s == "nf4") return QuantType::Nf4;
  if (s == "fp4") return QuantType::Fp4;
  throw invalid_input(where, "unknown quantization type '" + s + "'");
}

QuantStrategy strategy_named(const std::string& s, const std::string& where) {
  for (QuantStrategy t : {QuantStrategy::Tensor, QuantStrategy::Channel, QuantStrategy::Group, QuantStrategy::TensorGroup,
                          QuantStrategy::Token})
    if (s == strategy_name(t)) return t;
  throw invalid_input(where, "unknown strategy '" + s + "'");
}

QuantScheme scheme_from(const json& j, const std::string& where) {
  QuantScheme s;
  s.type = type_named(j.at("type").get<std::string>(), where);
  s.bits = j.at("bits").get<int>();
  s.symmetric = j.at("symmetric").get<bool>();
  s.strategy = strategy_named(j.at("strategy").get<std::string>(), where);
  s.group_size = j.at("group_size").get<int64_t>();
  s.scale_dtype = dtype_named(j.at("scale_dtype").get<std::string>(), where);
  s.double_quant = j.value("double_quant", false);
  return s;
}

json act_json(const ActQuantParams& a) {
  const ActivationScheme& s = a.scheme;
  return {{"type", quant_type_name(s.type)}, {"bits", s.bits},           {"symmetric", s.symmetric},
          {"strategy", strategy_name(s.strategy)}, {"group_size", s.group_size}, {"dynamic", s.dynamic},
          {"scale", a.scale}, {"zero_point", a.zero_point}, {"global_scale", a.global_scale}};
}

ActQuantParams act_from(const json& j, const std::string& where) {
  ActQuantParams a;
  a.scheme.type = type_named(j.at("type").get<std::string>(), where);
  a.scheme.bits = j.at("bits").get<int>();
  a.scheme.symmetric = j.at("symmetric").get<bool>();
  a.scheme.strategy = strategy_named(j.at("strategy").get<std::string>(), where);
  a.scheme.group_size = j.at("group_size").get<int64_t>();
  a.scheme.dynamic = j.at("dynamic").get<bool>();
  a.scale = j.at("scale").get<float>();
  a.zero_point = j.at("zero_point").get<int32_t>();
  a.global_scale = j.at("global_scale").get<float>();
  return a;
}

template <typename T>
void add_vector(SafetensorsWriter& w, const std::string& name, DType dt, const std::vector<T>& v) {
  w.add(name, dt, {static_cast<int64_t>(v.size())}, v.data(), v.size() * sizeof(T));
}

template <typename T>
std::vector<T> read_vector(const SafetensorsFile& f, const std::string& name, DType dt, bool optional) {
  if (!f.find(name)) {
    if (optional) return {};
    throw invalid_input(f.path().string(), "tensor '" + name + "' is missing");
  }
  const Tensor t = f.tensor(name);
  if (t.dtype() != dt || t.ndim() != 1)
    throw invalid_input(f.path().string(), "tensor '" + name + "' has the wrong dtype or rank");
  const T* p = t.data_as<T>();
  return std::vector<T>(p, p + t.numel());
}

// The float dtype of a dense Linear's stored form ("f32", "f16", "bf16").
std::optional<DType> dense_dtype(const rt::Linear& lin) {
  for (DType d : {DType::F32, DType::F16, DType::BF16})
    if (lin.format() == dtype_name(d)) return d;
  return std::nullopt;
}

}  // namespace

fs::path ResumeState::folder_for(const fs::path& out) {
  fs::path p = out;
  if (p.filename().empty()) p = p.parent_path();
  // Appended piece by piece: GCC 12 misreads `"." + string` here as an
  // overlapping copy (-Wrestrict).
  std::string name = ".";
  name += p.filename().string();
  name += ".resume";
  return p.parent_path().empty() ? fs::path(name) : p.parent_path() / name;
}

ResumeState::ResumeState(const fs::path& out, json fingerprint, bool resume,
                         const std::function<void(const std::string&)>& log)
    : dir_(folder_for(out)), fingerprint_(std::move(fingerprint)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (!fs::is_directory(dir_))
    throw io_error(dir_.string(), "cannot create the folder for the resume state: " + ec.message());
  std::string holder;
  lock_ = FileLock::try_acquire(dir_ / "lock", &holder);
  if (!lock_)
    throw io_error(out.string(), "another quantforge process is writing this output (" + holder + ", lock " +
                                     (dir_ / "lock").string() + ")");
  try {
    open_state(out, resume, log);
  } catch (...) {
    // A run that fails here has finished no layer: a folder holding only
    // the lock is worth nothing (a saved state is kept for a later --resume).
    bool only_lock = true;
    for (const auto& e : fs::directory_iterator(dir_, ec)) only_lock = only_lock && e.path().filename() == "lock";
    if (only_lock && !ec) {
      lock_.reset();
      fs::remove_all(dir_, ec);
      unregister_temporary(dir_);
    }
    throw;
  }
}

void ResumeState::open_state(const fs::path& out, bool resume, const std::function<void(const std::string&)>& log) {
  const fs::path state = dir_ / kStateFile;
  int64_t saved = 0;
  std::string why, damaged;
  if (fs::exists(state)) {
    try {
      const json j = json::parse(read_text_file(state));
      if (j.value("format", "") != "quantforge-resume" || j.value("version", 0) != kStateVersion) {
        why = "it is not a state file this version reads";
      } else if (j.at("fingerprint") != fingerprint_) {
        std::string changed;
        const json& old = j.at("fingerprint");
        for (auto it = fingerprint_.begin(); it != fingerprint_.end(); ++it)
          if (!old.contains(it.key()) || old.at(it.key()) != it.value()) changed += (changed.empty() ? "" : ", ") + it.key();
        why = "it was made for different inputs (changed: " + changed + ")";
      } else {
        saved = j.at("layers_done").get<int64_t>();
        const json& sums = j.at("layers");
        if (saved < 0 || !sums.is_array() || sums.size() != static_cast<size_t>(saved))
          throw invalid_input(state.string(), "'layers_done' and the list of layer checksums disagree");
        // Only a prefix of layers whose files are there and hold the bytes
        // that were written counts; the first damaged one and every layer
        // after it run again.
        int64_t ok = 0;
        for (; ok < saved; ++ok) {
          const fs::path file = dir_ / (layer_stem(ok) + ".safetensors");
          const json& e = sums.at(static_cast<size_t>(ok));
          if (e.at("file").get<std::string>() != file.filename().string())
            throw invalid_input(state.string(), "layer " + std::to_string(ok) + " is listed under another file name");
          const std::string want = e.at("sha256").get<std::string>();
          if (!fs::is_regular_file(file)) {
            damaged = file.string() + " is missing";
            break;
          }
          if (sha256_file_hex(file) != want) {
            damaged = file.string() + " does not match its SHA-256 in " + state.string();
            break;
          }
          layer_sha256_.push_back(want);
        }
        saved = ok;
      }
    } catch (const std::exception& e) {  // a damaged state.json: the run starts over
      why = std::string("it cannot be read (") + e.what() + ")";
      saved = 0;
      damaged.clear();
      layer_sha256_.clear();
    }
  }
  if (resume && !damaged.empty())
    log("note: " + damaged + "; that layer and the ones after it are discarded and run again");
  if (resume && saved > 0) {
    layers_done_ = saved;
    log("resuming: " + std::to_string(saved) + " finished layer(s) restored from " + dir_.string());
    // What follows the kept prefix (a damaged layer and its successors) goes.
    for (const auto& e : fs::directory_iterator(dir_)) {
      const std::string name = e.path().filename().string();
      if (name == "lock" || name == kStateFile) continue;
      bool kept = false;
      for (int64_t li = 0; li < saved && !kept; ++li) kept = name == layer_stem(li) + ".safetensors";
      if (!kept) fs::remove_all(e.path());
    }
  } else {
    layer_sha256_.clear();
    if (resume && fs::exists(state))
      log("note: the saved state in " + dir_.string() + " is not used: " + (why.empty() ? "no finished layer" : why) +
          "; starting over");
    else if (resume)
      log("note: no saved state for " + out.string() + "; starting from the first layer");
    else if (fs::exists(state))
      log("note: discarding the state of an interrupted run in " + dir_.string() + " (--resume continues one)");
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename() != "lock") fs::remove_all(e.path());
  }
  // Until a layer is finished the state is worth nothing: an interrupt
  // (SIGINT, SIGTERM, SIGHUP) removes it with the other temporaries. From
  // the first finished layer on it stays, for --resume.
  if (layers_done_ == 0 && !create_registered_temporary(dir_, [this] { return fs::is_directory(dir_); }))
    throw io_error(out.string(), "interrupted");
  write_state();
}

void ResumeState::write_state() const {
  json j;
  j["format"] = "quantforge-resume";
  j["version"] = kStateVersion;
  j["fingerprint"] = fingerprint_;
  json layers = json::array();
  for (int64_t li = 0; li < layers_done_; ++li)
    layers.push_back({{"file", layer_stem(li) + ".safetensors"}, {"sha256", layer_sha256_.at(static_cast<size_t>(li))}});
  j["layers"] = layers;
  j["layers_done"] = layers_done_;  // last: a watcher may look for the line that ends with it
  write_file_atomic(dir_ / kStateFile, j.dump(2) + "\n");
}

void ResumeState::save_layer(const ModelConfig& c, int64_t li, rt::LayerWeights L, std::vector<QuantizedLinearResult> done,
                             double seconds, std::optional<std::pair<float, float>> kv_amax) {
  finish();
  if (li != layers_done_) throw Error(ErrorKind::Internal, "resume state: layer " + std::to_string(li) + " saved out of order");
  pending_ = std::async(std::launch::async, [this, li, ids = rt::layer_linears(c, li), routers = rt::router_linears(c, li),
                                             L = std::move(L), done = std::move(done), seconds, kv_amax] {
    write_layer(li, ids, routers, L, done, seconds, kv_amax);
  });
}

void ResumeState::finish() {
  if (pending_.valid()) pending_.get();
}

void ResumeState::write_layer(int64_t li, const std::vector<rt::LayerLinearId>& ids,
                              const std::vector<rt::RouterLinear>& routers, const rt::LayerWeights& L,
                              const std::vector<QuantizedLinearResult>& done,
                              double seconds, const std::optional<std::pair<float, float>>& kv_amax) {
  SafetensorsWriter w(dir_, layer_stem(li), ~0ull);
  json meta;
  meta["layer"] = li;
  meta["seconds"] = seconds;
  meta["kv_amax"] = kv_amax ? json::array({kv_amax->first, kv_amax->second}) : json();
  json linears = json::array();
  for (const QuantizedLinearResult& d : done) {
    linears.push_back({{"name", d.name},
                       {"scheme", scheme_json(d.q.scheme)},
                       {"rows", d.q.rows},
                       {"cols", d.q.cols},
                       {"global_scale", d.q.global_scale},
                       {"absmax_offset", d.q.absmax_offset},
                       {"error", d.error},
                       {"seconds", d.seconds},
                       {"note", d.note},
                       {"expert_tokens", d.expert_tokens},
                       {"act", d.act ? act_json(*d.act) : json()}});
    // Codes of 4 bits or fewer two to a byte (low nibble first): the state is
    // written once per layer and its size is most of its cost.
    if (d.q.scheme.bits <= 4) {
      std::vector<uint8_t> packed((d.q.q.size() + 1) / 2, 0);
      for (size_t i = 0; i < d.q.q.size(); ++i) packed[i / 2] |= static_cast<uint8_t>((d.q.q[i] & 0xF) << (4 * (i % 2)));
      add_vector(w, d.name + ".q4", DType::U8, packed);
    } else {
      add_vector(w, d.name + ".q", DType::U8, d.q.q);
    }
    add_vector(w, d.name + ".scales", DType::F32, d.q.scales);
    if (!d.q.zeros.empty()) add_vector(w, d.name + ".zeros", DType::I32, d.q.zeros);
    if (!d.q.g_idx.empty()) add_vector(w, d.name + ".g_idx", DType::I32, d.q.g_idx);
    if (!d.q.absmax_codes.empty()) add_vector(w, d.name + ".absmax_codes", DType::U8, d.q.absmax_codes);
    if (!d.q.nested_absmax.empty()) add_vector(w, d.name + ".nested_absmax", DType::F32, d.q.nested_absmax);
  }
  meta["linears"] = linears;
  add_vector(w, "attn_norm", DType::F32, L.attn_norm);
  add_vector(w, "ffn_norm", DType::F32, L.ffn_norm);
  if (!L.q_norm.empty()) add_vector(w, "q_norm", DType::F32, L.q_norm);
  if (!L.k_norm.empty()) add_vector(w, "k_norm", DType::F32, L.k_norm);
  const std::string prefix = "model.layers." + std::to_string(li) + ".";
  for (const rt::LayerLinearId& id : ids) {
    const rt::Linear& lin = *rt::layer_linear(L, id);
    const std::string name = prefix + id.name;
    const std::vector<float> bias = lin.bias_values();
    if (!bias.empty()) add_vector(w, name + ".bias", DType::F32, bias);
    bool quantized = false;
    for (const auto& d : done) quantized = quantized || d.name == name;
    if (quantized) continue;
    const std::optional<DType> dt = dense_dtype(lin);
    if (!dt) throw Error(ErrorKind::Internal, name + ": a Linear left unquantized is not dense (" + lin.format() + ")");
    w.add(name + ".weight", Tensor::from_f32(lin.decode_all(), {lin.out_features(), lin.in_features()}).to(*dt));
  }
  for (const rt::RouterLinear& r : routers) {  // smoothing may have scaled them
    const rt::Linear& lin = *(L.moe.*r.member);
    const std::optional<DType> dt = dense_dtype(lin);
    if (!dt) throw Error(ErrorKind::Internal, prefix + r.name + ": a router is not dense (" + lin.format() + ")");
    w.add(prefix + r.name + ".weight", Tensor::from_f32(lin.decode_all(), {lin.out_features(), lin.in_features()}).to(*dt));
  }
  w.set_metadata({{kLayerMeta, meta.dump()}});
  w.finish();
  // Read back from disk: the checksum covers the bytes a resumed run will read.
  layer_sha256_.push_back(sha256_file_hex(dir_ / (layer_stem(li) + ".safetensors")));
  layers_done_ = li + 1;
  write_state();
  if (li == 0) unregister_temporary(dir_);
}

SavedLayer ResumeState::restore_layer(const ModelConfig& c, int64_t li, rt::LayerWeights& L) const {
  const fs::path file = dir_ / (layer_stem(li) + ".safetensors");
  const std::string where = file.string();
  const SafetensorsFile f = SafetensorsFile::open(file);
  SavedLayer s;
  try {
    auto it = f.metadata().find(kLayerMeta);
    if (it == f.metadata().end()) throw invalid_input(where, "no layer record in the metadata");
    const json meta = json::parse(it->second);
    if (meta.at("layer").get<int64_t>() != li) throw invalid_input(where, "holds another layer");
    s.seconds = meta.at("seconds").get<double>();
    if (!meta.at("kv_amax").is_null())
      s.kv_amax = std::make_pair(meta["kv_amax"][0].get<float>(), meta["kv_amax"][1].get<float>());
    for (const json& l : meta.at("linears")) {
      QuantizedLinearResult d;
      d.name = l.at("name").get<std::string>();
      d.q.scheme = scheme_from(l.at("scheme"), where);
      d.q.rows = l.at("rows").get<int64_t>();
      d.q.cols = l.at("cols").get<int64_t>();
      d.q.global_scale = l.at("global_scale").get<float>();
      if (d.q.scheme.bits <= 4) {
        const std::vector<uint8_t> packed = read_vector<uint8_t>(f, d.name + ".q4", DType::U8, false);
        const size_t n = static_cast<size_t>(d.q.rows * d.q.cols);
        if (packed.size() != (n + 1) / 2) throw invalid_input(where, d.name + ": packed codes have the wrong size");
        d.q.q.resize(n);
        for (size_t i = 0; i < n; ++i) d.q.q[i] = static_cast<uint8_t>((packed[i / 2] >> (4 * (i % 2))) & 0xF);
      } else {
        d.q.q = read_vector<uint8_t>(f, d.name + ".q", DType::U8, false);
      }
      d.q.scales = read_vector<float>(f, d.name + ".scales", DType::F32, false);
      d.q.zeros = read_vector<int32_t>(f, d.name + ".zeros", DType::I32, true);
      d.q.g_idx = read_vector<int32_t>(f, d.name + ".g_idx", DType::I32, true);
      d.q.absmax_codes = read_vector<uint8_t>(f, d.name + ".absmax_codes", DType::U8, true);
      d.q.nested_absmax = read_vector<float>(f, d.name + ".nested_absmax", DType::F32, true);
      d.q.absmax_offset = l.value("absmax_offset", 0.0f);
      d.q.validate(where + ": " + d.name);
      // JSON has no NaN: a non-finite error (--allow-nonfinite) was written as null.
      d.error = l.at("error").is_null() ? std::numeric_limits<double>::quiet_NaN() : l.at("error").get<double>();
      d.seconds = l.at("seconds").get<double>();
      d.note = l.at("note").get<std::string>();
      d.expert_tokens = l.value("expert_tokens", int64_t{-1});
      if (!l.at("act").is_null()) d.act = act_from(l.at("act"), where);
      s.done.push_back(std::move(d));
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw invalid_input(where, std::string("damaged layer record: ") + e.what());
  }
  L.attn_norm = read_vector<float>(f, "attn_norm", DType::F32, false);
  L.ffn_norm = read_vector<float>(f, "ffn_norm", DType::F32, false);
  if (!L.q_norm.empty()) L.q_norm = read_vector<float>(f, "q_norm", DType::F32, false);
  if (!L.k_norm.empty()) L.k_norm = read_vector<float>(f, "k_norm", DType::F32, false);
  const std::string prefix = "model.layers." + std::to_string(li) + ".";
  for (const rt::LayerLinearId& id : rt::layer_linears(c, li)) {
    std::shared_ptr<rt::Linear>& slot = rt::layer_linear(L, id);
    const std::string name = prefix + id.name;
    const std::optional<Tensor> bias = rt::bias_tensor(read_vector<float>(f, name + ".bias", DType::F32, true));
    const Tensor* b = bias ? &*bias : nullptr;
    const QuantizedLinearResult* q = nullptr;
    for (const auto& d : s.done)
      if (d.name == name) q = &d;
    if (q) {
      slot = rt::make_quantized_linear(q->q, q->act ? &*q->act : nullptr, b, name);
    } else {
      if (!f.find(name + ".weight")) throw invalid_input(where, "tensor '" + name + ".weight' is missing");
      // A copy: the layer outlives this mapping.
      const Tensor t = f.tensor(name + ".weight");
      slot = rt::make_dense_linear(t.to(t.dtype()), b, name);
    }
    if (slot->out_features() <= 0) throw invalid_input(where, name + ": empty Linear");
  }
  for (const rt::RouterLinear& r : rt::router_linears(c, li)) {
    const std::string name = prefix + r.name + ".weight";
    if (!f.find(name)) throw invalid_input(where, "tensor '" + name + "' is missing");
    const Tensor t = f.tensor(name);
    if (t.shape().size() != 2 || t.shape()[0] <= 0 || t.shape()[1] != c.hidden_size)
      throw invalid_input(where, name + ": not a matrix of " + std::to_string(c.hidden_size) + " columns");
    L.moe.*r.member = rt::make_dense_linear(t.to(t.dtype()), nullptr, prefix + r.name);
  }
  return s;
}

ResumeState::~ResumeState() {
  try {
    finish();
  } catch (...) {  // the run is failing already
  }
  if (lock_ && layers_done_ == 0) remove();
}

void ResumeState::remove() {
  try {
    finish();
  } catch (...) {  // the state goes anyway
  }
  std::error_code ec;
  fs::remove_all(dir_, ec);
  unregister_temporary(dir_);
  lock_.reset();
}

}  // namespace qf
