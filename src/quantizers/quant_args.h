// One resolver for compressed-tensors' QuantizationArgs: the weights,
// input_activations and kv_cache_scheme mappings that a recipe gives in YAML
// and that a checkpoint's quantization_config gives in JSON. Both readers
// only lift each key to its type (QuantArgs); what the keys mean, their
// defaults and every check on their combination live here, so a recipe and a
// checkpoint accept exactly the same schemes.
//
// Defaults as compressed-tensors' QuantizationArgs: num_bits 8, type int,
// symmetric true, dynamic false; no strategy means one inferred from
// group_size (none -> tensor, > 0 -> group, -1 -> channel).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/error.h"
#include "quantizers/act_quant.h"
#include "quantizers/quant_scheme.h"

namespace qf {

// The keys, each as given (nullopt: absent or null). Strings are compared
// case-insensitively; a "torch." prefix on a dtype is ignored.
struct QuantArgs {
  std::optional<std::string> type;          // "int" or "float"
  std::optional<int64_t> num_bits;
  std::optional<bool> symmetric;
  std::optional<int64_t> group_size;
  std::optional<std::string> strategy;
  std::optional<std::string> dynamic;       // "true", "false" or "local"
  std::optional<std::string> actorder;      // canonical_actorder()'s names
  std::optional<std::string> scale_dtype;
  std::optional<std::string> zp_dtype;
  bool block_structure = false;             // given and not null
};

// The key a problem is about, so that a reader can point at it (a YAML
// line:column, a JSON key). None: the mapping as a whole.
enum class QuantArg { None, Type, NumBits, GroupSize, Strategy, Dynamic, ActOrder, ScaleDType, ZpDType, BlockStructure };
const char* quant_arg_key(QuantArg a);  // "type", "num_bits", ...; "" for None

// What the resolvers throw: the reader adds where (a file position or a
// tensor name) and rethrows it as a qf::Error of `kind`.
struct QuantArgsProblem {
  QuantArg arg;
  std::string message;
  ErrorKind kind;
};

// ActivationOrdering by name: "weight"/"static" -> "weight",
// "group"/"dynamic" -> "group", case-insensitive; nullopt for anything else.
// (A boolean true means "group" and false none: readers map those.)
std::optional<std::string> canonical_actorder(const std::string& name);

struct ResolvedWeights {
  QuantScheme scheme;
  std::optional<std::string> actorder;  // "", "weight" or "group" when given
  bool scale_dtype_given = false;       // the scale dtype is fixed by the args (or NVFP4's)
};

// Weights: int 2..8 bits (tensor, channel, group), FP8 (tensor, channel,
// group) or NVFP4 (tensor_group 16). Scale dtypes float16/bfloat16/float32,
// e4m3 for NVFP4 only. Throws QuantArgsProblem.
ResolvedWeights resolve_weight_args(const QuantArgs& a);

// input_activations (kv_cache false): int8 or FP8, per-token dynamic or
// per-tensor static, or NVFP4 (tensor_group 16, dynamic local);
// kv_cache_scheme (kv_cache true): FP8 per-tensor static only. Throws
// QuantArgsProblem.
ActivationScheme resolve_activation_args(const QuantArgs& a, bool kv_cache);

}  // namespace qf
