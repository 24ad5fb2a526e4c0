// quantforge convert INPUT --to hf --tokenizer FILE -o OUT      (llama2.c checkpoint -> Hugging Face folder)
// quantforge convert MODEL --to gguf --type TYPE [--imatrix F] [--output-tensor-type T]
//                   [--token-embedding-type T] -o OUT.gguf   (Hugging Face -> GGUF)
// quantforge convert MODEL --to gguf (--target-bpw B | --target-size S) --calib TEXT [--imatrix F]
//                   [--types LIST] [--dry-run] [--json F] -o OUT.gguf   (mixed precision to a size budget)
// quantforge convert ADAPTER --to gguf-lora --base MODEL [--type F16|BF16|F32] -o A.gguf
//                   (PEFT LoRA adapter -> llama.cpp's LoRA adapter GGUF)
// --lora DIR[:SCALE] (repeatable) merges adapters into MODEL before --to gguf.
// A vision-language MODEL (qwen2_vl, llava, llava_next) also writes its vision
// encoder as llama.cpp's mmproj GGUF: beside OUT as mmproj-<OUT's name>, at
// --mmproj PATH, or not at all with --no-mmproj (qwen2_5_vl needs it).
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>

#include "commands.h"
#include "flags.h"
#include "core/io.h"
#include "core/error.h"
#include "core/progress.h"
#include "convert/gguf_lora.h"
#include "convert/gguf_mmproj.h"
#include "convert/hf_to_gguf.h"
#include "formats/hf/model_config.h"
#include "formats/hf/resolve.h"
#include "formats/llama2c/llama2c_model.h"
#include "calibration/activation_store.h"
#include "mixed/gguf_search.h"

namespace qf::cli {
namespace {

struct ConvertOpts {
  std::string input, to, tokenizer, out, type = "F16", imatrix, output_type, token_embd_type;
  int threads = 0;
  bool force = false, allow_nonfinite = false;
  // Whether the type flags were given at all: an empty value is an error, not "no override".
  bool output_type_given = false, token_embd_type_given = false;
  // Mixed precision to a size budget.
  std::optional<double> target_bpw;
  std::string target_size, types, calib, json, sensitivity;
  int64_t probe_spans = 4, max_probes = 64;
  bool dry_run = false, type_given = false;
  LoraFlags lora;
  std::string base;  // --to gguf-lora: the adapter's base model
  std::string mmproj;  // --to gguf of a vision-language model: where its mmproj goes
  bool no_mmproj = false;
};

// --mmproj / --no-mmproj against the model: the mmproj path to check and
// write (empty: none). Usage errors for a text model; qwen2_5_vl without
// --no-mmproj is refused here, before any work.
std::filesystem::path mmproj_output(const ConvertOpts& o, const std::filesystem::path& dir) {
  if (!o.mmproj.empty() && o.no_mmproj) throw Error(ErrorKind::Usage, "--mmproj and --no-mmproj exclude each other");
  const ModelConfig c = load_model_config(dir);
  if (!c.vlm) {
    if (!o.mmproj.empty() || o.no_mmproj)
      throw Error(ErrorKind::Usage, std::string(o.no_mmproj ? "--no-mmproj" : "--mmproj") + " applies to vision-language models "
                                    "(qwen2_vl, qwen2_5_vl, llava, llava_next); " + dir.string() + " is a text model (" + c.model_type + ")");
    return {};
  }
  if (o.no_mmproj) return {};
  if (c.vlm->model_type == "qwen2_5_vl")
    throw unsupported(dir.string(), "llama.cpp b4748 has no Qwen2.5-VL vision encoder for an mmproj file; convert the language "
                                    "model alone with --no-mmproj");
  return o.mmproj.empty() ? default_mmproj_path(o.out) : std::filesystem::path(o.mmproj);
}

bool budget_given(const ConvertOpts& o) { return o.target_bpw || !o.target_size.empty(); }
bool budget_flags(const ConvertOpts& o) {
  return budget_given(o) || !o.types.empty() || !o.calib.empty() || o.dry_run || !o.json.empty() || !o.sensitivity.empty();
}

// The allocation for a size budget: printed (--dry-run) and written as JSON
// next to the output (or to --json).
mixed::GgufMixPlan plan_budget(const ConvertOpts& o, const std::filesystem::path& dir,
                               const std::function<void(const std::string&)>& note, ThreadPool& pool) {
  if (o.type_given) throw Error(ErrorKind::Usage, "--type and a size budget (--target-bpw / --target-size) exclude each other");
  if (o.output_type_given || o.token_embd_type_given)
    throw Error(ErrorKind::Usage, "--output-tensor-type and --token-embedding-type do not combine with a size budget (restrict --types instead)");
  mixed::GgufMixOptions m;
  m.target_bpw = o.target_bpw;
  if (!o.target_size.empty()) m.target_bytes = parse_memory_size(o.target_size, "--target-size");
  if (!o.types.empty()) m.types = mixed::parse_gguf_menu(o.types, "--types");
  m.imatrix = o.imatrix;
  m.calib_text = o.calib;
  m.probe_spans = o.probe_spans;
  m.max_probes = o.max_probes;
  m.note = note;
  m.loras = o.lora.specs();
  std::unique_ptr<Progress> bar;
  std::string bar_phase;
  m.progress = [&](const std::string& phase, int64_t done, int64_t total) {
    if (phase != bar_phase) {
      if (bar) bar->finish();
      bar = std::make_unique<Progress>(phase, total, phase == "imatrix" ? "chunks" : "tensors");
      bar_phase = phase;
    }
    bar->set(done);
  };
  mixed::GgufMixPlan plan = mixed::plan_for_budget(dir, m, o.sensitivity, pool);
  if (bar) bar->finish();
  return plan;
}

void run_gguf(const ConvertOpts& o) {
  std::unique_ptr<ThreadPool> holder;
  ThreadPool& pool = pool_for(o.threads, holder);
  if (!o.tokenizer.empty()) throw Error(ErrorKind::Usage, "--tokenizer applies to llama2.c checkpoints; a Hugging Face folder brings its own");
  GgufConvertOptions g;
  g.preset = o.type;
  g.imatrix = o.imatrix;
  g.allow_nonfinite = o.allow_nonfinite;
  g.loras = o.lora.specs();
  // Flags first: a bad value is a usage error whatever the model.
  if (o.output_type_given) g.overrides.output = gguf_mix::parse_tensor_type(o.output_type, "--output-tensor-type");
  if (o.token_embd_type_given)
    g.overrides.token_embd = gguf_mix::parse_tensor_type(o.token_embd_type, "--token-embedding-type");
  const ResolvedModel m = resolve_model(o.input);
  if (!budget_given(o) && budget_flags(o))
    throw Error(ErrorKind::Usage, "--types, --calib, --sensitivity, --dry-run and --json apply to a size budget (--target-bpw or --target-size)");
  if (!o.base.empty()) throw Error(ErrorKind::Usage, "--base applies to --to gguf-lora");
  const std::filesystem::path mmproj = mmproj_output(o, m.dir);
  g.mmproj = o.mmproj;
  g.no_mmproj = o.no_mmproj;
  if (!o.dry_run) check_output_file(o.out, {m.dir, o.imatrix, o.calib, o.sensitivity}, o.force, false, "-o");
  if (!o.dry_run && !mmproj.empty())
    check_output_file(mmproj, {m.dir, o.imatrix, o.calib, o.sensitivity, o.out}, o.force, false,
                      o.mmproj.empty() ? "the mmproj file" : "--mmproj");
  // The plan's JSON: --json, else beside the model a conversion writes (a dry run writes none).
  std::filesystem::path json = o.json;
  if (budget_given(o) && json.empty() && !o.dry_run) json = std::filesystem::path(o.out).replace_extension(".mix.json");
  if (!json.empty()) check_output_file(json, {m.dir, o.imatrix, o.calib, o.out, o.sensitivity}, o.force, false, "--json");
  const bool quiet = Progress::quiet();
  g.note = [quiet](const std::string& s) {
    if (!quiet) std::fprintf(stderr, "note: %s\n", s.c_str());
  };
  if (budget_given(o)) {
    const mixed::GgufMixPlan plan = plan_budget(o, m.dir, g.note, pool);
    if (o.dry_run || !quiet) std::fputs(mixed::format_gguf_mix(plan).c_str(), o.dry_run ? stdout : stderr);
    if (!json.empty()) write_output_file(json, mixed::gguf_mix_json(plan).dump(2) + "\n");
    if (o.dry_run) return;
    mixed::apply_plan(plan, g);
  }
  const GgufConvertResult r = convert_hf_to_gguf(m.dir, o.out, g, pool);
  if (!quiet)
    std::fprintf(stderr, "wrote %s: %.2f MiB (%.2f bits per weight) from %.2f MiB in %.2f s (%.1f MB/s of input)\n",
                 r.path.c_str(), static_cast<double>(r.output_bytes) / 1048576.0,
                 r.parameters ? 8.0 * static_cast<double>(r.output_bytes) / static_cast<double>(r.parameters) : 0.0,
                 static_cast<double>(r.input_bytes) / 1048576.0, r.seconds,
                 static_cast<double>(r.input_bytes) / 1e6 / std::max(r.seconds, 1e-9));
  if (!quiet && !r.mmproj_path.empty())
    std::fprintf(stderr, "wrote %s: the vision encoder and projector (mmproj), %.2f MiB\n", r.mmproj_path.c_str(),
                 static_cast<double>(r.mmproj_bytes) / 1048576.0);
}

void run_gguf_lora(const ConvertOpts& o) {
  if (o.base.empty()) throw Error(ErrorKind::Usage, "--to gguf-lora needs --base MODEL (the Hugging Face model the adapter was trained on)");
  if (!o.lora.adapters.empty()) throw Error(ErrorKind::Usage, "--lora applies to --to gguf; the adapter of --to gguf-lora is the input");
  if (!o.imatrix.empty() || budget_flags(o) || o.output_type_given || o.token_embd_type_given || o.allow_nonfinite ||
      !o.mmproj.empty() || o.no_mmproj)
    throw Error(ErrorKind::Usage, "--to gguf-lora takes --base, --type (F16, BF16 or F32), -o and --force");
  const DType type = parse_gguf_lora_type(o.type, "--type");
  const LoraSpec spec = parse_lora_spec(o.input, "convert");
  const ResolvedModel base = resolve_model(o.base);
  check_output_file(o.out, {spec.path, base.dir}, o.force, false, "-o");
  const GgufLoraResult r = write_gguf_lora(spec, base.dir, o.out, type);
  if (!Progress::quiet())
    std::fprintf(stderr, "wrote %s: %lld tensors, adapter.lora.alpha %g%s, %.2f MiB\n", r.path.c_str(),
                 static_cast<long long>(r.tensors), static_cast<double>(r.alpha),
                 r.rescaled ? (", " + std::to_string(r.rescaled) + " lora_b rescaled to their own scale").c_str() : "",
                 static_cast<double>(r.bytes) / 1048576.0);
}

void run_convert(const ConvertOpts& o) {
  namespace fs = std::filesystem;
  if (o.to == "gguf") return run_gguf(o);
  if (o.to == "gguf-lora") return run_gguf_lora(o);
  if (!o.lora.adapters.empty()) throw Error(ErrorKind::Usage, "--lora applies to --to gguf");
  if (!o.base.empty()) throw Error(ErrorKind::Usage, "--base applies to --to gguf-lora");
  if (!o.imatrix.empty()) throw Error(ErrorKind::Usage, "--imatrix applies to --to gguf");
  if (budget_flags(o))
    throw Error(ErrorKind::Usage, "--target-bpw, --target-size, --types, --calib, --sensitivity, --dry-run and --json apply to --to gguf");
  if (o.allow_nonfinite) throw Error(ErrorKind::Usage, "--allow-nonfinite applies to --to gguf");
  if (!o.mmproj.empty() || o.no_mmproj) throw Error(ErrorKind::Usage, "--mmproj and --no-mmproj apply to --to gguf");
  if (o.output_type_given || o.token_embd_type_given)
    throw Error(ErrorKind::Usage, "--output-tensor-type and --token-embedding-type apply to --to gguf");
  if (o.to != "hf")
    throw Error(ErrorKind::Usage, "--to must be 'hf' (llama2.c checkpoint -> Hugging Face folder), 'gguf' or 'gguf-lora' "
                                  "(PEFT adapter -> llama.cpp adapter), got '" + o.to + "'");
  if (fs::is_directory(o.input))
    throw unsupported(o.input, "is already a folder; --to hf converts llama2.c checkpoints (.bin)");
  if (o.tokenizer.empty())
    throw Error(ErrorKind::Usage, "converting a llama2.c checkpoint needs --tokenizer (its tokenizer .bin, e.g. tok512.bin)");
  convert_llama2c_to_hf(o.input, o.tokenizer, o.out);
  if (!Progress::quiet()) std::fprintf(stderr, "wrote %s\n", o.out.c_str());
}

}  // namespace

void register_convert(CLI::App& app) {
  auto o = std::make_shared<ConvertOpts>();
  CLI::App* cmd = app.add_subcommand("convert", "Convert a model: Hugging Face -> GGUF (with k-quant presets), llama2.c -> Hugging Face");
  cmd->add_option("input", o->input, "the model to convert: a Hugging Face folder or cache id (--to gguf), a llama2.c .bin (--to hf)")->required();
  cmd->add_option("--to", o->to, "target format: gguf, gguf-lora or hf")->required();
  cmd->add_option("--base", o->base, "gguf-lora: the Hugging Face model the adapter was trained on");
  add_lora_options(cmd, o->lora, false);
  CLI::Option* type = cmd->add_option("--type", o->type, "gguf: F32 F16 BF16 Q8_0 Q6_K Q5_K_S Q5_K_M Q4_K_S Q4_K_M Q3_K_S Q3_K_M Q3_K_L Q2_K Q4_0 Q4_1 Q5_0 Q5_1 (default F16)");
  cmd->add_option("--imatrix", o->imatrix, "gguf: importance matrix (.gguf or llama.cpp .dat) weighting the quantization");
  CLI::Option* output_type = cmd->add_option(
      "--output-tensor-type", o->output_type,
      "gguf: type of output.weight (f16, q8_0, q6_K, ...) instead of the preset's, as llama-quantize's option");
  CLI::Option* token_embd_type = cmd->add_option(
      "--token-embedding-type", o->token_embd_type,
      "gguf: type of token_embd.weight instead of the preset's, as llama-quantize's option");
  cmd->add_option("--target-bpw", o->target_bpw, "gguf: choose every tensor's type so the tensors fit B bits per weight, at the least predicted KL divergence (docs/mixed-precision.md)")->check(CLI::PositiveNumber);
  cmd->add_option("--target-size", o->target_size, "gguf: the same for a size of tensor data (4.2GiB, 4200M or bytes; K/M/G/T are powers of 1024)");
  cmd->add_option("--calib", o->calib, "gguf with a budget: text the sensitivity probes (and the imatrix, without --imatrix) run on");
  cmd->add_option("--types", o->types, "gguf with a budget: the types to choose from (default f16,bf16,q8_0,q6_K,q5_K,q5_1,q5_0,q4_K,q4_1,q4_0,q3_K,q2_K)");
  cmd->add_option("--probe-spans", o->probe_spans, "gguf with a budget: 512-token spans of --calib each probe scores (default 4)")->check(CLI::PositiveNumber);
  cmd->add_option("--sensitivity", o->sensitivity, "gguf with a budget: reuse the measurements of an earlier plan of this model (its .mix.json) and solve for this budget only");
  cmd->add_option("--max-probes", o->max_probes, "gguf with a budget: tensors probed at most; beyond it a few layers per role are, the rest interpolated (default 64; 0: all)")->check(CLI::NonNegativeNumber);
  cmd->add_flag("--dry-run", o->dry_run, "gguf with a budget: print the allocation (and write --json if given), write no model");
  cmd->add_option("--json", o->json, "gguf with a budget: where the allocation is written (default: OUT with .mix.json)");
  add_threads_option(cmd, o->threads);
  cmd->add_option("--tokenizer", o->tokenizer, "llama2.c tokenizer file (tok512.bin, tokenizer.bin)");
  cmd->add_option("-o,--output", o->out, "output: a .gguf file (--force to replace one), or a folder for --to hf (must not exist, or be empty)")->required();
  cmd->add_flag("--force", o->force, "gguf: replace an existing output file (never an input of this run)");
  cmd->add_flag("--allow-nonfinite", o->allow_nonfinite, "gguf: convert even when a weight is NaN or infinite");
  cmd->add_option("--mmproj", o->mmproj,
                  "gguf of a vision-language model (qwen2_vl, llava, llava_next): where its vision encoder and projector go, "
                  "as llama.cpp's mmproj GGUF (default: mmproj-<output name> beside the output); always f16/f32");
  cmd->add_flag("--no-mmproj", o->no_mmproj,
                "gguf of a vision-language model: write the language model only (required for qwen2_5_vl, which llama.cpp's "
                "mmproj loader does not support)");
  cmd->callback([o, output_type, token_embd_type, type] {
    o->type_given = type->count() > 0;
    o->output_type_given = output_type->count() > 0;
    o->token_embd_type_given = token_embd_type->count() > 0;
    run_convert(*o);
  });
}

}  // namespace qf::cli
