#include "checkpoint/awq_format.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "checkpoint/checkpoint_format.h"
#include "checkpoint/checked_tensor.h"

namespace qf {
namespace {

using json = nlohmann::json;

void check_scheme(const QuantScheme& s, const std::string& where) {
  if (s.is_float()) throw unsupported(where, "AWQ GEMM holds integer weights, not " + s.describe());
  if (s.bits != 4) throw unsupported(where, "AWQ GEMM holds 4-bit weights, not " + std::to_string(s.bits) + "-bit");
  if (s.strategy != QuantStrategy::Group) throw unsupported(where, "AWQ GEMM needs the group strategy, got " + s.describe());
}

// [rows = K or groups][N] values (value(r, n)) packed into [rows, N/8] words.
template <typename F>
std::vector<int32_t> pack_awq(int64_t rows, int64_t n_out, F value) {
  std::vector<int32_t> words(static_cast<size_t>(rows * (n_out / 8)));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n_out / 8; ++c) {
      uint32_t w = 0;
      for (int i = 0; i < 8; ++i) w |= static_cast<uint32_t>(value(r, 8 * c + kAwqOrder[i]) & 0xf) << (4 * i);
      words[static_cast<size_t>(r * (n_out / 8) + c)] = static_cast<int32_t>(w);
    }
  return words;
}

// Inverse of pack_awq: out(r, n, value).
template <typename F>
void unpack_awq(const std::vector<int32_t>& words, int64_t rows, int64_t n_out, F out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n_out / 8; ++c) {
      const uint32_t w = static_cast<uint32_t>(words[static_cast<size_t>(r * (n_out / 8) + c)]);
      for (int i = 0; i < 8; ++i) out(r, 8 * c + kAwqOrder[i], static_cast<uint8_t>((w >> (4 * i)) & 0xf));
    }
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

const json* find_any(const json& j, std::initializer_list<const char*> keys) {
  for (const char* k : keys) {
    auto it = j.find(k);
    if (it != j.end() && !it->is_null()) return &*it;
  }
  return nullptr;
}

bool zero_point_of(const json& qcfg) {
  const json* zp = find_any(qcfg, {"zero_point"});
  if (!zp) return true;  // AutoAWQ's default
  if (!zp->is_boolean()) throw invalid_input("awq quantization_config", "zero_point must be a boolean, got " + zp->dump());
  return zp->get<bool>();
}

}  // namespace

void add_awq_linear(SafetensorsWriter& w, const std::string& prefix, const QuantizedTensor& q) {
  q.validate(prefix);
  const QuantScheme& s = q.scheme;
  check_scheme(s, prefix);
  if (!q.g_idx.empty()) throw unsupported(prefix, "AWQ GEMM has no g_idx (act-order)");
  const int64_t N = q.rows, K = q.cols, G = q.n_groups(), g = s.group_size;
  if (N % 8 != 0) throw unsupported(prefix, "AWQ GEMM packs 8 outputs per word; " + std::to_string(N) + " outputs");
  if (K % g != 0) throw unsupported(prefix, "group size " + std::to_string(g) + " does not divide " + std::to_string(K) + " inputs");

  const auto qweight = pack_awq(K, N, [&](int64_t k, int64_t n) { return q.q[static_cast<size_t>(n * K + k)]; });
  w.add(prefix + ".qweight", DType::I32, {K, N / 8}, qweight.data(), qweight.size() * 4);
  const auto qzeros = pack_awq(G, N, [&](int64_t gi, int64_t n) { return q.zeros[static_cast<size_t>(n * G + gi)]; });
  w.add(prefix + ".qzeros", DType::I32, {G, N / 8}, qzeros.data(), qzeros.size() * 4);
  std::vector<uint16_t> scales(static_cast<size_t>(G * N));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t gi = 0; gi < G; ++gi) {
      const float v = q.scales[static_cast<size_t>(n * G + gi)];
      const uint16_t h = f32_to_f16(v);
      if (f16_to_f32(h) != v) throw invalid_input(prefix, "scale " + std::to_string(v) + " is not exactly representable in f16");
      scales[static_cast<size_t>(gi * N + n)] = h;
    }
  w.add(prefix + ".scales", DType::F16, {G, N}, scales.data(), scales.size() * 2);
}

json awq_quantization_config(const QuantScheme& s, const std::vector<std::string>& modules_to_not_convert) {
  s.validate("awq scheme");
  check_scheme(s, "awq scheme");
  json c = json::object();
  c["quant_method"] = "awq";
  c["zero_point"] = !s.symmetric;
  c["group_size"] = s.group_size;
  c["bits"] = 4;
  c["version"] = "gemm";
  c["modules_to_not_convert"] = modules_to_not_convert;
  return c;
}

QuantScheme awq_scheme_from_config(const json& qcfg) {
  const std::string where = "awq quantization_config";
  if (!qcfg.is_object()) throw invalid_input(where, "expected an object, got " + qcfg.dump());
  if (const json* m = find_any(qcfg, {"quant_method"})) {
    if (!m->is_string() || lower(m->get<std::string>()) != "awq") throw unsupported(where, "quant_method " + m->dump() + " is not awq");
  }
  if (const json* v = find_any(qcfg, {"version"})) {
    if (!v->is_string() || lower(v->get<std::string>()) != "gemm")
      throw unsupported(where, "AWQ version " + v->dump() + " (supported: gemm)");
  }
  const json* b = find_any(qcfg, {"bits", "w_bit"});
  if (b && !b->is_number_integer()) throw invalid_input(where, "bits must be an integer, got " + b->dump());
  const int bits = b ? b->get<int>() : 4;
  if (bits != 4) throw unsupported(where, "AWQ GEMM holds 4-bit weights, not " + std::to_string(bits) + "-bit");
  const json* gs = find_any(qcfg, {"group_size", "q_group_size"});
  if (!gs || !gs->is_number_integer()) throw invalid_input(where, "group_size must be an integer");
  const int64_t g = gs->get<int64_t>();
  if (g < 1) throw unsupported(where, "group_size " + std::to_string(g) + " (AWQ GEMM needs groups)");
  return QuantScheme::make(4, !zero_point_of(qcfg), QuantStrategy::Group, g, DType::F16);
}

QuantizedTensor read_awq_linear(const Checkpoint& ck, const std::string& prefix, const json& qcfg) {
  QuantizedTensor q;
  q.scheme = awq_scheme_from_config(qcfg);
  const int64_t g = q.scheme.group_size;
  const std::string qw = prefix + ".qweight";
  const TensorInfo& info = ck.info(qw);
  if (info.shape.size() != 2 || info.shape[0] < 1 || info.shape[1] < 1)
    throw invalid_input(qw, "shape is " + shape_str(info.shape) + ", expected [in, out/8]");
  const int64_t K = info.shape[0], N = info.shape[1] * 8;
  if (K % g != 0)
    throw invalid_input(qw, "group_size " + std::to_string(g) + " does not divide the " + std::to_string(K) + " inputs");
  const int64_t G = K / g;
  q.rows = N;
  q.cols = K;
  q.q.resize(static_cast<size_t>(N * K));
  const auto words = copy_elements<int32_t>(fetch_checked(ck, qw, {DType::I32}, {K, N / 8}));
  unpack_awq(words, K, N, [&](int64_t k, int64_t n, uint8_t v) { q.q[static_cast<size_t>(n * K + k)] = v; });
  const auto zw = copy_elements<int32_t>(fetch_checked(ck, prefix + ".qzeros", {DType::I32}, {G, N / 8}));
  q.zeros.resize(static_cast<size_t>(N * G));
  unpack_awq(zw, G, N, [&](int64_t gi, int64_t n, uint8_t v) { q.zeros[static_cast<size_t>(n * G + gi)] = v; });
  if (q.scheme.symmetric)
    for (int32_t z : q.zeros)
      if (z != q.scheme.sym_zero())
        throw invalid_input(prefix + ".qzeros", "zero_point is false but a zero is " + std::to_string(z) + ", not 8");
  const Tensor sc = fetch_checked(ck, prefix + ".scales", {DType::F16, DType::BF16, DType::F32}, {G, N});
  q.scheme.scale_dtype = sc.dtype();
  const auto s = sc.to_f32_vector();
  q.scales.resize(s.size());
  for (int64_t gi = 0; gi < G; ++gi)
    for (int64_t n = 0; n < N; ++n) q.scales[static_cast<size_t>(n * G + gi)] = s[static_cast<size_t>(gi * N + n)];
  q.validate(prefix);
  return q;
}

// ---- the checkpoint format --------------------------------------------------

namespace {

class AwqFormat final : public CheckpointFormat {
 public:
  const char* name() const override { return "awq"; }

  void check_linear(const LinearCheck& c) const override {
    require_integer_weight_only(c, name());
    const QuantScheme& w = *c.weights;
    if (w.bits != 4 || w.strategy != QuantStrategy::Group)
      throw unsupported(c.where, "the AutoAWQ GEMM format holds 4-bit group quantization, not " + w.describe());
    if (c.scale_dtype_given && w.scale_dtype != DType::F16) throw unsupported(c.where, "the AWQ format stores f16 scales");
    if (c.rows % 8 != 0)
      throw unsupported(c.where, c.name + " has " + std::to_string(c.rows) + " output rows: AWQ packs 8 per int32");
    if (c.actorder == GptqOptions::ActOrder::Group)
      throw unsupported(c.where, "the AWQ format has no g_idx (act-order 'group')");
  }
  bool one_scheme_per_model() const override { return true; }
  bool every_linear_quantized() const override { return true; }
  bool holds_kv_scales() const override { return false; }

  void add_linear(SafetensorsWriter& w, const std::string& prefix, const QuantizedTensor& q,
                  const ActQuantParams*) const override {
    add_awq_linear(w, prefix, q);
  }
  void add_kv_scales(SafetensorsWriter&, int64_t, const KvScales&, DType) const override {
    throw Error(ErrorKind::Internal, "the awq format holds no KV-cache scales");
  }
  void write_config(const ExportConfig& c, nlohmann::ordered_json& config, const std::filesystem::path&) const override {
    config["quantization_config"] = awq_quantization_config(c.groups.at(0).weights, c.ignore);
  }

  OpenedConfig open(const std::filesystem::path&, const nlohmann::json& qcfg,
                    const std::string& config_file) const override {
    try {
      awq_scheme_from_config(qcfg);  // Unsupported for other versions / bits
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::Unsupported) throw;
      throw unsupported(config_file, e.what());
    }
    return {qcfg, false};
  }
  std::optional<ReadLinear> read_linear(const Checkpoint& ck, const std::string& prefix,
                                        const nlohmann::json& qcfg) const override {
    if (!ck.contains(prefix + ".qweight")) return std::nullopt;
    return ReadLinear{read_awq_linear(ck, prefix, qcfg), std::nullopt, false};
  }
  KvScales read_kv_scales(const Checkpoint&, int64_t) const override {
    throw Error(ErrorKind::Internal, "the awq format holds no KV-cache scales");
  }
  std::string describe(const nlohmann::json& q) const override {
    return "awq (" + q.value("version", std::string("?")) + "): " + awq_scheme_from_config(q).describe();
  }
};

}  // namespace

const CheckpointFormat& awq_checkpoint_format() {
  static const AwqFormat f;
  return f;
}

}  // namespace qf
