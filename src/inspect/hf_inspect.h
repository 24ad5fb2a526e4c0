// A structured summary of a Hugging Face model folder: what `quantforge inspect` prints.
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace qf {

// Resolves `model` (see formats/hf/resolve.h), parses config.json, opens and validates
// every safetensors file, and returns the summary as JSON:
//   path, source{kind, repo_id, commit}, architecture, architectures,
//   config{...key dimensions...}, parameters, total_bytes, dtypes{dtype: params},
//   files[{file, bytes, tensors}], layers[{index, bytes, parameters, tensors[...]}],
//   other_tensors[...], tokenizer_files[...], quantization_config (or null),
//   where each tensor is {name, shape, dtype, bytes}.
nlohmann::json inspect_model(const std::string& model, const std::string& revision = "main");

// The readable report of an inspect_model() result.
std::string format_inspect_report(const nlohmann::json& info);

}  // namespace qf
