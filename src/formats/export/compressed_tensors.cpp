#include "formats/export/compressed_tensors.h"

#include <cstring>

#include "core/error.h"
#include "formats/export/checked_tensor.h"
#include "formats/export/pack.h"

namespace qf {
namespace {

using json = nlohmann::json;

std::string sq(const std::string& s) { return "'" + s + "'"; }

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

}  // namespace

void add_compressed_tensors_linear(SafetensorsWriter& w, const std::string& prefix, const QuantizedTensor& q) {
  q.validate(prefix);
  const QuantScheme& s = q.scheme;
  const int64_t out = q.rows, in = q.cols, G = q.n_groups();

  const auto packed = pack_int32_rows(q.q.data(), out, in, s.bits);
  w.add(prefix + ".weight_packed", DType::I32, {out, packed_words(in, s.bits)}, packed.data(), packed.size() * 4);

  Shape scale_shape;
  switch (s.strategy) {
    case QuantStrategy::Tensor: scale_shape = {1}; break;
    case QuantStrategy::Channel: scale_shape = {out, 1}; break;
    case QuantStrategy::Group: scale_shape = {out, G}; break;
  }
  const auto sb = scales_as(q.scales, s.scale_dtype);
  w.add(prefix + ".weight_scale", s.scale_dtype, scale_shape, sb.data(), sb.size());

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

  if (!q.g_idx.empty()) {
    if (s.strategy != QuantStrategy::Group)
      throw invalid_input(prefix, "g_idx (actorder group) requires the group strategy");
    w.add(prefix + ".weight_g_idx", DType::I32, {in}, q.g_idx.data(), q.g_idx.size() * 4);
  }
}

QuantScheme compressed_tensors_scheme_from_args(const json& a, bool* actorder_group) {
  const std::string where = "compressed-tensors weights args";
  if (!a.is_object()) throw invalid_input(where, "expected an object, got " + a.dump());
  QuantScheme s;
  const json& type = field(a, "type");
  if (!type.is_null() && (!type.is_string() || type.get<std::string>() != "int"))
    throw unsupported(where, "only integer weights are supported, got type " + type.dump());
  const json& nb = field(a, "num_bits");
  s.bits = nb.is_null() ? 8 : (nb.is_number_integer() ? nb.get<int>() : -1);
  if (!nb.is_null() && !nb.is_number_integer()) throw invalid_input(where, "num_bits must be an integer, got " + nb.dump());
  if (s.bits < 2 || s.bits > 8) throw unsupported(where, "num_bits " + std::to_string(s.bits) + " (supported: 2..8)");
  const json& sym = field(a, "symmetric");
  if (!sym.is_null() && !sym.is_boolean()) throw invalid_input(where, "symmetric must be a boolean, got " + sym.dump());
  s.symmetric = sym.is_null() ? true : sym.get<bool>();
  const json& dyn = field(a, "dynamic");
  if (!dyn.is_null() && !(dyn.is_boolean() && !dyn.get<bool>()))
    throw unsupported(where, "dynamic weight quantization (" + dyn.dump() + ")");

  const json& gs = field(a, "group_size");
  if (!gs.is_null() && !gs.is_number_integer()) throw invalid_input(where, "group_size must be an integer, got " + gs.dump());
  const int64_t group_size = gs.is_null() ? 0 : gs.get<int64_t>();
  const json& st = field(a, "strategy");
  std::string strategy;
  if (st.is_null()) {
    strategy = gs.is_null() ? "tensor" : group_size > 0 ? "group" : group_size == -1 ? "channel" : "?";
    if (strategy == "?") throw invalid_input(where, "invalid group_size " + gs.dump());
  } else {
    if (!st.is_string()) throw invalid_input(where, "strategy must be a string, got " + st.dump());
    strategy = st.get<std::string>();
  }
  if (strategy == "tensor") {
    s.strategy = QuantStrategy::Tensor;
  } else if (strategy == "channel") {
    s.strategy = QuantStrategy::Channel;
  } else if (strategy == "group") {
    s.strategy = QuantStrategy::Group;
    if (group_size < 1) throw invalid_input(where, "strategy group requires group_size > 0, got " + gs.dump());
    s.group_size = group_size;
  } else {
    throw unsupported(where, "weight strategy " + sq(strategy) + " (supported: tensor, channel, group)");
  }

  const json& ao = field(a, "actorder");
  bool group_order = false;
  if (ao.is_boolean()) {
    group_order = ao.get<bool>();
  } else if (ao.is_string()) {
    const std::string v = ao.get<std::string>();
    if (v == "group" || v == "dynamic") group_order = true;
    else if (v != "weight" && v != "static") throw invalid_input(where, "unknown actorder " + ao.dump());
  } else if (!ao.is_null()) {
    throw invalid_input(where, "actorder must be a string, a boolean or null, got " + ao.dump());
  }
  if (group_order && s.strategy != QuantStrategy::Group)
    throw invalid_input(where, "actorder group requires the group strategy");
  if (actorder_group) *actorder_group = group_order;
  return s;
}

QuantizedTensor read_compressed_tensors_linear(const Checkpoint& ck, const std::string& prefix, const json& args) {
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
  Shape scale_shape;
  switch (s.strategy) {
    case QuantStrategy::Tensor: scale_shape = {1}; break;
    case QuantStrategy::Channel: scale_shape = {out, 1}; break;
    case QuantStrategy::Group: scale_shape = {out, G}; break;
  }
  const Tensor scale = fetch_checked(ck, prefix + ".weight_scale", {DType::F16, DType::BF16, DType::F32}, scale_shape);
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

json compressed_tensors_weights_args(const QuantScheme& s, bool actorder_group, const std::string& observer) {
  s.validate("compressed-tensors scheme");
  if (actorder_group && s.strategy != QuantStrategy::Group)
    throw invalid_input("compressed-tensors scheme", "actorder group requires the group strategy");
  json a = json::object();
  a["num_bits"] = s.bits;
  a["type"] = "int";
  a["symmetric"] = s.symmetric;
  a["group_size"] = s.strategy == QuantStrategy::Group ? json(s.group_size) : json(nullptr);
  a["strategy"] = strategy_name(s.strategy);
  a["block_structure"] = nullptr;
  a["dynamic"] = false;
  a["actorder"] = actorder_group ? json("group") : json(nullptr);
  a["scale_dtype"] = nullptr;
  a["zp_dtype"] = s.symmetric ? json(nullptr) : json("torch.int8");
  a["observer"] = observer;
  a["observer_kwargs"] = json::object();
  return a;
}

json compressed_tensors_config(const std::vector<CompressedTensorsGroup>& groups, const std::vector<std::string>& ignore,
                               const std::string& version) {
  if (groups.empty()) throw invalid_input("compressed-tensors config", "no quantization groups");
  json cg = json::object();
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto& g = groups[i];
    if (g.targets.empty()) throw invalid_input("compressed-tensors config", "group_" + std::to_string(i) + " has no targets");
    json e = json::object();
    e["targets"] = g.targets;
    e["weights"] = compressed_tensors_weights_args(g.scheme, g.actorder_group, g.observer);
    e["input_activations"] = nullptr;
    e["output_activations"] = nullptr;
    e["format"] = "pack-quantized";
    cg["group_" + std::to_string(i)] = std::move(e);
  }
  json c = json::object();
  c["config_groups"] = std::move(cg);
  c["format"] = "pack-quantized";
  c["global_compression_ratio"] = nullptr;
  c["ignore"] = ignore;
  c["kv_cache_scheme"] = nullptr;
  c["quant_method"] = "compressed-tensors";
  c["quantization_status"] = "compressed";
  c["sparsity_config"] = json::object();
  c["transform_config"] = json::object();
  c["version"] = version;
  return c;
}

}  // namespace qf
