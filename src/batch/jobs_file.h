// The jobs file of `quantforge batch`: which models, which targets, which
// gates. Its cross product (models x targets, narrowed per model) is the job
// list (batch_plan.h).
//
//   output: out                    # default output folder (-o overrides)
//   reserve_disk: 2G               # keep this much free beside each job's estimate
//   models:
//     - path: ../fixture-llama     # a local folder (relative to this file)
//       name: fixture              # its output subfolder (default: the folder name)
//     - hf: TinyLlama/TinyLlama-1.1B-Chat-v1.0   # a Hugging Face cache id
//       revision: main
//       targets: [Q4_K_M]          # only these targets (by name) ...
//       exclude: [fp8]             # ... or all but these
//       calib: data/chat.jsonl     # calibration for this model's recipes
//       eval: {max_kld: 0.1}       # merged over the file's eval
//     - glob: "Qwen/Qwen2.5-*"     # every matching repo of the cache
//   targets:
//     - gguf: Q4_K_M               # a GGUF preset
//       imatrix: {text: calib.txt, chunks: 64}   # or the path of an imatrix file
//     - recipe: recipes/w4a16-gptq.yaml         # a quantize recipe
//       name: w4a16                # default: the preset, or the recipe's file stem
//       eval: false                # no gate for this target
//   eval:                          # the gate applied to every output
//     text: eval.txt
//     chunks: 8                    # 0: all
//     max_ppl_ratio: 1.05
//     max_kld: 0.05
//
// Every problem is one InvalidInput (NotFound for missing files) starting
// "FILE:LINE:COL: ", like recipes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace qf::batch {

struct EvalSpec {
  std::filesystem::path text;
  int64_t chunks = 0;
  int64_t ctx = 0;  // 0: the perplexity mode's default
  std::optional<double> max_ppl_ratio, max_ppl_delta, max_kld;
};

// An imatrix computed from a text (or read from a file) for GGUF targets.
struct ImatrixSpec {
  std::filesystem::path file;   // given file, or empty
  std::filesystem::path text;   // compute from this text
  int64_t chunks = 0;           // 0: all of the text
  int64_t ctx = 512;
};

struct TargetSpec {
  enum class Kind { Gguf, Recipe } kind = Kind::Gguf;
  std::string name;
  std::string preset;                  // Gguf
  std::optional<ImatrixSpec> imatrix;  // Gguf
  std::filesystem::path recipe;        // Recipe
  std::filesystem::path calib;         // Recipe: overrides the recipe's calibration
  bool no_eval = false;                // `eval: false`
  std::optional<EvalSpec> eval;        // merged over the file's eval
  std::string where;                   // FILE:LINE:COL
};

struct ModelSpec {
  std::string name;
  std::string arg;       // for resolve_model: a folder or ORG/NAME
  std::string revision;  // "main" unless given
  std::vector<std::string> only, exclude;
  std::filesystem::path calib;
  std::optional<EvalSpec> eval;  // merged over the file's eval
  std::string where;
};

struct JobsFile {
  std::filesystem::path path;
  std::filesystem::path output;  // empty when not given
  uint64_t reserve_disk = 0;
  std::vector<ModelSpec> models;  // globs expanded
  std::vector<TargetSpec> targets;
  std::optional<EvalSpec> eval;
  std::string text;  // as read
};

// Reads and validates: keys, types, names ([A-Za-z0-9._-], unique), presets,
// recipes (parsed: their errors carry their own positions), files that must
// exist, models (resolved now: a missing folder or cache entry is an error at
// its line), globs (one that matches nothing is an error).
JobsFile parse_jobs_file(const std::filesystem::path& path);

}  // namespace qf::batch
