// One interface over the quantized checkpoint formats quantforge writes and
// reads: compressed-tensors (vLLM), GPTQ and AutoAWQ (transformers, vLLM),
// modelopt (NVIDIA Model Optimizer's Hugging Face export) and bitsandbytes
// 4-bit (NF4/FP4; transformers, vLLM). Each format is one
// class in its own file (compressed_tensors.cpp, gptq_format.cpp,
// awq_format.cpp, modelopt_format.cpp, bitsandbytes_format.cpp) and is found by name in the registry
// below: the quantize plan asks it what it can hold, the quantize driver
// writes through it, the runtime loader and `inspect` read through it. Adding
// a format is one file and one registry entry.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "formats/safetensors.h"
#include "quantizers/act_quant.h"
#include "quantizers/gptq.h"
#include "quantizers/quant_scheme.h"

namespace qf {

// One Linear as the plan has resolved it, for CheckpointFormat::check_linear.
struct LinearCheck {
  std::string name;                     // module name, e.g. "model.layers.0.mlp.down_proj"
  int64_t rows = 0, cols = 0;           // [out, in]
  const QuantScheme* weights = nullptr;
  const ActivationScheme* act = nullptr;  // nullptr: weight-only
  GptqOptions::ActOrder actorder = GptqOptions::ActOrder::None;
  bool scale_dtype_given = false;       // the recipe named the scale dtype (else the model dtype is used)
  std::string where;                    // recipe position for messages ("FILE:LINE:COL")
};

// One scheme group of the quantized model, in the recipe's order.
struct ExportGroup {
  std::vector<std::string> targets;     // class names, module names or "re:" patterns
  QuantScheme weights;
  std::optional<ActivationScheme> act;  // empty: weight-only
  GptqOptions::ActOrder actorder = GptqOptions::ActOrder::None;
  bool mse_observer = false;            // weights ranges from the mse observer
  std::map<std::string, std::string> observer_kwargs;  // as the recipe gave them
};

// What a format's config describes: the groups actually used, the modules left
// in full precision, the KV-cache scheme, GPTQ's dampening.
struct ExportConfig {
  std::vector<ExportGroup> groups;
  std::vector<std::string> ignore;
  std::optional<ActivationScheme> kv_cache;
  bool by_gptq = false;          // quantized by GPTQ (its act-order is recorded as the peers record it)
  double dampening_frac = 0.01;  // GPTQ's
  std::string compute_dtype;     // bitsandbytes: bnb_4bit_compute_dtype ("" = its default, float32)
};

// One Linear read back from a checkpoint.
struct ReadLinear {
  QuantizedTensor q;
  std::optional<ActQuantParams> act;  // input quantizer; empty: weight-only
  bool packed_kernel = false;         // run on the packed-integer kernel (GPTQ's g_idx layouts), not by tiles of decoded rows
};

// A checkpoint's quantization description, validated by CheckpointFormat::open.
struct OpenedConfig {
  nlohmann::json qcfg;     // what the format reads with (modelopt: hf_quant_config.json when present)
  bool kv_scales = false;  // FP8 KV-cache scales are stored
};

class CheckpointFormat {
 public:
  virtual ~CheckpointFormat() = default;
  // The recipe's `export.format` value and config.json's quant_method.
  virtual const char* name() const = 0;

  // ---- what the format can hold (checked by the plan before any work)
  // Throws Unsupported (naming c.where) for a Linear this format cannot store.
  virtual void check_linear(const LinearCheck& c) const = 0;
  virtual bool one_scheme_per_model() const = 0;   // no mixed precision
  virtual bool every_linear_quantized() const = 0;  // no decoder Linear left in full precision
  virtual bool holds_kv_scales() const = 0;

  // ---- writing (`prefix`: module name without a trailing dot)
  virtual void add_linear(SafetensorsWriter& w, const std::string& prefix, const QuantizedTensor& q,
                          const ActQuantParams* act) const = 0;
  // Calibrated FP8 KV-cache scales (amax / 448) of layer `layer`, stored as the format stores them.
  virtual void add_kv_scales(SafetensorsWriter& w, int64_t layer, const KvScales& calibrated, DType model_dtype) const = 0;
  // Sets config["quantization_config"] and writes the format's own files
  // (quantize_config.json, hf_quant_config.json) into `folder`.
  virtual void write_config(const ExportConfig& c, nlohmann::ordered_json& config,
                            const std::filesystem::path& folder) const = 0;

  // ---- reading
  // Validates a checkpoint's quantization_config (and the format's own files
  // in `dir`) for the runtime: Unsupported naming `config_file` for what it
  // cannot run.
  virtual OpenedConfig open(const std::filesystem::path& dir, const nlohmann::json& qcfg,
                            const std::string& config_file) const = 0;
  // The Linear `prefix` read back, or nullopt when it is stored unquantized.
  virtual std::optional<ReadLinear> read_linear(const Checkpoint& ck, const std::string& prefix,
                                                const nlohmann::json& qcfg) const = 0;
  virtual KvScales read_kv_scales(const Checkpoint& ck, int64_t layer) const = 0;
  // One line for `inspect`, e.g. "gptq (gptq): int4 sym g128, desc_act".
  virtual std::string describe(const nlohmann::json& qcfg) const = 0;
};

// The format a checkpoint's quantization_config names (its quant_method),
// opened on the checkpoint folder `dir` for reading (CheckpointFormat::open).
// Unsupported naming `config_file` for a method the runtime does not read.
const CheckpointFormat& open_checkpoint_format(const std::filesystem::path& dir, const nlohmann::json& qcfg,
                                               const std::string& config_file, OpenedConfig* opened);

// For formats that hold integer weight-only schemes (GPTQ, AutoAWQ): Unsupported
// naming c.where for input activations, float or NF4/FP4 weights.
void require_integer_weight_only(const LinearCheck& c, const std::string& format);

// The registry. checkpoint_format: "" is the default (compressed-tensors);
// InvalidInput naming `where` for an unknown name (with the closest known one).
const CheckpointFormat& checkpoint_format(const std::string& name, const std::string& where);
const CheckpointFormat* find_checkpoint_format(const std::string& name);  // exact name; nullptr when unknown
const std::vector<const CheckpointFormat*>& checkpoint_formats();
std::string checkpoint_format_names();  // "compressed-tensors, gptq, awq, modelopt, bitsandbytes"

}  // namespace qf
