#include "checkpoint/compressed_tensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "checkpoint/checkpoint_format.h"
#include "recipe/recipe.h"
#include "checkpoint/checked_tensor.h"
#include "checkpoint/pack.h"
#include "quantizers/quant_args.h"

namespace qf {
namespace {

using json = nlohmann::json;

std::vector<uint8_t> scales_as(const std::vector<float>& s, DType dt) {
  std::vector<uint8_t> out(s.size() * dtype_size(dt));
  if (!s.empty()) convert(s.data(), DType::F32, out.data(), dt, s.size());
  return out;
}


const json& field(const json& j, const char* key) {
  static const json kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

// Scale (and zero point) shape of a weight: [1], [out, 1] or [out, groups].
Shape param_shape(const QuantizedTensor& q) {
  switch (q.scheme.strategy) {
    case QuantStrategy::Tensor: return {1};
    case QuantStrategy::Channel: return {q.rows, 1};
    case QuantStrategy::Group:
    case QuantStrategy::TensorGroup: return {q.rows, q.n_groups()};
    case QuantStrategy::Token: break;
  }
  throw invalid_input("compressed-tensors", "the token strategy has no weight parameters");
}

void add_scalar(SafetensorsWriter& w, const std::string& name, float v, DType dt) {
  const auto b = scales_as({v}, dt);
  w.add(name, dt, {1}, b.data(), b.size());
}

// One value of a [1] (or scalar) float tensor.
float read_scalar(const Checkpoint& ck, const std::string& name, std::initializer_list<DType> dtypes) {
  const TensorInfo& info = ck.info(name);
  const Shape shape = info.shape.empty() ? Shape{} : Shape{1};
  return fetch_checked(ck, name, dtypes, shape).to_f32_vector().at(0);
}

void pack_quantized_tensors(SafetensorsWriter& w, const std::string& prefix, const QuantizedTensor& q);

bool is_naive_layout(const std::string& f) {
  return f == "int-quantized" || f == "float-quantized" || f == "naive-quantized";
}

}  // namespace

std::string compressed_tensors_format_of(const QuantScheme& w, const ActivationScheme* act) {
  w.validate("compressed-tensors scheme");
  if (act) act->validate("compressed-tensors input activations");
  if (w.is_nvfp4()) return "nvfp4-pack-quantized";
  if (w.type == QuantType::Int) return act ? "int-quantized" : "pack-quantized";
  return act ? "float-quantized" : "naive-quantized";
}

void add_compressed_tensors_linear(SafetensorsWriter& w, const std::string& prefix, const QuantizedTensor& q,
                                   const ActQuantParams* act) {
  q.validate(prefix);
  if (act) act->scheme.validate(prefix + " input activations");
  const std::string fmt = compressed_tensors_format_of(q.scheme, act ? &act->scheme : nullptr);
  const QuantScheme& s = q.scheme;
  if (act && (act->scheme.is_nvfp4() != s.is_nvfp4()))
    throw unsupported(prefix, "NVFP4 activations go with NVFP4 weights only (weights " + s.describe() +
                                  ", activations " + act->scheme.describe() + ")");
  if (!q.g_idx.empty() && s.strategy != QuantStrategy::Group)
    throw invalid_input(prefix, "g_idx (actorder group) requires the group strategy");

  if (fmt == "pack-quantized") {
    pack_quantized_tensors(w, prefix, q);
  } else if (fmt == "nvfp4-pack-quantized") {
    const int64_t out = q.rows, in = q.cols;
    const std::vector<uint8_t> packed = pack_nvfp4_rows(q);
    w.add(prefix + ".weight_packed", DType::U8, {out, in / 2}, packed.data(), packed.size());
    const std::vector<uint8_t> sc = nvfp4_scales_e4m3(q);
    w.add(prefix + ".weight_scale", DType::F8_E4M3, {out, q.n_groups()}, sc.data(), sc.size());
    add_scalar(w, prefix + ".weight_global_scale", q.global_scale, DType::F32);
  } else {
    // int-quantized / float-quantized / naive-quantized: the weight unpacked.
    const int64_t out = q.rows, in = q.cols;
    if (s.is_fp8()) {
      w.add(prefix + ".weight", DType::F8_E4M3, {out, in}, q.q.data(), q.q.size());
    } else {
      std::vector<int8_t> sq8(q.q.size());
      for (size_t i = 0; i < sq8.size(); ++i) sq8[i] = static_cast<int8_t>(q.q[i] - s.sym_zero());
      w.add(prefix + ".weight", DType::I8, {out, in}, sq8.data(), sq8.size());
    }
    const Shape ps = param_shape(q);
    const auto sb = scales_as(q.scales, s.scale_dtype);
    w.add(prefix + ".weight_scale", s.scale_dtype, ps, sb.data(), sb.size());
    if (!s.symmetric) {
      std::vector<int8_t> z(q.zeros.size());
      for (size_t i = 0; i < z.size(); ++i) z[i] = static_cast<int8_t>(q.zeros[i] - s.sym_zero());
      w.add(prefix + ".weight_zero_point", DType::I8, ps, z.data(), z.size());
    }
    if (!q.g_idx.empty()) w.add(prefix + ".weight_g_idx", DType::I32, {in}, q.g_idx.data(), q.g_idx.size() * 4);
  }

  if (act) {
    const ActivationScheme& a = act->scheme;
    if (a.is_nvfp4()) {
      if (!(std::isfinite(act->global_scale) && act->global_scale > 0))
        throw invalid_input(prefix, "NVFP4 input global scale must be positive and finite");
      add_scalar(w, prefix + ".input_global_scale", act->global_scale, DType::F32);
    } else if (!a.dynamic) {
      if (!(std::isfinite(act->scale) && act->scale > 0))
        throw invalid_input(prefix, "static input scale must be positive and finite");
      add_scalar(w, prefix + ".input_scale", act->scale, s.scale_dtype);
      if (!a.symmetric) {
        if (act->zero_point < -128 || act->zero_point > 127)
          throw invalid_input(prefix, "input zero point " + std::to_string(act->zero_point) + " is outside int8");
        const int8_t zp = static_cast<int8_t>(act->zero_point);
        w.add(prefix + ".input_zero_point", DType::I8, {1}, &zp, 1);
      }
    }
  }
}

uint64_t compressed_tensors_linear_bytes(const QuantScheme& s, const ActivationScheme* act, int64_t rows, int64_t cols,
                                         bool g_idx) {
  const std::string fmt = compressed_tensors_format_of(s, act);
  const uint64_t out = static_cast<uint64_t>(rows), in = static_cast<uint64_t>(cols);
  const uint64_t groups = s.grouped() ? (in + static_cast<uint64_t>(s.group_size) - 1) / static_cast<uint64_t>(s.group_size) : 1;
  const uint64_t params = s.strategy == QuantStrategy::Tensor ? 1 : s.strategy == QuantStrategy::Channel ? out : out * groups;
  const uint64_t scale = dtype_size(s.scale_dtype);
  uint64_t b = 0;
  if (fmt == "pack-quantized") {
    b += out * static_cast<uint64_t>(packed_words(cols, s.bits)) * 4 + params * scale;
    if (!s.symmetric)
      b += s.strategy == QuantStrategy::Tensor ? 1 : static_cast<uint64_t>(packed_words(rows, s.bits)) * groups * 4;
    b += 16;  // weight_shape
  } else if (fmt == "nvfp4-pack-quantized") {
    b += out * (in / 2) + out * groups + 4;
  } else {
    b += out * in + params * scale;
    if (!s.symmetric && !s.is_float()) b += params;
  }
  if (g_idx) b += in * 4;
  if (act) {
    if (act->is_nvfp4()) b += 4;
    else if (!act->dynamic) b += scale + (act->symmetric ? 0 : 1);
  }
  return b;
}

void add_compressed_tensors_kv_scales(SafetensorsWriter& w, const std::string& attn_prefix, const KvScales& kv, DType dtype) {
  if (dtype != DType::F16 && dtype != DType::BF16 && dtype != DType::F32)
    throw invalid_input(attn_prefix, "KV-cache scales are stored as f16, bf16 or f32");
  for (float v : {kv.k_scale, kv.v_scale})
    if (!(std::isfinite(v) && v > 0)) throw invalid_input(attn_prefix, "KV-cache scales must be positive and finite");
  add_scalar(w, attn_prefix + ".k_scale", kv.k_scale, dtype);
  add_scalar(w, attn_prefix + ".v_scale", kv.v_scale, dtype);
}

KvScales read_compressed_tensors_kv_scales(const Checkpoint& ck, const std::string& attn_prefix) {
  KvScales kv;
  kv.k_scale = read_scalar(ck, attn_prefix + ".k_scale", {DType::F16, DType::BF16, DType::F32});
  kv.v_scale = read_scalar(ck, attn_prefix + ".v_scale", {DType::F16, DType::BF16, DType::F32});
  for (const auto& [v, n] : {std::pair{kv.k_scale, ".k_scale"}, std::pair{kv.v_scale, ".v_scale"}})
    if (!(std::isfinite(v) && v > 0)) throw invalid_input(attn_prefix + n, "KV-cache scale must be positive and finite");
  return kv;
}

namespace {

void pack_quantized_tensors(SafetensorsWriter& w, const std::string& prefix, const QuantizedTensor& q) {
  const QuantScheme& s = q.scheme;
  const int64_t out = q.rows, in = q.cols, G = q.n_groups();

  const auto packed = pack_int32_rows(q.q.data(), out, in, s.bits);
  w.add(prefix + ".weight_packed", DType::I32, {out, packed_words(in, s.bits)}, packed.data(), packed.size() * 4);

  const auto sb = scales_as(q.scales, s.scale_dtype);
  w.add(prefix + ".weight_scale", s.scale_dtype, param_shape(q), sb.data(), sb.size());

  if (!s.symmetric) {
    if (s.strategy == QuantStrategy::Tensor) {
      const int8_t zp = static_cast<int8_t>(q.zeros[0] - s.sym_zero());
      w.add(prefix + ".weight_zero_point", DType::I8, {1}, &zp, 1);
    } else {
      std::vector<uint8_t> z(q.zeros.size());  // [out, G]
      for (size_t i = 0; i < z.size(); ++i) z[i] = static_cast<uint8_t>(q.zeros[i]);
      const auto zp = pack_int32_cols(z.data(), out, G, s.bits);
      w.add(prefix + ".weight_zero_point", DType::I32, {packed_words(out, s.bits), G}, zp.data(), zp.size() * 4);
    }
  }

  const int64_t shape[2] = {out, in};
  w.add(prefix + ".weight_shape", DType::I64, {2}, shape, sizeof shape);

  if (!q.g_idx.empty()) w.add(prefix + ".weight_g_idx", DType::I32, {in}, q.g_idx.data(), q.g_idx.size() * 4);
}

}  // namespace

namespace {

// The QuantizationArgs keys of a JSON mapping, each read as its type
// (quantizers/quant_args.h gives them their meaning).
QuantArgs json_quant_args(const json& a, const std::string& where) {
  if (!a.is_object()) throw invalid_input(where, "expected an object, got " + a.dump());
  QuantArgs q;
  auto str = [&](const char* key) -> std::optional<std::string> {
    const json& v = field(a, key);
    if (v.is_null()) return std::nullopt;
    if (!v.is_string()) throw invalid_input(where, std::string(key) + " must be a string, got " + v.dump());
    return v.get<std::string>();
  };
  auto integer = [&](const char* key) -> std::optional<int64_t> {
    const json& v = field(a, key);
    if (v.is_null()) return std::nullopt;
    if (!v.is_number_integer()) throw invalid_input(where, std::string(key) + " must be an integer, got " + v.dump());
    return v.get<int64_t>();
  };
  q.type = str("type");
  q.num_bits = integer("num_bits");
  if (const json& v = field(a, "symmetric"); !v.is_null()) {
    if (!v.is_boolean()) throw invalid_input(where, "symmetric must be a boolean, got " + v.dump());
    q.symmetric = v.get<bool>();
  }
  q.group_size = integer("group_size");
  q.strategy = str("strategy");
  if (const json& v = field(a, "dynamic"); v.is_boolean()) q.dynamic = v.get<bool>() ? "true" : "false";
  else if (v.is_string()) q.dynamic = v.get<std::string>();
  else if (!v.is_null()) throw invalid_input(where, "dynamic must be a boolean or \"local\", got " + v.dump());
  // ActivationOrdering: a name, or a boolean (true: group), or null (none).
  if (const json& v = field(a, "actorder"); v.is_boolean()) q.actorder = v.get<bool>() ? "group" : "";
  else if (v.is_string()) q.actorder = v.get<std::string>();
  else if (!v.is_null()) throw invalid_input(where, "actorder must be a string, a boolean or null, got " + v.dump());
  q.scale_dtype = str("scale_dtype");
  q.zp_dtype = str("zp_dtype");
  q.block_structure = !field(a, "block_structure").is_null();
  return q;
}

// A problem the resolver found, naming its key when the mapping has it.
[[noreturn]] void rethrow_args_problem(const QuantArgsProblem& p, const json& a, const std::string& where) {
  const std::string key = quant_arg_key(p.arg);
  const bool given = !key.empty() && !field(a, key.c_str()).is_null();
  throw Error(p.kind, where + ": " + (given ? key + ": " : "") + p.message);
}

}  // namespace

QuantScheme compressed_tensors_scheme_from_args(const json& a, bool* actorder_group) {
  const std::string where = "compressed-tensors weights args";
  const QuantArgs q = json_quant_args(a, where);
  try {
    const ResolvedWeights r = resolve_weight_args(q);
    if (actorder_group) *actorder_group = r.actorder == std::optional<std::string>("group");
    return r.scheme;
  } catch (const QuantArgsProblem& p) {
    rethrow_args_problem(p, a, where);
  }
}

ActivationScheme compressed_tensors_activation_from_args(const json& a, bool kv_cache) {
  const std::string where = kv_cache ? "compressed-tensors kv_cache_scheme args" : "compressed-tensors input_activations args";
  const QuantArgs q = json_quant_args(a, where);
  try {
    return resolve_activation_args(q, kv_cache);
  } catch (const QuantArgsProblem& p) {
    rethrow_args_problem(p, a, where);
  }
}

QuantizedTensor read_compressed_tensors_linear(const Checkpoint& ck, const std::string& prefix, const json& args) {
  if (args.is_object() && field(args, "type") == "float")
    throw unsupported(prefix, "pack-quantized holds only integer weights, the args say type \"float\"");
  bool actorder_group = false;
  QuantizedTensor q;
  q.scheme = compressed_tensors_scheme_from_args(args, &actorder_group);
  QuantScheme& s = q.scheme;

  const std::string shape_name = prefix + ".weight_shape";
  const auto shape = copy_elements<int64_t>(fetch_checked(ck, shape_name, {DType::I64}, {2}));
  if (shape[0] < 1 || shape[1] < 1)
    throw invalid_input(shape_name, "weight shape [" + std::to_string(shape[0]) + ", " + std::to_string(shape[1]) + "] is empty");
  const int64_t out = shape[0], in = shape[1];
  q.rows = out;
  q.cols = in;

  const std::string packed_name = prefix + ".weight_packed";
  const auto packed = copy_elements<int32_t>(fetch_checked(ck, packed_name, {DType::I32}, {out, packed_words(in, s.bits)}));
  q.q = unpack_int32_rows(packed.data(), out, in, s.bits);

  const int64_t G = q.n_groups();
  const Tensor scale = fetch_checked(ck, prefix + ".weight_scale", {DType::F16, DType::BF16, DType::F32}, param_shape(q));
  s.scale_dtype = scale.dtype();
  q.scales = scale.to_f32_vector();

  const size_t np = q.scales.size();
  const std::string zp_name = prefix + ".weight_zero_point";
  if (s.symmetric) {
    q.zeros.assign(np, s.sym_zero());
  } else if (s.strategy == QuantStrategy::Tensor) {
    const auto zp = copy_elements<int8_t>(fetch_checked(ck, zp_name, {DType::I8}, {1}));
    const int32_t z = zp[0] + s.sym_zero();
    if (z < 0 || z > s.qmax())
      throw invalid_input(zp_name, "zero point " + std::to_string(zp[0]) + " is outside the signed " +
                                       std::to_string(s.bits) + "-bit range");
    q.zeros.assign(1, z);
  } else {
    const auto zp = copy_elements<int32_t>(fetch_checked(ck, zp_name, {DType::I32}, {packed_words(out, s.bits), G}));
    const auto z = unpack_int32_cols(zp.data(), out, G, s.bits);
    q.zeros.assign(z.begin(), z.end());
  }

  const std::string g_name = prefix + ".weight_g_idx";
  if (actorder_group) {
    q.g_idx = copy_elements<int32_t>(fetch_checked(ck, g_name, {DType::I32}, {in}));
  } else if (ck.contains(g_name)) {
    throw invalid_input(g_name, "present, but the scheme's actorder is not \"group\"");
  }

  q.validate(prefix);
  return q;
}

namespace {

// The input quantizer parameters stored beside a Linear (see the header).
ActQuantParams read_act_params(const Checkpoint& ck, const std::string& prefix, const ActivationScheme& a) {
  ActQuantParams p;
  p.scheme = a;
  if (a.is_nvfp4()) {
    const std::string n = prefix + ".input_global_scale";
    p.global_scale = read_scalar(ck, n, {DType::F32});
    if (!(std::isfinite(p.global_scale) && p.global_scale > 0))
      throw invalid_input(n, "NVFP4 input global scale must be positive and finite");
  } else if (!a.dynamic) {
    const std::string n = prefix + ".input_scale";
    p.scale = read_scalar(ck, n, {DType::F16, DType::BF16, DType::F32});
    if (!(std::isfinite(p.scale) && p.scale > 0)) throw invalid_input(n, "static input scale must be positive and finite");
    if (!a.symmetric) {
      const std::string zn = prefix + ".input_zero_point";
      const TensorInfo& info = ck.info(zn);
      const auto z = copy_elements<int8_t>(fetch_checked(ck, zn, {DType::I8}, info.shape.empty() ? Shape{} : Shape{1}));
      p.zero_point = z.at(0);
    }
  }
  return p;
}

// int-quantized / float-quantized / naive-quantized: the unpacked weight.
QuantizedTensor read_naive_linear(const Checkpoint& ck, const std::string& prefix, const json& args) {
  bool actorder_group = false;
  QuantizedTensor q;
  q.scheme = compressed_tensors_scheme_from_args(args, &actorder_group);
  QuantScheme& s = q.scheme;
  if (s.is_nvfp4()) throw invalid_input(prefix, "NVFP4 weights are stored in the nvfp4-pack-quantized format");
  const std::string wn = prefix + ".weight";
  const TensorInfo& info = ck.info(wn);
  if (info.shape.size() != 2 || info.shape[0] < 1 || info.shape[1] < 1)
    throw invalid_input(wn, "shape is " + shape_str(info.shape) + ", expected a non-empty [out, in] matrix");
  q.rows = info.shape[0];
  q.cols = info.shape[1];
  if (s.is_fp8()) {
    q.q = copy_elements<uint8_t>(fetch_checked(ck, wn, {DType::F8_E4M3}, info.shape));
  } else {
    const auto v = copy_elements<int8_t>(fetch_checked(ck, wn, {DType::I8}, info.shape));
    q.q.resize(v.size());
    const int lo = -s.sym_zero(), hi = s.sym_zero() - 1;
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] < lo || v[i] > hi)
        throw invalid_input(wn, "value " + std::to_string(v[i]) + " is outside the signed " + std::to_string(s.bits) + "-bit range");
      q.q[i] = static_cast<uint8_t>(v[i] + s.sym_zero());
    }
  }
  const Shape ps = param_shape(q);
  const Tensor scale = fetch_checked(ck, prefix + ".weight_scale", {DType::F16, DType::BF16, DType::F32}, ps);
  s.scale_dtype = scale.dtype();
  q.scales = scale.to_f32_vector();
  const std::string zn = prefix + ".weight_zero_point";
  if (s.is_float()) {
    if (ck.contains(zn)) throw invalid_input(zn, "present, but float weights are symmetric");
  } else if (s.symmetric) {
    q.zeros.assign(q.scales.size(), s.sym_zero());
  } else {
    const auto z = copy_elements<int8_t>(fetch_checked(ck, zn, {DType::I8}, ps));
    for (int8_t v : z) {
      const int32_t u = v + s.sym_zero();
      if (u < 0 || u > s.qmax())
        throw invalid_input(zn, "zero point " + std::to_string(v) + " is outside the signed " + std::to_string(s.bits) + "-bit range");
      q.zeros.push_back(u);
    }
  }
  const std::string g_name = prefix + ".weight_g_idx";
  if (actorder_group) q.g_idx = copy_elements<int32_t>(fetch_checked(ck, g_name, {DType::I32}, {q.cols}));
  else if (ck.contains(g_name)) throw invalid_input(g_name, "present, but the scheme's actorder is not \"group\"");
  q.validate(prefix);
  return q;
}

QuantizedTensor read_nvfp4_linear(const Checkpoint& ck, const std::string& prefix, const json& args) {
  QuantizedTensor q;
  q.scheme = compressed_tensors_scheme_from_args(args);
  if (!q.scheme.is_nvfp4())
    throw invalid_input(prefix, "nvfp4-pack-quantized holds NVFP4 weights, the scheme is " + q.scheme.describe());
  const std::string pn = prefix + ".weight_packed";
  const TensorInfo& info = ck.info(pn);
  if (info.shape.size() != 2 || info.shape[0] < 1 || info.shape[1] < 1 || info.shape[1] % 8 != 0)
    throw invalid_input(pn, "shape is " + shape_str(info.shape) + ", expected [out, in/2] with in a multiple of 16");
  q.rows = info.shape[0];
  q.cols = info.shape[1] * 2;
  const auto packed = copy_elements<uint8_t>(fetch_checked(ck, pn, {DType::U8}, info.shape));
  q.q.resize(packed.size() * 2);
  for (size_t i = 0; i < packed.size(); ++i) {
    q.q[2 * i] = packed[i] & 0xf;
    q.q[2 * i + 1] = packed[i] >> 4;
  }
  const std::string sn = prefix + ".weight_scale";
  const auto sc = copy_elements<uint8_t>(fetch_checked(ck, sn, {DType::F8_E4M3}, {q.rows, q.n_groups()}));
  q.scales.resize(sc.size());
  for (size_t i = 0; i < sc.size(); ++i) {
    if ((sc[i] & 0x7f) == 0x7f) throw invalid_input(sn, "a block scale is NaN");
    q.scales[i] = f8e4m3_to_f32(sc[i]);
  }
  const std::string gn = prefix + ".weight_global_scale";
  q.global_scale = read_scalar(ck, gn, {DType::F32});
  if (!(std::isfinite(q.global_scale) && q.global_scale > 0))
    throw invalid_input(gn, "global scale must be positive and finite");
  q.validate(prefix);
  return q;
}

}  // namespace

CompressedTensorsLinear read_compressed_tensors_any(const Checkpoint& ck, const std::string& prefix, const json& group,
                                                    const std::string& top_format) {
  if (!group.is_object()) throw invalid_input(prefix, "config group must be an object, got " + group.dump());
  const json& fj = field(group, "format");
  if (!fj.is_null() && !fj.is_string()) throw invalid_input(prefix, "config group format must be a string, got " + fj.dump());
  const std::string fmt = fj.is_string() ? fj.get<std::string>() : top_format;
  const json& weights = field(group, "weights");
  if (!weights.is_object()) throw invalid_input(prefix, "config group has no weights args");
  const json& ia = field(group, "input_activations");

  CompressedTensorsLinear r;
  if (fmt == "pack-quantized") r.q = read_compressed_tensors_linear(ck, prefix, weights);
  else if (is_naive_layout(fmt)) r.q = read_naive_linear(ck, prefix, weights);
  else if (fmt == "nvfp4-pack-quantized") r.q = read_nvfp4_linear(ck, prefix, weights);
  else if (fmt == "mixed-precision") throw invalid_input(prefix, "format is mixed-precision but the config group names none");
  else throw unsupported(prefix, "compressed-tensors format '" + fmt + "' (supported: pack-quantized, int-quantized, "
                                     "float-quantized, naive-quantized, nvfp4-pack-quantized)");
  if (!ia.is_null()) {
    const ActivationScheme a = compressed_tensors_activation_from_args(ia);
    if (a.is_nvfp4() != r.q.scheme.is_nvfp4())
      throw unsupported(prefix, "activations " + a.describe() + " with weights " + r.q.scheme.describe());
    r.act = read_act_params(ck, prefix, a);
  }
  return r;
}

json compressed_tensors_weights_args(const QuantScheme& s, bool actorder_group, const std::string& observer,
                                    const std::map<std::string, std::string>& observer_kwargs) {
  s.validate("compressed-tensors scheme");
  if (actorder_group && s.strategy != QuantStrategy::Group)
    throw invalid_input("compressed-tensors scheme", "actorder group requires the group strategy");
  json a = json::object();
  a["num_bits"] = s.bits;
  a["type"] = quant_type_name(s.type);
  a["symmetric"] = s.symmetric;
  a["group_size"] = s.grouped() ? json(s.group_size) : json(nullptr);
  a["strategy"] = strategy_name(s.strategy);
  a["block_structure"] = nullptr;
  a["dynamic"] = false;
  a["actorder"] = actorder_group ? json("group") : json(nullptr);
  a["scale_dtype"] = s.is_nvfp4() ? json("torch.float8_e4m3fn") : json(nullptr);
  a["zp_dtype"] = s.symmetric ? json(nullptr) : json("torch.int8");
  a["observer"] = observer;
  a["observer_kwargs"] = json::object();
  // Numbers as numbers (the recipe's scalars), anything else as a string.
  for (const auto& [k, v] : observer_kwargs) a["observer_kwargs"][k] = json::accept(v) ? json::parse(v) : json(v);
  return a;
}

json compressed_tensors_activation_args(const ActivationScheme& s) {
  s.validate("compressed-tensors input activations");
  json a = json::object();
  a["num_bits"] = s.bits;
  a["type"] = quant_type_name(s.type);
  a["symmetric"] = s.symmetric;
  a["group_size"] = s.is_nvfp4() ? json(s.group_size) : json(nullptr);
  a["strategy"] = strategy_name(s.strategy);
  a["block_structure"] = nullptr;
  a["dynamic"] = s.is_nvfp4() ? json("local") : json(s.dynamic);
  a["actorder"] = nullptr;
  a["scale_dtype"] = s.is_nvfp4() ? json("torch.float8_e4m3fn") : json(nullptr);
  a["zp_dtype"] = s.symmetric ? json(nullptr) : json("torch.int8");
  a["observer"] = s.dynamic && !s.is_nvfp4() ? json(nullptr) : json("static_minmax");
  a["observer_kwargs"] = json::object();
  return a;
}

json compressed_tensors_config(const std::vector<CompressedTensorsGroup>& groups, const std::vector<std::string>& ignore,
                               const std::string& version, const std::optional<ActivationScheme>& kv_cache_scheme) {
  if (groups.empty()) throw invalid_input("compressed-tensors config", "no quantization groups");
  json cg = json::object();
  std::vector<std::string> formats;
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto& g = groups[i];
    const std::string name = "group_" + std::to_string(i);
    if (g.targets.empty()) throw invalid_input("compressed-tensors config", name + " has no targets");
    const ActivationScheme* act = g.input_activations ? &*g.input_activations : nullptr;
    const std::string inferred = compressed_tensors_format_of(g.scheme, act);
    const std::string fmt = g.format.empty() ? inferred : g.format;
    if (fmt != inferred && !(is_naive_layout(fmt) && is_naive_layout(inferred) && g.scheme.type == QuantType::Float))
      throw invalid_input("compressed-tensors config", name + ": format '" + fmt + "' does not hold " + g.scheme.describe() +
                                                           " weights" + (act ? " with " + act->describe() + " activations" : ""));
    json e = json::object();
    e["targets"] = g.targets;
    e["weights"] = compressed_tensors_weights_args(g.scheme, g.actorder_group, g.observer, g.observer_kwargs);
    e["input_activations"] = act ? compressed_tensors_activation_args(*act) : json(nullptr);
    e["output_activations"] = nullptr;
    e["format"] = fmt;
    cg[name] = std::move(e);
    if (std::find(formats.begin(), formats.end(), fmt) == formats.end()) formats.push_back(fmt);
  }
  json kv = nullptr;
  if (kv_cache_scheme) {
    const ActivationScheme& k = *kv_cache_scheme;
    if (!(k.type == QuantType::Float && k.bits == 8 && k.strategy == QuantStrategy::Tensor && !k.dynamic && k.symmetric))
      throw unsupported("compressed-tensors config", "kv_cache_scheme " + k.describe() + " (supported: fp8 tensor static)");
    kv = compressed_tensors_activation_args(k);
    kv["observer"] = "memoryless_minmax";
  }
  json c = json::object();
  c["config_groups"] = std::move(cg);
  c["format"] = formats.size() == 1 ? formats[0] : std::string("mixed-precision");
  c["global_compression_ratio"] = nullptr;
  c["ignore"] = ignore;
  c["kv_cache_scheme"] = std::move(kv);
  c["quant_method"] = "compressed-tensors";
  c["quantization_status"] = "compressed";
  c["sparsity_config"] = json::object();
  c["transform_config"] = json::object();
  c["version"] = version;
  return c;
}

// ---- the checkpoint format --------------------------------------------------

namespace {

std::string attn_module(int64_t layer) { return "model.layers." + std::to_string(layer) + ".self_attn"; }

// The config group that claims a module, with compressed-tensors'
// precedence: an exact module name, then a "re:" pattern, then a class name.
// Targets are written in the checkpoint's own spelling (`stored`), which a
// vision-language checkpoint's working names (`module`) may not share.
nlohmann::json group_of(const nlohmann::json& qcfg, const std::string& module, const std::string& stored) {
  if (!qcfg.contains("config_groups") || !qcfg["config_groups"].is_object())
    throw invalid_input(module, "quantization_config has no config_groups");
  const nlohmann::json* best = nullptr;
  int best_rank = 0;
  for (const auto& [name, g] : qcfg["config_groups"].items()) {
    if (!g.is_object() || !g.contains("weights")) continue;
    for (const auto& t : g.value("targets", nlohmann::json::array())) {
      if (!t.is_string()) continue;
      const std::string target = t.get<std::string>();
      for (const std::string* m : {&stored, &module}) {
        if (!recipe_matches(target, *m)) continue;
        const int rank = target == *m ? 3 : target.rfind("re:", 0) == 0 ? 2 : 1;
        if (rank > best_rank) best = &g, best_rank = rank;
      }
    }
  }
  if (!best) throw invalid_input(module, "no config group of quantization_config targets this module");
  return *best;
}

class CompressedTensorsFormat final : public CheckpointFormat {
 public:
  const char* name() const override { return "compressed-tensors"; }

  // Every scheme quantforge quantizes has a compressed-tensors format
  // (compressed_tensors_format_of); add_linear validates each Linear.
  void check_linear(const LinearCheck& c) const override {
    if (c.weights->is_bnb4())
      throw unsupported(c.where, "compressed-tensors has no " + c.weights->describe() +
                                     " format; NF4/FP4 are written by export: {format: bitsandbytes}");
  }
  bool one_scheme_per_model() const override { return false; }
  bool every_linear_quantized() const override { return false; }
  bool holds_kv_scales() const override { return true; }

  void add_linear(SafetensorsWriter& w, const std::string& prefix, const QuantizedTensor& q,
                  const ActQuantParams* act) const override {
    add_compressed_tensors_linear(w, prefix, q, act);
  }
  void add_kv_scales(SafetensorsWriter& w, int64_t layer, const KvScales& calibrated, DType model_dtype) const override {
    add_compressed_tensors_kv_scales(w, attn_module(layer), calibrated, model_dtype);
  }
  void write_config(const ExportConfig& c, nlohmann::ordered_json& config, const std::filesystem::path&) const override {
    std::vector<CompressedTensorsGroup> list;
    for (const ExportGroup& g : c.groups) {
      CompressedTensorsGroup cg;
      cg.scheme = g.weights;
      cg.targets = g.targets;
      cg.actorder_group = g.actorder == GptqOptions::ActOrder::Group;
      cg.observer = g.mse_observer ? "mse" : "memoryless_minmax";
      cg.observer_kwargs = g.observer_kwargs;
      cg.input_activations = g.act;
      list.push_back(cg);
    }
    nlohmann::json qc = compressed_tensors_config(list, c.ignore, kCompressedTensorsVersion, c.kv_cache);
    // GPTQ's static act-order is recorded as llm-compressor records it.
    for (size_t i = 0; i < c.groups.size(); ++i)
      if (c.by_gptq && c.groups[i].actorder == GptqOptions::ActOrder::Weight)
        qc["config_groups"]["group_" + std::to_string(i)]["weights"]["actorder"] = "static";
    config["quantization_config"] = qc;
  }

  OpenedConfig open(const std::filesystem::path&, const nlohmann::json& qcfg,
                    const std::string& config_file) const override {
    OpenedConfig o{qcfg, false};
    const std::string fmt = qcfg.value("format", "");
    static const char* kFormats[] = {"pack-quantized", "int-quantized", "float-quantized", "naive-quantized",
                                     "nvfp4-pack-quantized", "mixed-precision"};
    if (std::find(std::begin(kFormats), std::end(kFormats), fmt) == std::end(kFormats))
      throw unsupported(config_file, "compressed-tensors format '" + fmt + "' is not supported by the runtime (pack-quantized, "
                                     "int-quantized, float-quantized, naive-quantized, nvfp4-pack-quantized, mixed-precision)");
    const auto& kv = qcfg.contains("kv_cache_scheme") ? qcfg["kv_cache_scheme"] : nlohmann::json();
    if (!kv.is_null()) {
      compressed_tensors_activation_from_args(kv, true);  // FP8 per-tensor static, or an error
      o.kv_scales = true;
    }
    return o;
  }
  // Quantized modules carry a weight_scale (or a packed weight); ignored ones are dense.
  std::optional<ReadLinear> read_linear(const Checkpoint& ck, const std::string& prefix,
                                        const nlohmann::json& qcfg) const override {
    if (!ck.contains(prefix + ".weight_packed") && !ck.contains(prefix + ".weight_scale")) return std::nullopt;
    CompressedTensorsLinear r = read_compressed_tensors_any(
        ck, prefix, group_of(qcfg, prefix, ck.naming().module_to_stored(prefix)), qcfg.value("format", ""));
    return ReadLinear{std::move(r.q), std::move(r.act), false};
  }
  KvScales read_kv_scales(const Checkpoint& ck, int64_t layer) const override {
    return read_compressed_tensors_kv_scales(ck, attn_module(layer));
  }
  // "compressed-tensors pack-quantized: group_0 int4 sym g128 -> ["Linear"]; ignore lm_head"
  std::string describe(const nlohmann::json& q) const override {
    std::string out = "compressed-tensors " + q.value("format", std::string("?")) + ":";
    for (const auto& [name, g] : q.at("config_groups").items()) {
      const nlohmann::json& w = g.at("weights");
      out += " " + name + " " + compressed_tensors_scheme_from_args(w).describe();
      if (w.contains("actorder") && w["actorder"].is_string()) out += " actorder " + w["actorder"].get<std::string>();
      if (g.contains("input_activations") && g["input_activations"].is_object())
        out += " / " + compressed_tensors_activation_from_args(g["input_activations"]).describe();
      out += " -> " + g.value("targets", nlohmann::json::array()).dump() + ";";
    }
    if (q.contains("kv_cache_scheme") && q["kv_cache_scheme"].is_object()) out += " kv cache fp8;";
    std::string ign;
    for (const auto& i : q.value("ignore", nlohmann::json::array())) ign += (ign.empty() ? "" : ", ") + i.get<std::string>();
    return out + " ignore " + (ign.empty() ? "nothing" : ign);
  }
};

}  // namespace

const CheckpointFormat& compressed_tensors_checkpoint_format() {
  static const CompressedTensorsFormat f;
  return f;
}

}  // namespace qf
