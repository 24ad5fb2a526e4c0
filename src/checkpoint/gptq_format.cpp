#include "checkpoint/gptq_format.h"

#include <cstring>

#include "core/error.h"
#include "core/io.h"
#include "checkpoint/checkpoint_format.h"
#include "checkpoint/checked_tensor.h"
#include "checkpoint/pack.h"

namespace qf {
namespace {

using json = nlohmann::json;

bool gptq_bits(int b) { return b == 2 || b == 3 || b == 4 || b == 8; }


// [rows, cols] -> [cols, rows]
template <typename T>
std::vector<T> transpose(const std::vector<T>& a, int64_t rows, int64_t cols) {
  std::vector<T> t(a.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[static_cast<size_t>(c * rows + r)] = a[static_cast<size_t>(r * cols + c)];
  return t;
}

void check_scheme(const QuantScheme& s, const std::string& where) {
  if (!gptq_bits(s.bits))
    throw unsupported(where, "GPTQ checkpoints store 2, 3, 4 or 8 bits, not " + std::to_string(s.bits));
  if (s.strategy == QuantStrategy::Tensor)
    throw unsupported(where, "GPTQ checkpoints have no per-tensor strategy (use group or channel)");
}

}  // namespace

json gptq_quantize_config(const QuantScheme& s, bool desc_act, const GptqConfigExtras& x) {
  s.validate("GPTQ scheme");
  check_scheme(s, "GPTQ scheme");
  json c = json::object();
  c["bits"] = s.bits;
  c["group_size"] = s.strategy == QuantStrategy::Group ? s.group_size : int64_t{-1};
  c["desc_act"] = desc_act;
  c["sym"] = s.symmetric;
  c["lm_head"] = false;
  c["quant_method"] = "gptq";
  c["checkpoint_format"] = "gptq";
  c["pack_dtype"] = "int32";
  c["damp_percent"] = x.damp_percent;
  c["static_groups"] = x.static_groups;
  c["true_sequential"] = x.true_sequential;
  c["meta"] = {{"quantizer", json::array({x.quantizer})},
               {"damp_percent", x.damp_percent},
               {"static_groups", x.static_groups},
               {"true_sequential", x.true_sequential}};
  return c;
}

QuantScheme gptq_scheme_from_config(const json& cfg, bool* v2) {
  const std::string where = "GPTQ quantize_config";
  if (!cfg.is_object()) throw invalid_input(where, "expected an object");
  auto get = [&](const char* key) -> const json& {
    static const json kNull;
    auto it = cfg.find(key);
    return it == cfg.end() ? kNull : *it;
  };
  const json& qm = get("quant_method");
  if (!qm.is_null() && (!qm.is_string() || qm.get<std::string>() != "gptq"))
    throw unsupported(where, "quant_method " + qm.dump() + " is not \"gptq\"");
  const json* fmt = &get("checkpoint_format");
  if (fmt->is_null()) fmt = &get("format");
  std::string format = "gptq";
  if (!fmt->is_null()) {
    if (!fmt->is_string()) throw invalid_input(where, "checkpoint_format must be a string");
    format = fmt->get<std::string>();
  }
  if (format != "gptq" && format != "gptq_v2")
    throw unsupported(where, "checkpoint_format \"" + format + "\" (supported: gptq, gptq_v2)");
  if (v2) *v2 = format == "gptq_v2";

  QuantScheme s;
  s.scale_dtype = DType::F16;
  const json& bits = get("bits");
  if (!bits.is_number_integer()) throw invalid_input(where, "bits must be an integer, got " + bits.dump());
  s.bits = bits.get<int>();
  if (!gptq_bits(s.bits)) throw unsupported(where, "bits " + std::to_string(s.bits) + " (supported: 2, 3, 4, 8)");
  const json& gs = get("group_size");
  if (!gs.is_number_integer()) throw invalid_input(where, "group_size must be an integer, got " + gs.dump());
  const int64_t g = gs.get<int64_t>();
  if (g == -1) {
    s.strategy = QuantStrategy::Channel;
  } else if (g > 0) {
    s.strategy = QuantStrategy::Group;
    s.group_size = g;
  } else {
    throw invalid_input(where, "group_size must be -1 or positive, got " + std::to_string(g));
  }
  const json& sym = get("sym");
  if (!sym.is_null() && !sym.is_boolean()) throw invalid_input(where, "sym must be a boolean");
  s.symmetric = sym.is_null() ? true : sym.get<bool>();  // AutoGPTQ's default when absent
  return s;
}

void add_gptq_linear(SafetensorsWriter& w, const std::string& prefix, const QuantizedTensor& q) {
  q.validate(prefix);
  const QuantScheme& s = q.scheme;
  check_scheme(s, prefix);
  const int b = s.bits;
  const int64_t N = q.rows, K = q.cols, G = q.n_groups();
  if ((K * b) % 32 != 0 || (N * b) % 32 != 0)
    throw invalid_input(prefix, "GPTQ needs in*bits and out*bits to be multiples of 32; got [" + std::to_string(N) +
                                    ", " + std::to_string(K) + "] at " + std::to_string(b) + " bits");

  // qweight [K*b/32, N]: each output row's codes packed along the input, then transposed.
  const auto rows = pack_int32_rows(q.q.data(), N, K, b);  // [N, K*b/32]
  const auto qweight = transpose(rows, N, K * b / 32);
  w.add(prefix + ".qweight", DType::I32, {K * b / 32, N}, qweight.data(), qweight.size() * 4);

  // qzeros [G, N*b/32] from z - 1 laid out [G, N].
  std::vector<uint8_t> zm(static_cast<size_t>(G * N));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const int32_t z = q.zeros[static_cast<size_t>(q.param_index(n, g))];
      if (s.symmetric && z != s.sym_zero())
        throw invalid_input(prefix, "symmetric scheme with zero point " + std::to_string(z) + " at row " +
                                        std::to_string(n) + " group " + std::to_string(g));
      if (z == 0)
        throw invalid_input(prefix, "zero point 0 at row " + std::to_string(n) + " group " + std::to_string(g) +
                                        " cannot be stored in GPTQ v1 (z - 1 wraps; vLLM would read " +
                                        std::to_string(1 << b) + "); export compressed-tensors or keep zero points >= 1");
      zm[static_cast<size_t>(g * N + n)] = static_cast<uint8_t>(z - 1);
    }
  const auto qzeros = pack_int32_rows(zm.data(), G, N, b);
  w.add(prefix + ".qzeros", DType::I32, {G, N * b / 32}, qzeros.data(), qzeros.size() * 4);

  // scales [G, N] f16, exactly the optimised values.
  std::vector<uint16_t> sc(static_cast<size_t>(G * N));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const float v = q.scales[static_cast<size_t>(q.param_index(n, g))];
      const uint16_t h = f32_to_f16(v);
      if (f16_to_f32(h) != v)
        throw invalid_input(prefix, "scale " + std::to_string(v) + " at row " + std::to_string(n) + " group " +
                                        std::to_string(g) + " is not exactly representable in f16 (GPTQ stores f16 scales)");
      sc[static_cast<size_t>(g * N + n)] = h;
    }
  w.add(prefix + ".scales", DType::F16, {G, N}, sc.data(), sc.size() * 2);

  std::vector<int32_t> g_idx(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) g_idx[static_cast<size_t>(k)] = static_cast<int32_t>(q.group_of(k));
  w.add(prefix + ".g_idx", DType::I32, {K}, g_idx.data(), g_idx.size() * 4);
}

QuantizedTensor read_gptq_linear(const Checkpoint& ck, const std::string& prefix, const json& cfg) {
  bool v2 = false;
  QuantizedTensor q;
  q.scheme = gptq_scheme_from_config(cfg, &v2);
  QuantScheme& s = q.scheme;
  const int b = s.bits;

  const std::string qw_name = prefix + ".qweight";
  const TensorInfo& qwi = ck.info(qw_name);
  if (qwi.dtype != DType::I32 || qwi.shape.size() != 2)
    throw invalid_input(qw_name, std::string("expected I32 [in*bits/32, out], got ") + safetensors_dtype_name(qwi.dtype) +
                                     " " + shape_str(qwi.shape));
  const int64_t KW = qwi.shape[0], N = qwi.shape[1];
  if (KW < 1 || N < 1 || (KW * 32) % b != 0)
    throw invalid_input(qw_name, "shape " + shape_str(qwi.shape) + " is not a whole number of " + std::to_string(b) +
                                     "-bit input rows");
  const int64_t K = KW * 32 / b;
  if ((N * b) % 32 != 0)
    throw invalid_input(qw_name, std::to_string(N) + " output features do not fill whole " + std::to_string(b) + "-bit qzeros words");
  q.rows = N;
  q.cols = K;
  const int64_t G = q.n_groups();

  const auto qweight = copy_elements<int32_t>(ck.tensor(qw_name));
  const auto rows = transpose(qweight, KW, N);  // [N, KW]
  q.q = unpack_int32_rows(rows.data(), N, K, b);

  const Tensor scales = fetch_checked(ck, prefix + ".scales", {DType::F16, DType::BF16, DType::F32}, {G, N});
  s.scale_dtype = scales.dtype();
  const auto sc = scales.to_f32_vector();  // [G, N]

  const std::string qz_name = prefix + ".qzeros";
  const auto qzeros = copy_elements<int32_t>(fetch_checked(ck, qz_name, {DType::I32}, {G, N * b / 32}));
  const auto zf = unpack_int32_rows(qzeros.data(), G, N, b);  // [G, N]

  q.scales.resize(static_cast<size_t>(N * G));
  q.zeros.resize(static_cast<size_t>(N * G));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const size_t src = static_cast<size_t>(g * N + n), dst = static_cast<size_t>(q.param_index(n, g));
      const int32_t z = static_cast<int32_t>(zf[src]) + (v2 ? 0 : 1);
      if (z > s.qmax())
        throw invalid_input(qz_name, "stored zero point field " + std::to_string(zf[src]) + " at group " + std::to_string(g) +
                                         " column " + std::to_string(n) + " decodes as " + std::to_string(z) +
                                         " (v1 wrap of zero point 0), outside the " + std::to_string(b) + "-bit range");
      if (s.symmetric && z != s.sym_zero())
        throw invalid_input(qz_name, "sym is true but the zero point at group " + std::to_string(g) + " column " +
                                         std::to_string(n) + " is " + std::to_string(z) + ", not " + std::to_string(s.sym_zero()));
      q.zeros[dst] = z;
      q.scales[dst] = sc[src];
    }

  const std::string g_name = prefix + ".g_idx";
  if (ck.contains(g_name)) {
    auto g_idx = copy_elements<int32_t>(fetch_checked(ck, g_name, {DType::I32}, {K}));
    bool identity = true;
    for (int64_t k = 0; k < K && identity; ++k) {
      const int64_t def = s.strategy == QuantStrategy::Group ? k / s.group_size : 0;
      identity = g_idx[static_cast<size_t>(k)] == def;
    }
    if (!identity) {
      if (s.strategy != QuantStrategy::Group)
        throw invalid_input(g_name, "a channel-wise (group_size -1) checkpoint must have g_idx all zero");
      q.g_idx = std::move(g_idx);
    }
  }
  q.validate(prefix);
  return q;
}

// ---- the checkpoint format --------------------------------------------------

namespace {

class GptqFormat final : public CheckpointFormat {
 public:
  const char* name() const override { return "gptq"; }

  void check_linear(const LinearCheck& c) const override {
    require_integer_weight_only(c, name());
    const QuantScheme& w = *c.weights;
    if (w.strategy == QuantStrategy::Tensor)
      throw unsupported(c.where, "the GPTQ format has no per-tensor strategy; use group or channel");
    if (!w.symmetric)
      throw unsupported(c.where, "asymmetric GPTQ checkpoints (v1 zero-minus-one convention) cannot hold a zero point "
                                 "of 0; use symmetric: true or export compressed-tensors");
    if (c.scale_dtype_given && w.scale_dtype != DType::F16) throw unsupported(c.where, "the GPTQ format stores f16 scales");
    const int64_t b = w.bits;
    if (b != 2 && b != 3 && b != 4 && b != 8)
      throw unsupported(c.where, "the GPTQ format holds 2, 3, 4 or 8 bits, not " + std::to_string(b));
    if ((c.cols * b) % 32 != 0 || (c.rows * b) % 32 != 0)
      throw unsupported(c.where, c.name + " is [" + std::to_string(c.rows) + ", " + std::to_string(c.cols) +
                                     "]: GPTQ packing needs in*bits and out*bits to be multiples of 32");
  }
  bool one_scheme_per_model() const override { return true; }
  bool every_linear_quantized() const override { return true; }
  bool holds_kv_scales() const override { return false; }

  void add_linear(SafetensorsWriter& w, const std::string& prefix, const QuantizedTensor& q,
                  const ActQuantParams*) const override {
    add_gptq_linear(w, prefix, q);
  }
  void add_kv_scales(SafetensorsWriter&, int64_t, const KvScales&, DType) const override {
    throw Error(ErrorKind::Internal, "the gptq format holds no KV-cache scales");
  }
  void write_config(const ExportConfig& c, nlohmann::ordered_json& config,
                    const std::filesystem::path& folder) const override {
    const ExportGroup& g = c.groups.at(0);
    GptqConfigExtras ex;
    ex.damp_percent = c.dampening_frac;
    ex.static_groups = g.actorder == GptqOptions::ActOrder::Weight || g.actorder == GptqOptions::ActOrder::Static;
    const nlohmann::json qc = gptq_quantize_config(g.weights, g.actorder == GptqOptions::ActOrder::Group, ex);
    write_file_atomic(folder / "quantize_config.json", qc.dump(2) + "\n");
    config["quantization_config"] = qc;
  }

  OpenedConfig open(const std::filesystem::path&, const nlohmann::json& qcfg, const std::string&) const override {
    return {qcfg, false};
  }
  std::optional<ReadLinear> read_linear(const Checkpoint& ck, const std::string& prefix,
                                        const nlohmann::json& qcfg) const override {
    if (!ck.contains(prefix + ".qweight")) return std::nullopt;
    return ReadLinear{read_gptq_linear(ck, prefix, qcfg), std::nullopt, true};
  }
  KvScales read_kv_scales(const Checkpoint&, int64_t) const override {
    throw Error(ErrorKind::Internal, "the gptq format holds no KV-cache scales");
  }
  std::string describe(const nlohmann::json& q) const override {
    const int64_t g = q.value("group_size", int64_t{-1});
    const int64_t bits = q.value("bits", 4);
    // Appended piece by piece: "literal" + std::string&& trips a false -Wrestrict in GCC 12.
    std::string s = "gptq (";
    s += q.value("checkpoint_format", std::string("gptq"));
    s += "): int";
    s += std::to_string(bits);
    s += q.value("sym", true) ? " sym " : " asym ";
    if (g > 0) {
      s += 'g';
      s += std::to_string(g);
    } else {
      s += "channel";
    }
    if (q.value("desc_act", false)) s += ", desc_act";
    return s;
  }
};

}  // namespace

const CheckpointFormat& gptq_checkpoint_format() {
  static const GptqFormat f;
  return f;
}

}  // namespace qf
