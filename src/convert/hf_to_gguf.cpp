#include "convert/hf_to_gguf.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <regex>

#include "checkpoint/lora_merge.h"
#include "convert/gguf_mmproj.h"
#include "core/error.h"
#include "core/progress.h"
#include "formats/gguf/gguf.h"
#include "formats/gguf/gguf_writer.h"
#include "formats/gguf/imatrix.h"
#include "formats/hf/model_config.h"
#include "formats/hf/model_tensors.h"
#include "formats/safetensors.h"
#include "formats/tokenizer/tokenizer.h"
#include "quantizers/gguf_mix.h"
#include "quantizers/kquants.h"

namespace qf {

std::string gguf_arch(const ModelConfig& c, const std::string& where) {
  if (c.vlm && (c.vlm->model_type == "qwen2_vl" || c.vlm->model_type == "qwen2_5_vl")) return "qwen2vl";
  // llama.cpp runs Mixtral as llama with experts.
  if (c.model_type == "llama" || c.model_type == "mistral" || c.model_type == "mixtral") return "llama";
  if (c.model_type == "qwen2") return "qwen2";
  if (c.model_type == "qwen3") return "qwen3";
  if (c.model_type == "qwen2_moe") return "qwen2moe";
  if (c.model_type == "qwen3_moe") return "qwen3moe";
  throw unsupported(where, "model_type '" + c.model_type +
                               "' cannot be converted to GGUF (llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe)");
}

int64_t permuted_qk_source(int64_t r, int64_t heads, int64_t rows) {
  if (heads <= 0) return r;
  const int64_t hd = rows / heads, half = hd / 2, h = r / hd, k = r % hd;
  return h * hd + (k % 2) * half + k / 2;
}

int64_t permuted_qk_heads(const ModelConfig& c, const std::string& arch, const std::string& gguf_name) {
  if (arch != "llama") return 0;
  if (gguf_name.find(".attn_q.") != std::string::npos) return c.num_attention_heads;
  if (gguf_name.find(".attn_k.") != std::string::npos) return c.num_key_value_heads;
  return 0;
}

namespace {

// The first non-finite value of rows [r0, r1) of the decoded tensor, as a flat
// index, or -1.
int64_t first_nonfinite(const float* f, int64_t r0, int64_t r1, int64_t cols) {
  for (int64_t i = r0 * cols; i < r1 * cols; ++i)
    if (!std::isfinite(f[i])) return i;
  return -1;
}

}  // namespace

std::string gguf_tensor_name(const std::string& n) {
  static const std::map<std::string, std::string> top = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"},
  };
  if (auto it = top.find(n); it != top.end()) return it->second;
  static const std::regex layer(R"(^model\.layers\.(\d+)\.(.+)$)");
  std::smatch m;
  if (!std::regex_match(n, m, layer)) return "";
  static const std::map<std::string, std::string> part = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.bias", "attn_output.bias"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      {"mlp.gate_proj.bias", "ffn_gate.bias"},
      {"mlp.up_proj.bias", "ffn_up.bias"},
      {"mlp.down_proj.bias", "ffn_down.bias"},
      {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
      {"mlp.gate.weight", "ffn_gate_inp.weight"},
      {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
      {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
      {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
      {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
  };
  auto it = part.find(m[2].str());
  if (it == part.end()) return "";
  return "blk." + m[1].str() + "." + it->second;
}

GgufExpertSlab gguf_expert_slab(const std::string& n) {
  static const std::regex expert(
      R"(^model\.layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$)");
  std::smatch m;
  if (!std::regex_match(n, m, expert) || m[2].str().size() > 9) return {};
  const std::string part = m[3].str();
  const char* g = part == "w1" || part == "gate_proj" ? "ffn_gate_exps" : part == "w3" || part == "up_proj" ? "ffn_up_exps" : "ffn_down_exps";
  return {"blk." + m[1].str() + "." + g + ".weight", std::stoll(m[2].str())};
}

GgufLayout gguf_layout(const ModelConfig& c, const Checkpoint& ck, const std::string& where) {
  // Which HF tensors become which GGUF tensor: one each, except the routed
  // experts' matrices of a layer, stacked in expert order into one 3-D tensor
  // (ne = [cols, rows, experts]) as llama.cpp holds them.
  GgufLayout l;
  auto& hf_of = l.hf_of;
  auto& ne_of = l.ne_of;
  auto& descs = l.descs;
  for (const std::string& name : ck.names()) {
    if (name.find("rotary_emb.inv_freq") != std::string::npos) continue;
    if (c.vlm && is_vision_tensor(name)) continue;  // the mmproj's (convert/gguf_mmproj.h)
    if (name == "lm_head.weight" && c.tie_word_embeddings) continue;
    const GgufExpertSlab slab = gguf_expert_slab(name);
    const std::string g = slab.name.empty() ? gguf_tensor_name(name) : slab.name;
    if (g.empty()) throw unsupported(where, "tensor '" + name + "' has no GGUF counterpart");
    const TensorInfo& ti = ck.info(name);
    if (!dtype_is_float(ti.dtype)) throw unsupported(where, "tensor '" + name + "' is " + dtype_name(ti.dtype) + ", not a float type");
    std::vector<uint64_t> ne(ti.shape.rbegin(), ti.shape.rend());
    if (slab.name.empty()) {
      hf_of[g] = {name};
      ne_of[g] = ne;
      continue;
    }
    if (ti.shape.size() != 2 || slab.expert >= c.num_experts)
      throw invalid_input(where, "tensor '" + name + "': expected a 2-D matrix of one of the " + std::to_string(c.num_experts) +
                                     " experts");
    std::vector<std::string>& srcs = hf_of[g];
    srcs.resize(static_cast<size_t>(c.num_experts));
    srcs[static_cast<size_t>(slab.expert)] = name;
    ne.push_back(static_cast<uint64_t>(c.num_experts));
    if (ne_of.count(g) && ne_of[g] != ne)
      throw invalid_input(where, "tensor '" + name + "' has another shape than the other experts' " + g.substr(g.rfind('.', g.size() - 8) + 1));
    ne_of[g] = ne;
  }
  for (const auto& [g, srcs] : hf_of) {
    for (size_t e = 0; e < srcs.size(); ++e)
      if (srcs[e].empty())
        throw not_found(where, "expert " + std::to_string(e) + "'s matrix for " + g + " is missing (the config has " +
                                   std::to_string(c.num_experts) + " experts)");
    descs.push_back({g, std::vector<int64_t>(ne_of[g].begin(), ne_of[g].end())});
  }
  return l;
}

GgufConvertResult convert_hf_to_gguf(const std::filesystem::path& dir, const std::filesystem::path& out,
                                     const GgufConvertOptions& opts, ThreadPool& pool) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string where = dir.string();
  ModelConfig c = load_model_config(dir);
  if (c.quantization_config) throw unsupported(where, "the checkpoint is already quantized (config.json has a quantization_config)");
  for (int64_t li = 0; li < c.num_hidden_layers && c.is_moe(); ++li)
    if (!c.moe_layer(li))
      throw unsupported(where, "layer " + std::to_string(li) + " is dense (mlp_only_layers / decoder_sparse_step) in a mixture-of-experts "
                               "model; llama.cpp's " + c.model_type + " architecture has sparse layers only");
  const std::string arch = gguf_arch(c, where);
  // A vision-language model's encoder goes to an mmproj file beside the
  // language model's, unless no_mmproj; a text model has none.
  const bool with_mmproj = c.vlm && !opts.no_mmproj;
  if (!c.vlm && (opts.no_mmproj || !opts.mmproj.empty()))
    throw invalid_input(where, "is a text model (model_type '" + c.model_type + "'); an mmproj file (--mmproj, --no-mmproj) "
                               "belongs to vision-language models (qwen2_vl, llava, llava_next)");
  if (c.vlm && opts.no_mmproj && !opts.mmproj.empty())
    throw invalid_input(where, "--mmproj names a file that --no-mmproj says not to write");
  if (with_mmproj && c.vlm->model_type == "qwen2_5_vl")
    throw unsupported(where, "llama.cpp b4748 has no Qwen2.5-VL vision encoder for an mmproj file; convert the language model "
                             "alone with --no-mmproj");
  const std::filesystem::path mmproj_path = !with_mmproj ? std::filesystem::path() : opts.mmproj.empty() ? default_mmproj_path(out) : opts.mmproj;
  std::error_code ec1, ec2;
  if (with_mmproj && std::filesystem::weakly_canonical(mmproj_path, ec1) == std::filesystem::weakly_canonical(out, ec2) && !ec1 && !ec2)
    throw invalid_input(mmproj_path.string(), "the mmproj file and the language model's file must differ");
  // llama.cpp renormalises the top-k routing weights for llama (Mixtral) and
  // qwen3moe and never for qwen2moe; the file has no key to say otherwise.
  if (c.is_moe() && c.norm_topk_prob != (arch != "qwen2moe"))
    throw unsupported(where, std::string("norm_topk_prob ") + (c.norm_topk_prob ? "true" : "false") + " cannot be expressed in " +
                                 "llama.cpp's " + arch + " architecture, which " + (arch == "qwen2moe" ? "never renormalises" : "always renormalises") +
                                 " the top-k routing weights");
  const gguf_mix::Preset& preset = gguf_mix::parse_preset(opts.preset);
  std::unique_ptr<Tokenizer> tok = load_tokenizer(dir);
  Checkpoint ck = open_checkpoint_with_loras(dir, opts.loras);
  // The runtime loader's own checks of the tensors against the config, before
  // anything is written: a file its runtime would refuse is never produced.
  check_hf_checkpoint(c, ck, true, where, (dir / "config.json").string());
  // The folder's name; for a Hugging Face cache snapshot (models--ORG--NAME/
  // snapshots/COMMIT) the repo's NAME rather than the commit hash.
  const std::filesystem::path folder = dir.filename().empty() ? dir.parent_path() : dir;
  std::string name = folder.filename().string();
  const std::string repo = folder.parent_path().parent_path().filename().string();
  if (folder.parent_path().filename() == "snapshots" && repo.rfind("models--", 0) == 0 && repo.rfind("--") > 7)
    name = repo.substr(repo.rfind("--") + 2);
  MmprojSpec mmproj;
  if (with_mmproj) mmproj = plan_mmproj(c, ck, dir, name);
  Imatrix imatrix;
  const bool has_imatrix = !opts.imatrix.empty() || opts.imatrix_data;
  if (opts.imatrix_data) imatrix = *opts.imatrix_data;
  else if (has_imatrix) imatrix = read_imatrix(opts.imatrix);

  const GgufLayout layout = gguf_layout(c, ck, where);
  const std::map<std::string, std::vector<std::string>>& hf_of = layout.hf_of;
  const std::map<std::string, std::vector<uint64_t>>& ne_of = layout.ne_of;
  const std::vector<gguf_mix::TensorDesc>& descs = layout.descs;
  gguf_mix::ModelDesc md{arch, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.num_experts};
  const std::vector<gguf_mix::TensorPlan> plans = gguf_mix::plan(preset, md, descs, has_imatrix, opts.overrides);

  // The mmproj is streamed first, under a temporary name: a folder it cannot
  // be written to fails before the language model's file is begun. Both are
  // renamed into place at the end.
  std::unique_ptr<GgufWriter> mmproj_writer;
  if (with_mmproj) mmproj_writer = write_mmproj(mmproj, ck, mmproj_path, opts.allow_nonfinite, where);
  GgufWriter w(out);
  w.add_string("general.architecture", arch);
  w.add_string("general.name", name);
  auto key = [&](const std::string& k) { return arch + "." + k; };
  w.add_u32(key("block_count"), static_cast<uint32_t>(c.num_hidden_layers));
  w.add_u32(key("context_length"), static_cast<uint32_t>(c.max_position_embeddings));
  w.add_u32(key("embedding_length"), static_cast<uint32_t>(c.hidden_size));
  w.add_u32(key("feed_forward_length"), static_cast<uint32_t>(c.intermediate_size));
  w.add_u32(key("attention.head_count"), static_cast<uint32_t>(c.num_attention_heads));
  w.add_u32(key("attention.head_count_kv"), static_cast<uint32_t>(c.num_key_value_heads));
  w.add_f32(key("rope.freq_base"), static_cast<float>(c.rope_theta));
  w.add_f32(key("attention.layer_norm_rms_epsilon"), static_cast<float>(c.rms_norm_eps));
  if (c.is_moe()) {
    w.add_u32(key("expert_count"), static_cast<uint32_t>(c.num_experts));
    w.add_u32(key("expert_used_count"), static_cast<uint32_t>(c.num_experts_per_tok));
    if (arch != "llama") w.add_u32(key("expert_feed_forward_length"), static_cast<uint32_t>(c.moe_intermediate_size));
    if (c.shared_expert_intermediate_size > 0)
      w.add_u32(key("expert_shared_feed_forward_length"), static_cast<uint32_t>(c.shared_expert_intermediate_size));
  }
  if (c.head_dim != c.hidden_size / c.num_attention_heads || arch == "qwen3" || arch == "qwen3moe") {
    w.add_u32(key("attention.key_length"), static_cast<uint32_t>(c.head_dim));
    w.add_u32(key("attention.value_length"), static_cast<uint32_t>(c.head_dim));
  }
  if (arch == "llama") {
    w.add_u32(key("vocab_size"), static_cast<uint32_t>(c.vocab_size));
    w.add_u32(key("rope.dimension_count"), static_cast<uint32_t>(c.head_dim));
  }
  if (arch == "qwen2vl") {
    // The rotary frequencies of the temporal, height and width positions,
    // padded to llama.cpp's four sections; for text all positions are equal
    // and the rotation is NEOX RoPE.
    std::vector<int32_t> sections(c.vlm->mrope_section.begin(), c.vlm->mrope_section.end());
    sections.resize(4, 0);
    w.add_i32_array(key("rope.dimension_sections"), sections);
  }
  std::vector<float> rope_freqs;
  if (c.rope_scaling && c.rope_scaling->type != "default") {
    const RopeScaling& s = *c.rope_scaling;
    if (s.type == "linear") {
      w.add_string(key("rope.scaling.type"), "linear");
      w.add_f32(key("rope.scaling.factor"), static_cast<float>(s.factor));
    } else if (s.type == "llama3") {
      // llama.cpp stores llama3 scaling as per-frequency divisors (rope_freqs.weight).
      const double base = c.rope_theta, old_ctx = static_cast<double>(*s.original_max_position_embeddings);
      const double lo = *s.low_freq_factor, hi = *s.high_freq_factor;
      for (int64_t i = 0; i < c.head_dim; i += 2) {
        const double freq = 1.0 / std::pow(base, static_cast<double>(i) / static_cast<double>(c.head_dim));
        const double wavelen = 2.0 * M_PI / freq;
        double f;
        if (wavelen < old_ctx / hi) f = 1.0;
        else if (wavelen > old_ctx / lo) f = s.factor;
        else {
          const double smooth = (old_ctx / wavelen - lo) / (hi - lo);
          f = 1.0 / ((1.0 - smooth) / s.factor + smooth);
        }
        rope_freqs.push_back(static_cast<float>(f));
      }
    } else {
      throw unsupported(where, "rope_scaling type '" + s.type + "' cannot be converted to GGUF");
    }
  }
  w.add_u32("general.quantization_version", 2);
  w.add_u32("general.file_type", preset.ftype);
  if (has_imatrix) {
    w.add_string("quantize.imatrix.file", opts.imatrix.string());
    if (!imatrix.datasets.empty()) w.add_string("quantize.imatrix.dataset", imatrix.datasets.front());
    w.add_i32("quantize.imatrix.entries_count", static_cast<int32_t>(imatrix.entries.size()));
    w.add_i32("quantize.imatrix.chunks_count", static_cast<int32_t>(imatrix.chunk_count));
  }
  write_tokenizer_metadata(w, tok->vocab());

  GgufConvertResult res;
  if (!rope_freqs.empty()) w.declare_tensor("rope_freqs.weight", ggml_type::F32, {rope_freqs.size()});
  for (const auto& p : plans) {
    w.declare_tensor(p.name, p.type, ne_of.at(p.name));
    if (!p.note.empty() && opts.note) opts.note(p.note);
  }
  if (!rope_freqs.empty()) w.write_tensor_data("rope_freqs.weight", rope_freqs.data(), rope_freqs.size() * 4);

  Progress progress("convert", plans.size(), "tensors");
  // One f32 buffer for the largest tensor and one output buffer, reused: a
  // fresh allocation per tensor would pay its page faults again every time.
  size_t max_numel = 0;
  for (const auto& p : plans) {
    size_t n = 1;
    for (uint64_t d : ne_of.at(p.name)) n *= static_cast<size_t>(d);
    max_numel = std::max(max_numel, n);
  }
  std::unique_ptr<float[]> f(new float[std::max<size_t>(1, max_numel)]);
  std::vector<uint8_t> buf;
  for (const auto& p : plans) {
    const std::vector<std::string>& hf_names = hf_of.at(p.name);
    std::vector<Tensor> ts;  // one, or each expert's slab of a stacked tensor
    for (const std::string& n : hf_names) ts.push_back(ck.tensor(n));
    const Tensor& t = ts.front();
    const int64_t cols = t.ndim() == 1 ? t.dim(0) : t.dim(-1);
    const int64_t slab_rows = t.numel() / std::max<int64_t>(1, cols);
    const int64_t rows = slab_rows * static_cast<int64_t>(ts.size());
    for (const Tensor& x : ts) {
      res.input_bytes += x.nbytes();
      if (x.ndim() == 2) res.parameters += static_cast<uint64_t>(x.numel());
    }
    // llama's q and k rows (bias elements) are reordered per head as they are
    // decoded; a 1-D tensor is decoded as numel rows of one element for that.
    const int64_t heads = permuted_qk_heads(c, arch, p.name);
    const int64_t drows = t.ndim() == 1 && heads ? t.numel() : rows, dcols = t.ndim() == 1 && heads ? 1 : cols;
    std::vector<float> importance;
    if (has_imatrix && p.quantized) {
      importance = imatrix.importance(p.name);
      if (importance.empty()) {
        if (opts.note) opts.note(p.name + ": no importance data in " + opts.imatrix.string() + "; quantized without it");
      } else if (static_cast<int64_t>(importance.size()) != cols * static_cast<int64_t>(ts.size())) {
        // A stacked expert tensor takes one row of importance per expert.
        throw invalid_input(opts.imatrix.string(), "entry '" + p.name + "' has " + std::to_string(importance.size()) +
                                                       " values but the tensor's rows have " + std::to_string(cols) +
                                                       (ts.size() > 1 ? " for each of " + std::to_string(ts.size()) + " experts" : ""));
      }
    }
    const bool quantize = p.type != ggml_type::F32;
    const size_t row_bytes = quantize ? kquants::row_size(p.type, cols) : static_cast<size_t>(cols) * 4;
    if (quantize) buf.resize(row_bytes * static_cast<size_t>(rows));
    const float* imp = importance.empty() ? nullptr : importance.data();
    const size_t in_row_bytes = static_cast<size_t>(dcols) * dtype_size(t.dtype());
    const auto* src = static_cast<const uint8_t*>(t.data());
    // Row r of the (stacked) tensor: row r % slab_rows of slab r / slab_rows.
    const auto row_src = [&](int64_t r) {
      return static_cast<const uint8_t*>(ts[static_cast<size_t>(r / slab_rows)].data()) +
             static_cast<size_t>(r % slab_rows) * in_row_bytes;
    };
    // Decode, check and quantize a chunk of rows at a time, all on the pool:
    // the rows are still in cache when they are quantized.
    int64_t grain = std::max<int64_t>(1, std::min<int64_t>(rows, 32 * 512 / std::max<int64_t>(1, cols)));
    if (ts.size() > 1)  // chunks within one expert's slab (each has its own importance row)
      while (slab_rows % grain != 0) --grain;
    const auto chunks = partition(rows, grain);
    std::vector<int64_t> bad(chunks.size(), -1);
    if (dcols != cols)  // a permuted 1-D tensor
      for (int64_t r = 0; r < drows; ++r)
        convert(src + static_cast<size_t>(permuted_qk_source(r, heads, drows)) * in_row_bytes, t.dtype(), f.get() + r,
                DType::F32, 1);
    pool.parallel_for(rows, grain, [&](const Chunk& ch) {
      if (dcols == cols)
        for (int64_t r = ch.begin; r < ch.end; ++r)
          convert(heads ? src + static_cast<size_t>(permuted_qk_source(r, heads, rows)) * in_row_bytes : row_src(r), t.dtype(),
                  f.get() + r * cols, DType::F32, static_cast<size_t>(cols));
      if (!opts.allow_nonfinite) bad[static_cast<size_t>(ch.index)] = first_nonfinite(f.get(), ch.begin, ch.end, cols);
      if (quantize)
        kquants::quantize_rows(p.type, f.get() + ch.begin * cols, buf.data() + static_cast<size_t>(ch.begin) * row_bytes,
                               ch.end - ch.begin, cols, imp ? imp + (ch.begin / slab_rows) * cols : nullptr);
    });
    for (const int64_t i : bad) {
      if (i < 0) continue;
      const int64_t r = i / cols, c0 = i % cols;
      const int64_t at = dcols == cols ? permuted_qk_source(r % slab_rows, heads, slab_rows) * cols + c0 : permuted_qk_source(i, heads, drows);
      const std::string& hf = hf_names[static_cast<size_t>(r / slab_rows)];
      throw invalid_input(dir.string(), hf + " [" + std::to_string(at / cols) + ", " + std::to_string(at % cols) + "] is " + (std::isnan(f[i]) ? "nan" : "infinite") +
                                            "; a model with non-finite weights converts to a meaningless file (--allow-nonfinite overrides)");
    }
    if (quantize)
      w.write_tensor_data(p.name, buf.data(), buf.size());
    else
      w.write_tensor_data(p.name, f.get(), static_cast<size_t>(rows * cols) * 4);
    res.types.emplace_back(p.name, p.type);
    progress.add();
  }
  progress.finish();
  if (mmproj_writer) {
    res.mmproj_path = mmproj_writer->finish();
    res.mmproj_bytes = std::filesystem::file_size(res.mmproj_path);
  }
  try {
    res.path = w.finish();
  } catch (...) {
    // Both files or neither.
    std::error_code ec;
    if (!res.mmproj_path.empty()) std::filesystem::remove(res.mmproj_path, ec);
    throw;
  }
  res.output_bytes = std::filesystem::file_size(res.path);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace qf
