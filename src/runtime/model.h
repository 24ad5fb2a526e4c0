// The decoder-only Llama family: llama (RoPE default, linear, llama3), mistral
// (sliding window), qwen2 (q/k/v bias), qwen3 (per-head q/k RMSNorm); GQA,
// SwiGLU, tied or untied lm_head. Mixture-of-experts variants: mixtral
// (mistral attention), qwen2_moe (qwen2 attention, a shared expert with a
// sigmoid gate) and qwen3_moe (qwen3 attention), whose sparse layers route
// each token to num_experts_per_tok SwiGLU experts.
//
// A Model is a ModelConfig plus ModelWeights, where every matrix is a Linear:
// loaders (Hugging Face safetensors here; GGUF and the quantized checkpoint
// formats elsewhere) decide which Linear implementation holds each weight.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/io.h"
#include "core/thread_pool.h"
#include "device/device.h"
#include "formats/hf/model_config.h"
#include "formats/hf/model_tensors.h"
#include "runtime/kv_cache.h"
#include "checkpoint/lora_adapter.h"
#include "runtime/linear.h"

namespace qf {
class GgufFile;
}

namespace qf::rt {

// A SwiGLU MLP: down(silu(gate(x)) * up(x)).
struct ExpertWeights {
  std::shared_ptr<Linear> gate, up, down;
};

// The sparse MLP of a mixture-of-experts layer. Every token's router logits
// go through a softmax over all experts (float32); the top k are kept (ties:
// the lower index), renormalised to sum 1 when the config's norm_topk_prob
// says so, and weight their experts' outputs, which add up in expert order.
struct MoeWeights {
  std::shared_ptr<Linear> router;       // [experts, hidden]; the module is called "gate"
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;                 // qwen2_moe's shared_expert (null members: none)
  std::shared_ptr<Linear> shared_gate;  // qwen2_moe's shared_expert_gate [1, hidden]
};

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;  // [hidden]
  std::vector<float> q_norm, k_norm;       // [head_dim], qwen3 and qwen3_moe only
  std::shared_ptr<Linear> q, k, v, o;
  std::shared_ptr<Linear> gate, up, down;  // the dense MLP; null in a sparse layer
  MoeWeights moe;                          // a sparse layer's (router null in a dense layer)
  bool sparse() const { return moe.router != nullptr; }
};

struct ModelWeights {
  std::shared_ptr<Linear> embed;    // [vocab, hidden]: decode_row gives a token's embedding
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;    // [hidden]
  std::shared_ptr<Linear> lm_head;  // [vocab, hidden]; the same object as embed when tied
  // Row layout of q/k: false for Hugging Face's rotate-half (pairs i, i + hd/2),
  // true for llama.cpp's LLAMA RoPE mode (adjacent pairs 2i, 2i + 1).
  bool rope_interleaved = false;
  // GGUF rope_freqs (llama3 scaling precomputed): inv_freq[i] /= factor[i].
  std::vector<float> rope_freq_factors;
  // Calibrated FP8 KV-cache scales, one per layer (k_scale / v_scale of a
  // compressed-tensors kv_cache_scheme or modelopt export); empty when the
  // checkpoint has none. make_cache(F8_E4M3) uses them.
  std::vector<float> k_scale, v_scale;
};

// Sees the input of every Linear during forward (the importance matrix and
// calibration statistics use it). `x` holds n rows of `in` floats.
class LinearObserver {
 public:
  virtual ~LinearObserver() = default;
  enum Slot { Q, K, V, O, Gate, Up, Down, LmHead };
  virtual void observe(int64_t layer, Slot slot, const float* x, int64_t n, int64_t in) = 0;
  // The slot whose input `s` reads: K and V read Q's, Up reads Gate's, the
  // others their own. Observers that want each distinct input once (Hessians,
  // smoothing statistics) keep the slots with input_of(s) == s.
  static constexpr Slot input_of(Slot s) { return s == K || s == V ? Q : s == Up ? Gate : s; }
  // K (after RoPE and, for qwen3, k_norm: what the cache stores) and V of n
  // tokens, n rows of kv_dim floats each. KV-cache calibration uses it.
  virtual void observe_kv(int64_t /*layer*/, const float* /*k*/, const float* /*v*/, int64_t /*n*/, int64_t /*kv_dim*/) {}
  // In a sparse layer, instead of Gate/Up/Down: the n rows routed to one
  // expert (kSharedExpert: the shared expert, which sees every token). Slot
  // Gate is the input its gate and up read, Down its down projection's.
  virtual void observe_expert(int64_t /*layer*/, int64_t /*expert*/, Slot /*slot*/, const float* /*x*/, int64_t /*n*/,
                              int64_t /*in*/) {}
  // In a sparse layer, the input of its sparse MLP (the post-attention
  // normed rows, what the router reads), before routing.
  virtual void observe_moe_input(int64_t /*layer*/, const float* /*xn*/, int64_t /*n*/, int64_t /*hidden*/) {}
  // In a sparse layer, the n tokens' router choices: n x k expert indices
  // and their weights (after renormalisation where the architecture does it).
  virtual void observe_routing(int64_t /*layer*/, const int32_t* /*experts*/, const float* /*weights*/, int64_t /*n*/,
                               int64_t /*k*/) {}
};

inline constexpr int64_t kNoExpert = kDenseLinear;           // attention and dense-MLP Linears
inline constexpr int64_t kSharedExpert = kSharedExpertLinear;  // qwen2_moe's shared expert

// The seven Linears of a decoder layer in forward order: their Hugging Face
// module names under "model.layers.N.", their LayerWeights members and the
// observer slots their inputs are reported under.
struct LayerLinear {
  const char* name;
  std::shared_ptr<Linear> LayerWeights::*member;
  LinearObserver::Slot slot;
};
inline constexpr LayerLinear kLayerLinears[] = {
    {"self_attn.q_proj", &LayerWeights::q, LinearObserver::Q},     {"self_attn.k_proj", &LayerWeights::k, LinearObserver::K},
    {"self_attn.v_proj", &LayerWeights::v, LinearObserver::V},     {"self_attn.o_proj", &LayerWeights::o, LinearObserver::O},
    {"mlp.gate_proj", &LayerWeights::gate, LinearObserver::Gate}, {"mlp.up_proj", &LayerWeights::up, LinearObserver::Up},
    {"mlp.down_proj", &LayerWeights::down, LinearObserver::Down}};

// The [out, in] shape of a dense decoder layer's Linear in slot `slot` (Q..Down).
struct LinearShape {
  int64_t out, in;
};
LinearShape layer_linear_shape(const ModelConfig& c, LinearObserver::Slot slot);

// One quantizable Linear of a decoder layer: its role, its expert and its
// module name under "model.layers.N." as the architecture's checkpoints spell
// it ("self_attn.q_proj", "mlp.down_proj", "block_sparse_moe.experts.3.w1",
// "mlp.experts.3.gate_proj", "mlp.shared_expert.up_proj").
struct LayerLinearId {
  LinearObserver::Slot slot;  // Q..Down
  int64_t expert = kNoExpert;  // a routed expert's index, kSharedExpert or kNoExpert
  std::string name;
};

// Every quantizable Linear of layer `layer` in forward order: q, k, v, o, then
// the dense MLP's gate, up, down, or each routed expert's (expert 0 first)
// followed by the shared expert's. Routers and the shared-expert gate are not
// listed: they stay in their stored form (vLLM loads them unquantized).
std::vector<LayerLinearId> layer_linears(const ModelConfig& c, int64_t layer);
// Where a listed Linear lives in the layer's weights.
std::shared_ptr<Linear>& layer_linear(LayerWeights& l, const LayerLinearId& id);
const std::shared_ptr<Linear>& layer_linear(const LayerWeights& l, const LayerLinearId& id);
// Its [out, in] shape.
LinearShape layer_linear_shape(const ModelConfig& c, const LayerLinearId& id);
// A sparse layer's MLP module prefix ("block_sparse_moe." for mixtral, "mlp."
// for the qwen MoE models): the router is <prefix>gate.
std::string moe_module_prefix(const ModelConfig& c);

// Tokens to run in one forward pass. Tokens of one sequence must come in
// increasing position order; each attends to its sequence's cached positions
// up to and including its own.
struct Batch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> seq;
  std::vector<int64_t> pos;
  std::vector<uint8_t> want_logits;
  // Multimodal inputs, empty for text. rope_pos: three rotary positions per
  // token (temporal, height, width) for multimodal RoPE, 3 * size() values
  // (empty: every section rotates by pos). embed_row: per token, the row of
  // `embeds` ([rows, hidden], an image's rows from the vision side) that
  // replaces its token's embedding, or -1.
  std::vector<int64_t> rope_pos;
  std::vector<int32_t> embed_row;
  std::shared_ptr<const std::vector<float>> embeds;
  void add(int32_t token, int32_t sequence, int64_t position, bool logits) {
    tokens.push_back(token), seq.push_back(sequence), pos.push_back(position), want_logits.push_back(logits);
  }
  // A token of a multimodal batch (every token of the batch added this way).
  void add(int32_t token, int32_t sequence, int64_t position, bool logits, const int64_t rope[3], int32_t row) {
    add(token, sequence, position, logits);
    rope_pos.insert(rope_pos.end(), rope, rope + 3);
    embed_row.push_back(row);
  }
  bool multimodal() const { return !rope_pos.empty() || !embed_row.empty(); }
  size_t size() const { return tokens.size(); }
  void clear() { tokens.clear(), seq.clear(), pos.clear(), want_logits.clear(), rope_pos.clear(), embed_row.clear(); }
  // Tokens `rows` (indices into this batch) as a batch of their own, with
  // their multimodal inputs and want_logits set.
  Batch subset(const std::vector<int64_t>& rows) const;
};

// One sequence's multimodal inputs: the rows an image became (the vision
// side's output) and where they go, and every token's three rotary positions
// under multimodal RoPE (runtime/vision/multimodal_prompt.h builds them).
struct MultimodalInputs {
  std::shared_ptr<const std::vector<float>> embeds;  // [rows, hidden]
  int64_t hidden = 0;                                // the width of a row
  std::vector<int32_t> embed_row;                    // per token: its row of embeds, or -1
  std::vector<int64_t> rope_pos;                     // 3 per token, or empty (ordinary positions)
};

// Appends a sequence's tokens at positions 0.. to `b` under sequence id
// `seq`, with its multimodal inputs when `mm` is given (and any other
// sequence's inputs kept); tokens j in [logits_from, logits_to) want logits.
void add_sequence(Batch& b, const std::vector<int32_t>& tokens, int32_t seq, const MultimodalInputs* mm,
                  int64_t logits_from = 0, int64_t logits_to = 0);

class Model {
 public:
  // Validates every shape against the config; throws qf::Error naming the
  // tensor on a mismatch and Unsupported for architectures outside the family.
  Model(ModelConfig config, ModelWeights weights, std::filesystem::path source);

  const ModelConfig& config() const { return config_; }
  const std::filesystem::path& source() const { return source_; }
  int64_t vocab_size() const { return config_.vocab_size; }
  int64_t max_context() const { return config_.max_position_embeddings; }
  // The attention window of a layer (0: full attention).
  int64_t window(int64_t layer) const;

  // A cache sized for `max_tokens` positions in all. F8_E4M3 caches get the
  // model's calibrated k/v scales when it has them (1.0 otherwise). KIVI
  // caches use blocks of at least 32 positions.
  KvCache make_cache(const KvFormat& format, int64_t max_tokens, int64_t block_size = 16) const;
  // NVFP4 caches: sets every layer's global scales from the absolute maxima
  // of its keys and values over the samples, run with an f16 cache (Model
  // Optimizer's "max" calibration). No-op for the other formats.
  void calibrate_kv(KvCache& cache, const std::vector<std::vector<int32_t>>& samples, ThreadPool& pool) const;
  // The calibration itself: per layer, max |K| and max |V| over the samples.
  std::vector<std::pair<float, float>> kv_amax(const std::vector<std::vector<int32_t>>& samples, ThreadPool& pool) const;

  // Runs the batch, appending its K/V to `cache`; `logits` receives
  // [tokens with want_logits, vocab] floats in batch order.
  void forward(const Batch& batch, KvCache& cache, std::vector<float>& logits, ThreadPool& pool,
               LinearObserver* observer = nullptr) const;

  // The pieces of forward(), for layer-by-layer calibration: check_batch
  // validates tokens and positions and reserves cache blocks; embed writes
  // [tokens, hidden]; forward_layer runs decoder layer li in place on x (its
  // K/V go to `cache`); head applies the final norm and lm_head to the tokens
  // that want logits.
  void check_batch(const Batch& batch, KvCache& cache) const;
  void embed(const Batch& batch, float* x) const;
  void forward_layer(int64_t layer, const Batch& batch, float* x, KvCache& cache, ThreadPool& pool,
                     LinearObserver* observer = nullptr) const;
  void head(const Batch& batch, const float* x, std::vector<float>& logits, ThreadPool& pool,
            LinearObserver* observer = nullptr) const;

  // The sub-blocks of forward_layer (which is exactly: out = attention_block(x);
  // x += out; xn = ffn_norm(x); out = mlp_block(xn); x += out), for smoothing
  // searches that run one part of a layer:
  //   attn_norm / ffn_norm: xn = rms_norm(x) with the layer's norm weights, n rows;
  //   attention_block: out = o_proj(attention(rms_norm(x))) without the residual,
  //     x the layer input [n, hidden]; K/V of the batch go to `cache`;
  //   mlp_block: out = down(swiglu(gate(xn), up(xn))) of an already-normed input.
  void attn_norm(int64_t layer, const float* x, int64_t n, float* xn) const;
  void ffn_norm(int64_t layer, const float* x, int64_t n, float* xn) const;
  void attention_block(int64_t layer, const Batch& batch, const float* x, float* out, KvCache& cache,
                       ThreadPool& pool, LinearObserver* observer = nullptr) const;
  void mlp_block(int64_t layer, const float* xn, int64_t n, float* out, ThreadPool& pool,
                 LinearObserver* observer = nullptr) const;

  // The RoPE inverse frequencies [head_dim / 2], scaling and GGUF factors applied.
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  // Multimodal RoPE: which of a token's three rotary positions frequency i
  // follows (0 temporal, 1 height, 2 width), from the config's mrope_section;
  // empty for ordinary RoPE.
  const std::vector<uint8_t>& rope_sections() const { return rope_section_; }

  // The weights, for quantizers that replace a layer's Linears in place.
  const ModelWeights& weights() const { return w_; }
  LayerWeights& mutable_layer(int64_t layer) { return w_.layers.at(static_cast<size_t>(layer)); }
  ModelWeights& mutable_weights() { return w_; }

  // Weight bytes read to produce one token: every Linear (of a sparse layer:
  // the router, the shared expert and k experts of average size), the norms
  // and one embedding row.
  uint64_t bytes_per_token() const;
  uint64_t parameter_count() const;
  // Parameters one token uses (a sparse layer counts k of its experts);
  // parameter_count() for a dense model.
  uint64_t active_parameter_count() const;
  std::string weight_format() const;  // "f16", or "mixed (...)"
  // Whether the loader read the weight files into memory or mapped them
  // (core/weight_residency.h chooses; Mapped for weights built in memory).
  FileResidency weights_residency() const { return residency_; }
  void set_weights_residency(FileResidency residency) { residency_ = residency; }

 private:
  void attention(int64_t layer, const Batch& batch, const float* q, const KvCache& cache, float* out,
                 ThreadPool& pool) const;
  void rope(const Batch& batch, float* x, int64_t heads) const;
  // The parts of attention_block: the batch's queries (projected, normed,
  // rotated) from the normed input xn, and its keys and values into the cache.
  void project_q(int64_t layer, const Batch& batch, const float* xn, float* q, ThreadPool& pool) const;
  void store_kv(int64_t layer, const Batch& batch, const float* xn, KvCache& cache, ThreadPool& pool,
                LinearObserver* observer) const;
  // forward_layer for the batch's tokens `rows` (increasing; `kept` holds
  // them as a batch): every token's K/V go to the cache, and xk [rows, hidden]
  // receives the rows' outputs. Each row's floats are those of forward_layer
  // (its sums do not depend on the batch), except that fewer than 16 tokens
  // take the per-token products of GGUF block types.
  void forward_layer_rows(int64_t layer, const Batch& batch, const Batch& kept, const std::vector<int64_t>& rows,
                          const float* x, float* xk, KvCache& cache, ThreadPool& pool) const;
  void moe_block(int64_t layer, const float* xn, int64_t n, float* out, ThreadPool& pool, LinearObserver* observer) const;

  ModelConfig config_;
  ModelWeights w_;
  std::filesystem::path source_;
  FileResidency residency_ = FileResidency::Mapped;
  std::vector<float> inv_freq_;  // [head_dim / 2]
  std::vector<uint8_t> rope_section_;  // [head_dim / 2] for multimodal RoPE, else empty
};

// Inverse RoPE frequencies for the config (default, linear or llama3 scaling;
// Unsupported for the others).
std::vector<float> rope_inv_freq(const ModelConfig& config);

// LoRA adapters to load with a model (`--lora DIR[:SCALE]`, `--lora-mode`):
// merged into the weights (checkpoint/lora_merge.h; a Hugging Face base in
// f32/f16/bf16 only), or applied in the forward (runtime/lora_linear.h: any
// base; a GGUF base takes GGUF adapters, `convert --to gguf-lora`). Auto:
// merged where it can be, else in the forward.
struct LoraLoad {
  enum class Mode { Auto, Merge, Forward };
  std::vector<LoraSpec> adapters;
  Mode mode = Mode::Auto;
  bool empty() const { return adapters.empty(); }
};
// "auto", "merge" or "forward"; Usage error naming `flag` otherwise.
LoraLoad::Mode parse_lora_mode(const std::string& word, const std::string& flag = "--lora-mode");

// Loads a Hugging Face model (folder, cache repo, ORG/NAME) whose weights are
// f32/f16/bf16 safetensors, views straight into the mapped files.
// `residency`: read into memory or mapped; unset, as QF_WEIGHTS says
// (core/weight_residency.h).
std::unique_ptr<Model> load_hf_model(const std::filesystem::path& dir,
                                     std::optional<FileResidency> residency = std::nullopt, const LoraLoad& lora = {});

// A GGUF file (llama, qwen2, qwen3 architectures; every type kquants reads),
// weights used in place from the mapping. `runs_on`: where the model will run.
// For the CPU, Q8_0 weights read into memory (QF_WEIGHTS, docs/runtime.md) are
// regrouped in place for the CPU's decode kernel where it has one
// (make_block_linear's `regroup`); for a device every weight stays as stored,
// which is what the device runtime uploads.
std::unique_ptr<Model> load_gguf_model(const std::filesystem::path& file, device::Kind runs_on = device::Kind::Cpu,
                                       const LoraLoad& lora = {});

// The hyper-parameters of a GGUF model (general.architecture and its
// "<arch>.*" keys, the vocabulary from token_embd.weight), validated by
// check_model_config with GGUF key names in messages, and checked against the
// blk.N tensors present.
ModelConfig gguf_model_config(const GgufFile& file);

// Any model the runtime reads: a .gguf file, a Hugging Face folder (or cache id).
std::unique_ptr<Model> load_model(const std::string& model, device::Kind runs_on = device::Kind::Cpu,
                                  const LoraLoad& lora = {});

}  // namespace qf::rt
