// bitsandbytes 4-bit (NF4/FP4) checkpoints: the pieces of the `bitsandbytes`
// CheckpointFormat (bitsandbytes_format.cpp) that the tests reach directly.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "quantizers/quant_scheme.h"

namespace qf {

// Python's repr() of a float, as json.dumps writes nested_offset.
std::string python_float_repr(double v);
// The bytes of P.weight.quant_state.bitsandbytes__<type> (json.dumps).
std::string bnb_quant_state_json(const QuantizedTensor& q);
// Writes P.weight, .absmax, .quant_map (.nested_absmax, .nested_quant_map)
// and .quant_state.bitsandbytes__<type> for `prefix` (no trailing dot).
void add_bnb4_linear(SafetensorsWriter& w, const std::string& prefix, const QuantizedTensor& q);
// Reads them back; nullopt when P.weight has no quant_state.
std::optional<QuantizedTensor> read_bnb4_linear(const Checkpoint& ck, const std::string& prefix);
// BitsAndBytesConfig(load_in_4bit=True, ...).to_dict() for config.json.
nlohmann::json bnb_quantization_config(const QuantScheme& s, const std::vector<std::string>& skip,
                                       const std::string& compute_dtype);

}  // namespace qf
