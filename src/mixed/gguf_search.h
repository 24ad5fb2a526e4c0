// GGUF mixed precision to a size budget (`convert --to gguf --target-bpw B`
// or `--target-size S`): every quantizable tensor's ggml type is chosen so
// that the file's tensor data fits the budget and the predicted KL
// divergence from the original model is as small as possible.
//
// The model (docs/mixed-precision.md): the KL divergence of a mix is the sum
// of the KL divergences each tensor causes when it alone is quantized, and a
// tensor's KL divergence at type T is a power law of its importance-weighted
// quantization error e(T) = sum over rows and columns of imatrix_j (w - q)^2:
//   KL(t, T) = c_t * e_t(T)^p_t.
// c_t and p_t come from two probes per tensor, the runtime's measured KL with
// only that tensor quantized, at the menu's lowest type and at the type
// nearest 4.5 bits per weight (on large models, a sample of the layers; the
// rest interpolated, see max_probes). The errors of every (tensor, type) pair are
// computed on a sample of rows (scaled to the tensor). The allocation is the
// exact multiple-choice knapsack (quantizers/mix_knapsack.h) over the padded
// tensor bytes; the Lagrangian shortcut's answer is reported beside it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "convert/hf_to_gguf.h"
#include "core/thread_pool.h"
#include "formats/gguf/imatrix.h"

namespace qf::mixed {

struct GgufMixOptions {
  std::optional<double> target_bpw;      // bits per parameter over every tensor of the file
  std::optional<uint64_t> target_bytes;  // bytes of tensor data (each tensor padded to the file's alignment)
  std::vector<uint32_t> types;           // the menu; empty: default_gguf_menu()
  std::filesystem::path imatrix;         // read when given, else computed from calib_text
  std::filesystem::path calib_text;      // required: the probes' text (and the imatrix's when none is given)
  int64_t ctx = 512;                     // tokens per probe span and imatrix chunk
  int64_t probe_spans = 4;               // spans of calib_text the probes score
  // Tensors probed at most (token_embd and output always are): beyond it, a
  // few layers per role (attn_q, ffn_down, ...) evenly spread, first and last
  // included, and the others' fits interpolated in log scale between the
  // nearest probed layers of their role. 0: every tensor.
  int64_t max_probes = 64;
  int64_t imatrix_chunks = 100;          // chunks the imatrix is computed on (when computed)
  int64_t max_sample_rows = 1024;        // rows per slab the errors are computed on
  std::vector<LoraSpec> loras;           // adapters merged into the model first (checkpoint/lora_merge.h)
  std::function<void(const std::string&)> note;
  std::function<void(const std::string&, int64_t, int64_t)> progress;  // (phase, done, total)
};

// F16 BF16 Q8_0 Q6_K Q5_K Q5_1 Q5_0 Q4_K Q4_1 Q4_0 Q3_K Q2_K.
const std::vector<uint32_t>& default_gguf_menu();
// "q4_K,q6_K,Q8_0" (commas or spaces; names as llama-quantize takes them).
std::vector<uint32_t> parse_gguf_menu(const std::string& list, const std::string& flag);

struct GgufCandidate {
  uint32_t type = 0;
  uint64_t bytes = 0;        // padded
  double error = 0;          // importance-weighted squared error (whole tensor)
  double predicted_kl = 0;
};

struct GgufMixTensor {
  std::string name;
  uint64_t parameters = 0;
  bool searched = false;     // false: a tensor llama.cpp never quantizes (one candidate: its type)
  std::vector<GgufCandidate> candidates;  // the menu, row-length fallbacks applied, deduplicated
  double scale = 0, power = 1;            // KL = scale * error^power
  struct Probe {
    uint32_t type = 0;
    double error = 0, measured_kl = 0;
  };
  std::vector<Probe> probes;  // empty: the fit was interpolated from its role's probed layers
  int chosen = 0;            // index into candidates
  int lagrangian = 0;        // the Lagrangian shortcut's choice
};

struct GgufMixPoint {
  std::string name;          // preset name, or "" for a searched mix
  uint64_t bytes = 0;        // tensor data bytes
  double predicted_kl = 0;
};

struct GgufMixPlan {
  std::string model;
  std::vector<GgufMixTensor> tensors;  // llama.cpp's processing order
  uint64_t parameters = 0;             // every tensor's elements
  uint64_t fixed_extra_bytes = 0;      // tensor data the converter adds (rope_freqs of llama3 scaling)
  uint64_t budget_bytes = 0;           // tensor data bytes allowed
  uint64_t bytes = 0;                  // tensor data bytes of the allocation
  double predicted_kl = 0;
  bool exact = true;
  uint64_t unit = 1;
  uint64_t lagrangian_bytes = 0;
  double lagrangian_kl = 0;
  std::vector<GgufMixPoint> presets;   // llama.cpp's presets under the same model
  std::vector<GgufMixPoint> curve;     // the exact optimum at budgets across the range
  std::string imatrix;                 // the imatrix file used, or "computed from TEXT"
  std::shared_ptr<const Imatrix> imatrix_data;  // the imatrix itself: the conversion quantizes with it
  int64_t probe_tokens = 0;
  double probe_fit_rank_correlation = 0;  // every probe: predicted vs measured KL
  double seconds_imatrix = 0, seconds_errors = 0, seconds_probes = 0, seconds_solve = 0;

  double bits_per_weight() const { return parameters ? 8.0 * static_cast<double>(bytes) / static_cast<double>(parameters) : 0; }
  // GGUF name -> chosen type, for the quantizable tensors.
  std::map<std::string, uint32_t> types() const;
  // The preset whose base type holds most of the quantized parameters (what
  // general.file_type says of the mix).
  std::string file_type_preset() const;
};

// InvalidInput / Usage for a missing target or text, a budget below the
// smallest possible file, a menu without a type some tensor can take.
GgufMixPlan plan_gguf_mix(const std::filesystem::path& model_dir, const GgufMixOptions& opts, ThreadPool& pool);

// A previous plan of the same model (its JSON, `--sensitivity FILE`) solved
// again for another budget: the measured sensitivities are reused, nothing is
// measured. InvalidInput naming `where` when the JSON is not such a plan or
// its tensors are not the model's (names, parameter counts).
// The imatrix the weights are then quantized with: opts.imatrix, else the
// plan's imatrix file, else one computed again from opts.calib_text (Usage
// error when the plan's was computed and neither is given).
GgufMixPlan replan_gguf_mix(const nlohmann::json& previous, const std::string& where,
                            const std::filesystem::path& model_dir, const GgufMixOptions& opts, ThreadPool& pool);

// What `convert --to gguf` with a size budget runs, for the CLI and the
// Python module alike: plan_gguf_mix, or with `sensitivity` (an earlier
// plan's JSON file) replan_gguf_mix (Usage when opts.types is given then).
GgufMixPlan plan_for_budget(const std::filesystem::path& model_dir, const GgufMixOptions& opts,
                            const std::filesystem::path& sensitivity, ThreadPool& pool);

// The plan as the conversion takes it: the per-tensor types, the imatrix
// (named in the file's metadata when `g` names none) and general.file_type.
void apply_plan(const GgufMixPlan& plan, GgufConvertOptions& g);

nlohmann::ordered_json gguf_mix_json(const GgufMixPlan& plan);
// The plan as `convert --dry-run` prints it: a line per tensor, the totals,
// the presets and the Lagrangian answer.
std::string format_gguf_mix(const GgufMixPlan& plan);

}  // namespace qf::mixed
