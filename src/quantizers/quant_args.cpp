#include "quantizers/quant_args.h"

#include <cctype>
#include <vector>

#include "core/did_you_mean.h"

namespace qf {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string quote(const std::string& s) { return "'" + s + "'"; }

[[noreturn]] void problem(QuantArg arg, const std::string& message, ErrorKind kind = ErrorKind::InvalidInput) {
  throw QuantArgsProblem{arg, message, kind};
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// A dtype quantforge cannot choose: absent, or one of `accepted`; anything
// else is Unsupported with `why`.
void check_fixed_dtype(const std::optional<std::string>& given, QuantArg arg, const std::vector<std::string>& accepted,
                       const std::string& why) {
  if (!given) return;
  std::string t = *given;
  if (t.rfind("torch.", 0) == 0) t = t.substr(6);
  for (const auto& a : accepted)
    if (t == a) return;
  problem(arg, quote(t) + " is not supported (" + why + (accepted.empty() ? "" : "; accepted: " + join(accepted)) + ")",
          ErrorKind::Unsupported);
}

bool is_float_type(const QuantArgs& a) {
  if (!a.type) return false;
  const std::string t = lower(*a.type);
  if (t != "int" && t != "float") problem(QuantArg::Type, "expected 'int' or 'float', got " + quote(*a.type));
  return t == "float";
}

// dynamic: "true", "false" or "local" (case-insensitive).
std::string dynamic_of(const QuantArgs& a) {
  if (!a.dynamic) return "false";
  const std::string d = lower(*a.dynamic);
  if (d != "true" && d != "false" && d != "local")
    problem(QuantArg::Dynamic, "expected true, false or 'local', got " + quote(*a.dynamic));
  return d;
}

// The strategy as given, else inferred from group_size.
std::string strategy_of(const QuantArgs& a) {
  if (a.strategy) return lower(*a.strategy);
  return !a.group_size ? "tensor" : *a.group_size > 0 ? "group" : "channel";
}

}  // namespace

const char* quant_arg_key(QuantArg a) {
  switch (a) {
    case QuantArg::None: return "";
    case QuantArg::Type: return "type";
    case QuantArg::NumBits: return "num_bits";
    case QuantArg::GroupSize: return "group_size";
    case QuantArg::Strategy: return "strategy";
    case QuantArg::Dynamic: return "dynamic";
    case QuantArg::ActOrder: return "actorder";
    case QuantArg::ScaleDType: return "scale_dtype";
    case QuantArg::ZpDType: return "zp_dtype";
    case QuantArg::BlockStructure: return "block_structure";
  }
  return "";
}

std::optional<std::string> canonical_actorder(const std::string& name) {
  const std::string s = lower(name);
  if (s == "weight" || s == "static") return "weight";
  if (s == "group" || s == "dynamic") return "group";
  return std::nullopt;
}

ResolvedWeights resolve_weight_args(const QuantArgs& a) {
  ResolvedWeights r;
  QuantScheme& w = r.scheme;
  const bool is_float = is_float_type(a);
  w.type = is_float ? QuantType::Float : QuantType::Int;
  w.bits = 8;
  if (a.num_bits) {
    const int64_t b = *a.num_bits;
    if (is_float && b != 8 && b != 4)
      problem(QuantArg::NumBits, "float weights have 8 (FP8 E4M3) or 4 (NVFP4) bits, got " + std::to_string(b),
              ErrorKind::Unsupported);
    if (b < 2 || b > 8) problem(QuantArg::NumBits, "must be 2..8 for int weights, got " + std::to_string(b));
    w.bits = static_cast<int>(b);
  }
  const bool nvfp4 = is_float && w.bits == 4;
  if (is_float) w.scale_dtype = nvfp4 ? DType::F8_E4M3 : DType::F16;
  if (a.symmetric) w.symmetric = *a.symmetric;
  if (is_float && !w.symmetric)
    problem(QuantArg::None, "float weights are symmetric (symmetric: false is for int weights)", ErrorKind::Unsupported);

  const std::optional<int64_t>& gs = a.group_size;
  if (gs && (*gs < -1 || *gs == 0))
    problem(QuantArg::GroupSize, "must be > 0 (strategy group) or -1 (channel), got " + std::to_string(*gs));
  const std::string strategy = strategy_of(a);
  if (a.strategy) {
    if (strategy == "block")
      problem(QuantArg::Strategy, quote(strategy) + " is not supported yet (tensor, channel, group, tensor_group)",
              ErrorKind::Unsupported);
    if (strategy == "token" || strategy == "attn_head")
      problem(QuantArg::Strategy, quote(strategy) + " applies to activations, not weights (tensor, channel, group)");
    if (strategy == "tensor_group" && !nvfp4)
      problem(QuantArg::Strategy, "'tensor_group' is NVFP4's (type float, num_bits 4, group_size 16)",
              ErrorKind::Unsupported);
    if (nvfp4 && strategy != "tensor_group")
      problem(QuantArg::Strategy,
              "4-bit float weights are NVFP4: strategy tensor_group, group_size 16 (MXFP4 is not supported)",
              ErrorKind::Unsupported);
    if (strategy != "tensor" && strategy != "channel" && strategy != "group" && strategy != "tensor_group") {
      const std::string c = closest_word(strategy, {"tensor", "channel", "group", "tensor_group"});
      problem(QuantArg::Strategy, "unknown strategy " + quote(strategy) + " (" +
                                      (c.empty() ? std::string("tensor, channel or group") : "did you mean " + quote(c) + "?") +
                                      ")");
    }
  }
  if (nvfp4 && strategy != "tensor_group")
    problem(QuantArg::Strategy, "4-bit float weights are NVFP4: strategy tensor_group, group_size 16",
            ErrorKind::Unsupported);
  if (strategy == "tensor_group") {
    if (!gs || *gs != 16) problem(QuantArg::Strategy, "NVFP4 (tensor_group) needs group_size 16", ErrorKind::Unsupported);
    w.strategy = QuantStrategy::TensorGroup;
    w.group_size = 16;
  } else if (strategy == "group") {
    if (!gs || *gs <= 0) problem(QuantArg::Strategy, "'group' needs a positive group_size (e.g. group_size: 128)");
    w.strategy = QuantStrategy::Group;
    w.group_size = *gs;
  } else {
    if (gs && *gs > 0)
      problem(QuantArg::GroupSize, "group_size " + std::to_string(*gs) + " needs strategy 'group' (strategy is " +
                                       quote(strategy) + ")");
    w.strategy = strategy == "channel" ? QuantStrategy::Channel : QuantStrategy::Tensor;
    w.group_size = 0;
  }
  if (a.block_structure)
    problem(QuantArg::BlockStructure, "block quantization is not supported yet", ErrorKind::Unsupported);
  if (a.dynamic) {
    const std::string d = dynamic_of(a);
    if (d == "local") problem(QuantArg::Dynamic, "'local' applies to NVFP4 activations, not weights");
    if (d != "false")
      problem(QuantArg::Dynamic, "dynamic weight quantization is not supported (weights are quantized once, statically)",
              ErrorKind::Unsupported);
  }
  if (a.actorder) {
    if (!a.actorder->empty() && !canonical_actorder(*a.actorder))
      problem(QuantArg::ActOrder, "expected static, weight, group, dynamic, true, false or null, got " + quote(*a.actorder));
    r.actorder = a.actorder->empty() ? "" : *canonical_actorder(*a.actorder);
    if (*r.actorder == "group" && w.strategy != QuantStrategy::Group)
      problem(QuantArg::ActOrder, "'group' act-order needs strategy 'group'");
    if (*r.actorder == "group" && is_float)
      problem(QuantArg::ActOrder, "'group' act-order is for int weights (float weights have no g_idx)",
              ErrorKind::Unsupported);
  }
  if (a.scale_dtype) {
    std::string t = lower(*a.scale_dtype);
    if (t.rfind("torch.", 0) == 0) t = t.substr(6);
    if (t == "float16" || t == "half") w.scale_dtype = DType::F16;
    else if (t == "bfloat16") w.scale_dtype = DType::BF16;
    else if (t == "float32" || t == "float") w.scale_dtype = DType::F32;
    else if (t == "float8_e4m3fn" && w.is_nvfp4()) w.scale_dtype = DType::F8_E4M3;
    else if (t == "float8_e4m3fn" || t == "uint8" || t == "float8_e5m2")
      problem(QuantArg::ScaleDType, quote(t) + " scales are NVFP4's only (float16, bfloat16, float32 otherwise)",
              ErrorKind::Unsupported);
    else
      problem(QuantArg::ScaleDType, "unknown dtype " + quote(*a.scale_dtype) + " (float16, bfloat16, float32)");
    if (w.is_nvfp4() && w.scale_dtype != DType::F8_E4M3)
      problem(QuantArg::ScaleDType, "NVFP4 block scales are float8_e4m3fn", ErrorKind::Unsupported);
    r.scale_dtype_given = true;
  }
  if (w.is_nvfp4()) r.scale_dtype_given = true;
  // compressed-tensors' default zero-point dtype: int8 for int weights (their
  // zero points are stored as int8 / packed int32), e4m3 for float ones.
  check_fixed_dtype(a.zp_dtype, QuantArg::ZpDType, {is_float ? "float8_e4m3fn" : "int8"},
                    is_float ? "float weights have no zero point" : "integer zero points are written as int8");
  return r;
}

ActivationScheme resolve_activation_args(const QuantArgs& a, bool kv_cache) {
  ActivationScheme s;
  s.dynamic = false;
  s.type = is_float_type(a) ? QuantType::Float : QuantType::Int;
  if (a.num_bits) s.bits = static_cast<int>(*a.num_bits);
  if (a.symmetric) s.symmetric = *a.symmetric;
  const bool fp4 = s.type == QuantType::Float && s.bits == 4;
  const std::string strategy = strategy_of(a);
  if (a.dynamic) {
    const std::string d = dynamic_of(a);
    if (d == "local") {
      if (!fp4) problem(QuantArg::Dynamic, "'local' is for NVFP4 activations (type float, num_bits 4, strategy tensor_group)");
      s.dynamic = true;
    } else {
      s.dynamic = d == "true";
    }
  }
  if (a.block_structure)
    problem(QuantArg::BlockStructure, "block activation scales are not supported", ErrorKind::Unsupported);
  if (a.actorder && !a.actorder->empty()) problem(QuantArg::ActOrder, "act-order applies to weights");
  check_fixed_dtype(a.scale_dtype, QuantArg::ScaleDType,
                    fp4 ? std::vector<std::string>{"float8_e4m3fn"} : std::vector<std::string>{},
                    fp4 ? "NVFP4 block scales are float8_e4m3fn" : "input and KV-cache scales are stored in the model's dtype");
  check_fixed_dtype(a.zp_dtype, QuantArg::ZpDType, {s.type == QuantType::Float ? "float8_e4m3fn" : "int8"},
                    s.type == QuantType::Float ? "float activations have no zero point" : "zero points are int8");
  if (strategy == "token") s.strategy = QuantStrategy::Token;
  else if (strategy == "tensor") s.strategy = QuantStrategy::Tensor;
  else if (strategy == "tensor_group") s.strategy = QuantStrategy::TensorGroup, s.group_size = a.group_size.value_or(0);
  else if (strategy == "channel" || strategy == "group" || strategy == "block" || strategy == "attn_head")
    problem(QuantArg::Strategy, quote(strategy) + " activation scales are not supported (token, tensor, tensor_group)",
            ErrorKind::Unsupported);
  else
    problem(QuantArg::Strategy, "unknown strategy " + quote(strategy) + " (token, tensor or tensor_group)");
  if (kv_cache) {
    if (!(s.type == QuantType::Float && s.bits == 8 && s.strategy == QuantStrategy::Tensor && !s.dynamic && s.symmetric))
      problem(QuantArg::None,
              "only FP8 E4M3 KV caches with static per-tensor scales are supported (num_bits: 8, type: float, "
              "strategy: tensor, dynamic: false)",
              ErrorKind::Unsupported);
    return s;
  }
  if (s.type == QuantType::Int && s.bits != 8)
    problem(QuantArg::NumBits, "integer activations are quantized to 8 bits only, not " + std::to_string(s.bits),
            ErrorKind::Unsupported);
  if (s.type == QuantType::Float && s.bits != 8 && s.bits != 4)
    problem(QuantArg::NumBits, "float activations are FP8 (8) or NVFP4 (4), not " + std::to_string(s.bits),
            ErrorKind::Unsupported);
  // NVFP4 scales its blocks per batch ("local") under a calibrated global
  // scale; dynamic: true would ask for a per-batch global scale too.
  if (s.is_nvfp4() && (s.strategy != QuantStrategy::TensorGroup || s.group_size != 16 || dynamic_of(a) != "local"))
    problem(QuantArg::None, "NVFP4 activations are strategy tensor_group, group_size 16, dynamic local",
            ErrorKind::Unsupported);
  if (!s.is_nvfp4() && s.strategy == QuantStrategy::TensorGroup)
    problem(QuantArg::Strategy, "tensor_group activations are NVFP4's (type float, num_bits 4)", ErrorKind::Unsupported);
  if (s.strategy == QuantStrategy::Token && !s.dynamic)
    problem(QuantArg::None,
            "per-token activation scales are dynamic (set dynamic: true, or strategy: tensor for static scales)");
  if (s.strategy == QuantStrategy::Tensor && s.dynamic)
    problem(QuantArg::None, "dynamic per-tensor activation scales are not supported (use strategy: token)",
            ErrorKind::Unsupported);
  if (s.type == QuantType::Float && !s.symmetric) problem(QuantArg::None, "float activations are symmetric");
  if (s.strategy == QuantStrategy::Token && !s.symmetric)
    problem(QuantArg::None, "asymmetric per-token activations are not supported", ErrorKind::Unsupported);
  return s;
}

}  // namespace qf
