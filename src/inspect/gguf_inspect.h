// `quantforge inspect FILE.gguf`: what a GGUF file holds, as JSON and as a
// readable report (architecture, dimensions, file type, tensor types with
// their bytes and bits per weight, every metadata key).
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace qf {

nlohmann::json inspect_gguf(const std::filesystem::path& file);
std::string format_gguf_report(const nlohmann::json& info);

// llama.cpp's name of a general.file_type value ("Q4_K_M"), or "ftype N".
std::string llama_ftype_name(uint32_t ftype);

}  // namespace qf
