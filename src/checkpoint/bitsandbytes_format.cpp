// bitsandbytes 4-bit (NF4, FP4) checkpoints as transformers saves a model
// loaded with BitsAndBytesConfig(load_in_4bit=True) (Params4bit plus its
// QuantState.as_dict(packed=True)), which transformers and vLLM load back.
// Per quantized Linear P (docs/formats.md, "bitsandbytes"):
//   P.weight                                  U8  [ceil(n/2), 1]  codes, element 2i high nibble
//   P.weight.absmax                           F32 [blocks]  (U8 codes with double quantization)
//   P.weight.quant_map                        F32 [16]
//   P.weight.nested_absmax                    F32 [ceil(blocks/256)]   double quantization only
//   P.weight.nested_quant_map                 F32 [256]                double quantization only
//   P.weight.quant_state.bitsandbytes__nf4    U8  [len]  json.dumps of quant_type, blocksize,
//                                                        dtype, shape (+ nested_blocksize,
//                                                        nested_dtype, nested_offset)
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "checkpoint/bitsandbytes_format.h"
#include "checkpoint/checked_tensor.h"
#include "checkpoint/checkpoint_format.h"
#include "core/error.h"
#include "quantizers/bnb4.h"

namespace qf {
namespace {

using json = nlohmann::json;

// torch's dtype names as str(dtype).strip("torch.") gives them.
const char* torch_dtype_name(DType d) {
  switch (d) {
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::F32: return "float32";
    default: throw unsupported("bitsandbytes", std::string("dtype ") + dtype_name(d) + " (float16, bfloat16, float32)");
  }
}

DType dtype_from_torch(const std::string& s, const std::string& where) {
  if (s == "float16") return DType::F16;
  if (s == "bfloat16") return DType::BF16;
  if (s == "float32") return DType::F32;
  throw unsupported(where, "dtype '" + s + "' (float16, bfloat16, float32)");
}

}  // namespace

// Python's repr of a float (the double of an f32 here): the shortest digits
// that read back, fixed notation for decimal exponents -4..15, else
// d.ddde-XX; "1.0" for integral values.
std::string python_float_repr(double v) {
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string s(buf, r.ptr);
  const size_t e = s.find('e');
  const int exp10 = std::stoi(s.substr(e + 1));
  std::string mant = s.substr(0, e);
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp10 >= -4 && exp10 < 16) {
    if (exp10 < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp10 + 1) {
      out = digits + std::string(static_cast<size_t>(exp10 + 1 - static_cast<int>(digits.size())), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exp10 + 1)) + "." + digits.substr(static_cast<size_t>(exp10 + 1));
    }
  } else {
    out = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "");
    const int a = exp10 < 0 ? -exp10 : exp10;
    out += std::string("e") + (exp10 < 0 ? "-" : "+") + (a < 10 ? "0" : "") + std::to_string(a);
  }
  return neg ? "-" + out : out;
}

// pack_dict_to_tensor's bytes: json.dumps of the non-tensor items in
// as_dict's order, with Python's default separators.
std::string bnb_quant_state_json(const QuantizedTensor& q) {
  const QuantScheme& s = q.scheme;
  std::string j = std::string("{\"quant_type\": \"") + quant_type_name(s.type) + "\", \"blocksize\": " +
                  std::to_string(s.group_size) + ", \"dtype\": \"" + torch_dtype_name(s.scale_dtype) + "\", \"shape\": [" +
                  std::to_string(q.rows) + ", " + std::to_string(q.cols) + "]";
  if (s.double_quant)
    j += ", \"nested_blocksize\": " + std::to_string(kBnbNestedBlock) + ", \"nested_dtype\": \"float32\", \"nested_offset\": " +
         python_float_repr(static_cast<double>(q.absmax_offset));
  return j + "}";
}

void add_bnb4_linear(SafetensorsWriter& w, const std::string& prefix, const QuantizedTensor& q) {
  q.validate(prefix);
  const QuantScheme& s = q.scheme;
  if (!s.is_bnb4()) throw unsupported(prefix, "the bitsandbytes format holds NF4 or FP4 weights, not " + s.describe());
  const std::string p = prefix + ".weight";
  const std::vector<uint8_t> packed = pack_bnb4(q.q, s.type);
  w.add(p, DType::U8, {static_cast<int64_t>(packed.size()), 1}, packed.data(), packed.size());
  const int64_t nb = static_cast<int64_t>(q.scales.size());
  if (s.double_quant) {
    w.add(p + ".absmax", DType::U8, {nb}, q.absmax_codes.data(), q.absmax_codes.size());
  } else {
    w.add(p + ".absmax", DType::F32, {nb}, q.scales.data(), q.scales.size() * 4);
  }
  const std::array<float, 16> qm = bnb4_quant_map(s.type);
  w.add(p + ".quant_map", DType::F32, {16}, qm.data(), sizeof qm);
  if (s.double_quant) {
    w.add(p + ".nested_absmax", DType::F32, {static_cast<int64_t>(q.nested_absmax.size())}, q.nested_absmax.data(),
          q.nested_absmax.size() * 4);
    const std::array<float, 256>& nm = bnb_dynamic_map();
    w.add(p + ".nested_quant_map", DType::F32, {256}, nm.data(), sizeof nm);
  }
  const std::string js = bnb_quant_state_json(q);
  w.add(p + ".quant_state.bitsandbytes__" + quant_type_name(s.type), DType::U8, {static_cast<int64_t>(js.size())},
        js.data(), js.size());
}

// The Linear `prefix` of a bitsandbytes checkpoint; nullopt when its weight
// has no quant_state (stored unquantized, like lm_head).
std::optional<QuantizedTensor> read_bnb4_linear(const Checkpoint& ck, const std::string& prefix) {
  const std::string p = prefix + ".weight";
  std::string qs_name;
  for (const char* t : {"nf4", "fp4"})
    if (ck.contains(p + ".quant_state.bitsandbytes__" + t)) {
      if (!qs_name.empty()) throw invalid_input(p, "has both an nf4 and an fp4 quant_state");
      qs_name = p + ".quant_state.bitsandbytes__" + t;
    }
  if (qs_name.empty()) return std::nullopt;
  const TensorInfo& qi = ck.info(qs_name);
  if (qi.shape.size() != 1) throw invalid_input(qs_name, "expected a 1-D uint8 tensor of JSON bytes");
  const auto bytes = copy_elements<uint8_t>(fetch_checked(ck, qs_name, {DType::U8}, qi.shape));
  const json st = json::parse(std::string(bytes.begin(), bytes.end()), nullptr, false);
  if (!st.is_object()) throw invalid_input(qs_name, "is not a JSON object");
  const std::string type = qs_name.substr(qs_name.size() - 3);
  if (st.value("quant_type", json()) != type)
    throw invalid_input(qs_name, "quant_type is " + st.value("quant_type", json()).dump() + ", the key says " + type);
  if (!st.contains("blocksize") || !st["blocksize"].is_number_integer()) throw invalid_input(qs_name, "no integer blocksize");
  if (st["blocksize"].get<int64_t>() != kBnbBlock)
    throw unsupported(qs_name, "blocksize " + st["blocksize"].dump() + " (the runtime reads bitsandbytes' default, 64)");
  if (!st.contains("dtype") || !st["dtype"].is_string()) throw invalid_input(qs_name, "no dtype string");
  const json& sh = st.value("shape", json());
  if (!sh.is_array() || sh.size() != 2 || !sh[0].is_number_integer() || !sh[1].is_number_integer() || sh[0].get<int64_t>() < 1 ||
      sh[1].get<int64_t>() < 1)
    throw invalid_input(qs_name, "shape is " + sh.dump() + ", expected [out, in]");
  const bool nested = st.contains("nested_offset") || ck.contains(p + ".nested_absmax");
  QuantizedTensor q;
  q.scheme = QuantScheme::bnb4(type == "fp4" ? QuantType::Fp4 : QuantType::Nf4, false,
                               dtype_from_torch(st["dtype"].get<std::string>(), qs_name));
  q.rows = sh[0].get<int64_t>();
  q.cols = sh[1].get<int64_t>();
  const int64_t n = q.rows * q.cols, nb = (n + kBnbBlock - 1) / kBnbBlock;
  const auto packed = copy_elements<uint8_t>(fetch_checked(ck, p, {DType::U8}, {(n + 1) / 2, 1}));
  q.q = unpack_bnb4(packed.data(), packed.size(), n);
  const std::string qm_name = p + ".quant_map";
  const auto qm = copy_elements<float>(fetch_checked(ck, qm_name, {DType::F32}, {16}));
  const std::array<float, 16> want = bnb4_quant_map(q.scheme.type);
  // By value: +0.0 and -0.0 for FP4's code 8 are the same table.
  if (!std::equal(want.begin(), want.end(), qm.begin()))
    throw unsupported(qm_name, "is not bitsandbytes' " + type + " table (its kernels decode with their own table)");
  if (!nested) {
    q.scales = copy_elements<float>(fetch_checked(ck, p + ".absmax", {DType::F32}, {nb}));
  } else {
    if (st.value("nested_blocksize", json()) != kBnbNestedBlock)
      throw unsupported(qs_name, "nested_blocksize " + st.value("nested_blocksize", json()).dump() + " (256)");
    if (st.value("nested_dtype", json()) != "float32")
      throw unsupported(qs_name, "nested_dtype " + st.value("nested_dtype", json()).dump() + " (float32)");
    if (!st.contains("nested_offset") || !st["nested_offset"].is_number()) throw invalid_input(qs_name, "no nested_offset number");
    const float offset = static_cast<float>(st["nested_offset"].get<double>());
    const auto codes = copy_elements<uint8_t>(fetch_checked(ck, p + ".absmax", {DType::U8}, {nb}));
    const auto nested_abs = copy_elements<float>(
        fetch_checked(ck, p + ".nested_absmax", {DType::F32}, {(nb + kBnbNestedBlock - 1) / kBnbNestedBlock}));
    const auto map = copy_elements<float>(fetch_checked(ck, p + ".nested_quant_map", {DType::F32}, {256}));
    if (std::memcmp(map.data(), bnb_dynamic_map().data(), 256 * sizeof(float)) == 0) {
      q.scheme.double_quant = true;  // our map: keep the stored form
      q.absmax_codes = codes;
      q.nested_absmax = nested_abs;
      q.absmax_offset = offset;
      q.scales = bnb_decode_absmax(codes, nested_abs, offset);
    } else {  // another map (bitsandbytes reads the stored one): decode with it
      q.scales.resize(codes.size());
      for (size_t i = 0; i < codes.size(); ++i) {
        const float v = map[codes[i]] * nested_abs[i / static_cast<size_t>(kBnbNestedBlock)];
        q.scales[i] = v + offset;
      }
    }
  }
  q.validate(prefix);
  return q;
}

json bnb_quantization_config(const QuantScheme& s, const std::vector<std::string>& skip, const std::string& compute_dtype) {
  // BitsAndBytesConfig.to_dict() as PretrainedConfig writes it (sorted keys).
  json c = json::object();
  c["_load_in_4bit"] = true;
  c["_load_in_8bit"] = false;
  c["bnb_4bit_compute_dtype"] = compute_dtype;
  c["bnb_4bit_quant_storage"] = "uint8";
  c["bnb_4bit_quant_type"] = quant_type_name(s.type);
  c["bnb_4bit_use_double_quant"] = s.double_quant;
  c["llm_int8_enable_fp32_cpu_offload"] = false;
  c["llm_int8_has_fp16_weight"] = false;
  c["llm_int8_skip_modules"] = skip;
  c["llm_int8_threshold"] = 6.0;
  c["load_in_4bit"] = true;
  c["load_in_8bit"] = false;
  c["quant_method"] = "bitsandbytes";
  return c;
}

namespace {

class BitsandbytesFormat final : public CheckpointFormat {
 public:
  const char* name() const override { return "bitsandbytes"; }

  void check_linear(const LinearCheck& c) const override {
    if (!c.weights->is_bnb4())
      throw unsupported(c.where, "the bitsandbytes format holds the NF4 and FP4 schemes (scheme: NF4 or FP4), not " +
                                     c.weights->describe());
    if (c.act) throw unsupported(c.where, "bitsandbytes 4-bit checkpoints are weight-only; got " + c.act->describe() + " inputs");
  }
  bool one_scheme_per_model() const override { return true; }
  bool every_linear_quantized() const override { return false; }
  bool holds_kv_scales() const override { return false; }

  void add_linear(SafetensorsWriter& w, const std::string& prefix, const QuantizedTensor& q,
                  const ActQuantParams* act) const override {
    if (act) throw unsupported(prefix, "bitsandbytes 4-bit checkpoints are weight-only");
    add_bnb4_linear(w, prefix, q);
  }
  void add_kv_scales(SafetensorsWriter&, int64_t, const KvScales&, DType) const override {
    throw unsupported("bitsandbytes", "the format has no KV-cache scales");
  }
  void write_config(const ExportConfig& c, nlohmann::ordered_json& config, const std::filesystem::path&) const override {
    const QuantScheme& s = c.groups.at(0).weights;
    const std::string cd = c.compute_dtype.empty() ? "float32" : c.compute_dtype;
    config["quantization_config"] = bnb_quantization_config(s, c.ignore, cd);
  }

  OpenedConfig open(const std::filesystem::path&, const nlohmann::json& qcfg, const std::string& config_file) const override {
    if (qcfg.value("load_in_8bit", false) || qcfg.value("_load_in_8bit", false))
      throw unsupported(config_file, "bitsandbytes LLM.int8 (load_in_8bit) checkpoints are not supported by the runtime (4-bit NF4/FP4 are)");
    if (!(qcfg.value("load_in_4bit", false) || qcfg.value("_load_in_4bit", false)))
      throw unsupported(config_file, "bitsandbytes quantization_config without load_in_4bit is not supported by the runtime");
    const std::string t = qcfg.value("bnb_4bit_quant_type", std::string("fp4"));
    if (t != "nf4" && t != "fp4") throw unsupported(config_file, "bnb_4bit_quant_type '" + t + "' (nf4, fp4)");
    const std::string st = qcfg.value("bnb_4bit_quant_storage", std::string("uint8"));
    if (st != "uint8") throw unsupported(config_file, "bnb_4bit_quant_storage '" + st + "' (the runtime reads uint8)");
    return OpenedConfig{qcfg, false};
  }
  std::optional<ReadLinear> read_linear(const Checkpoint& ck, const std::string& prefix, const nlohmann::json&) const override {
    std::optional<QuantizedTensor> q = read_bnb4_linear(ck, prefix);
    if (!q) return std::nullopt;
    return ReadLinear{std::move(*q), std::nullopt, false};
  }
  KvScales read_kv_scales(const Checkpoint&, int64_t) const override {
    throw unsupported("bitsandbytes", "the format has no KV-cache scales");
  }
  std::string describe(const nlohmann::json& q) const override {
    return "bitsandbytes: " + q.value("bnb_4bit_quant_type", std::string("fp4")) +
           (q.value("bnb_4bit_use_double_quant", false) ? ", double quant" : "") + ", compute " +
           q.value("bnb_4bit_compute_dtype", std::string("float32"));
  }
};

}  // namespace

const CheckpointFormat& bitsandbytes_checkpoint_format() {
  static const BitsandbytesFormat f;
  return f;
}

}  // namespace qf
