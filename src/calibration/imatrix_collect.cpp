#include "calibration/imatrix_collect.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/io.h"
#include "core/text_input.h"
#include "formats/hf/resolve.h"
#include "runtime/device_runtime.h"
#include "runtime/finite_weights.h"

namespace qf {
namespace {

// The GGUF name of a layer Linear's imatrix entry (layer -1: output.weight).
std::string entry_name(int64_t layer, rt::LinearObserver::Slot slot) {
  static const char* parts[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
  if (slot == rt::LinearObserver::LmHead) return "output.weight";
  return "blk." + std::to_string(layer) + "." + parts[slot] + ".weight";
}

// Sums of squared inputs per weight, as llama-imatrix collects them: one
// entry per matrix, and for a layer's stacked routed experts (ffn_*_exps) one
// row of sums and one count per expert, each from the tokens routed to it.
class SquareSums final : public rt::LinearObserver {
 public:
  SquareSums(bool output, int64_t experts, bool shared, ThreadPool& pool)
      : output_(output), experts_(experts), shared_(shared), pool_(pool) {}

  void observe(int64_t layer, Slot slot, const float* x, int64_t n, int64_t in) override {
    if (slot == LmHead && !output_) return;
    // K and V read Q's input, Up reads Gate's: their entries are copies of
    // those (result()), summed once.
    if (slot != LmHead && input_of(slot) != slot) return;
    add(entry_name(layer, slot), 0, 1, x, n, in);
  }
  void observe_moe_input(int64_t layer, const float* xn, int64_t n, int64_t hidden) override {
    const std::string p = "blk." + std::to_string(layer) + ".";
    add(p + "ffn_gate_inp.weight", 0, 1, xn, n, hidden);  // the router
    if (shared_) add(p + "ffn_gate_inp_shexp.weight", 0, 1, xn, n, hidden);
  }
  void observe_expert(int64_t layer, int64_t e, Slot slot, const float* x, int64_t n, int64_t in) override {
    const std::string p = "blk." + std::to_string(layer) + ".";
    const bool sh = e == rt::kSharedExpert;
    const int64_t m = sh ? 0 : e, nmat = sh ? 1 : experts_;
    const char* suffix = sh ? "_shexp.weight" : "_exps.weight";
    if (slot == Down) return add(p + "ffn_down" + suffix, m, nmat, x, n, in);
    add(p + "ffn_gate" + suffix, m, nmat, x, n, in);  // gate and up read the same rows
    add(p + "ffn_up" + suffix, m, nmat, x, n, in);
  }

  Imatrix result() const {
    Imatrix m;
    std::map<std::string, Acc> all = acc_;
    for (const auto& [k, a] : acc_) {
      const auto copy_as = [&](const char* from, const char* to) {
        const size_t at = k.find(from);
        if (at != std::string::npos) all.emplace(std::string(k).replace(at, std::string(from).size(), to), a);
      };
      copy_as(".attn_q.", ".attn_k."), copy_as(".attn_q.", ".attn_v."), copy_as(".ffn_gate.", ".ffn_up.");
    }
    for (const auto& [k, a] : all) {
      ImatrixEntry e;
      e.in_sum2.assign(a.sum.begin(), a.sum.end());
      for (int64_t c : a.counts) e.count += static_cast<float>(c);
      if (a.counts.size() > 1)
        for (int64_t c : a.counts) e.expert_counts.push_back(static_cast<float>(c));
      m.entries.emplace(k, std::move(e));
    }
    return m;
  }

 private:
  struct Acc {
    std::vector<double> sum;     // nmat x in
    std::vector<int64_t> counts; // nmat
  };
  // Rows of matrix `m` of an entry holding `nmat` of them.
  void add(const std::string& name, int64_t m, int64_t nmat, const float* x, int64_t n, int64_t in) {
    Acc& a = acc_[name];
    if (a.sum.empty()) a.sum.assign(static_cast<size_t>(nmat * in), 0.0), a.counts.assign(static_cast<size_t>(nmat), 0);
    double* s = a.sum.data() + m * in;
    // Columns in fixed spans on the pool, each summed over the tokens in order.
    pool_.parallel_for(in, 512, [&](const Chunk& ch) {
      for (int64_t t = 0; t < n; ++t) {
        const float* r = x + t * in;
        for (int64_t j = ch.begin; j < ch.end; ++j) s[j] += static_cast<double>(r[j]) * r[j];
      }
    });
    a.counts[static_cast<size_t>(m)] += n;
  }
  bool output_;
  int64_t experts_;
  bool shared_;
  ThreadPool& pool_;
  std::map<std::string, Acc> acc_;
};

// The chunk's tokens: llama-imatrix replaces the first with BOS.
std::vector<int32_t> chunk_tokens(const std::vector<int32_t>& ids, const Tokenizer& tok, int64_t c, int64_t ctx) {
  std::vector<int32_t> t(ids.begin() + c * ctx, ids.begin() + (c + 1) * ctx);
  if (tok.bos_id() >= 0) t[0] = tok.bos_id();
  return t;
}

// compute_imatrix on the device decoder: the same sums, taken on the device.
Imatrix device_imatrix(const rt::Model& model, const Tokenizer& tok, const std::vector<int32_t>& ids, int64_t chunks,
                       const ImatrixOptions& o, const std::function<void(int64_t, int64_t)>& progress) {
  const std::string where = std::string("imatrix --device ") + device::kind_name(o.device);
  if (model.config().is_moe())
    throw unsupported(where, "the device decoder does not collect the per-expert sums of a mixture-of-experts model's "
                             "experts; use --device cpu");
  device::require_device_memory(o.device, rt::device_decoder_bytes(model, o.ctx), where);
  std::unique_ptr<rt::DeviceDecoder> dev = rt::make_device_decoder(o.device, model, o.ctx);
  dev->collect_square_sums(o.process_output);
  // llama-imatrix asks for every position's logits; output.weight then sees all tokens.
  const std::vector<uint8_t> want(static_cast<size_t>(o.ctx), o.process_output ? 1 : 0);
  std::vector<float> logits;
  for (int64_t c = 0; c < chunks; ++c) {
    const std::vector<int32_t> t = chunk_tokens(ids, tok, c, o.ctx);
    dev->reset();
    dev->forward(t.data(), o.ctx, want.data(), logits);
    if (progress) progress(c + 1, chunks);
  }
  Imatrix m;
  auto add = [&](const std::string& name, const std::vector<double>& sums, int64_t tokens) {
    ImatrixEntry e;
    e.in_sum2.assign(sums.begin(), sums.end());
    e.count = static_cast<float>(tokens);
    m.entries.emplace(name, std::move(e));
  };
  for (int64_t li = 0; li < model.config().num_hidden_layers; ++li)
    for (const rt::LayerLinear& ll : rt::kLayerLinears)
      add(entry_name(li, ll.slot), dev->square_sums(li, rt::layer_input_of(ll.slot)), dev->square_sum_tokens(li));
  if (o.process_output) add(entry_name(-1, rt::LinearObserver::LmHead), dev->square_sums(-1, rt::LayerInput::Attention),
                            dev->square_sum_tokens(-1));
  return m;
}

}  // namespace

Imatrix compute_imatrix(const rt::Model& model, const Tokenizer& tok, const std::string& text,
                        const ImatrixOptions& o, ThreadPool& pool, const std::function<void(int64_t, int64_t)>& progress) {
  if (o.ctx < 2) throw Error(ErrorKind::Usage, "imatrix: --ctx must be at least 2");
  if (model.max_context() > 0 && o.ctx > model.max_context())
    throw invalid_input("imatrix", "context " + std::to_string(o.ctx) + " exceeds the model's maximum of " +
                                       std::to_string(model.max_context()));
  const std::vector<int32_t> ids = tok.encode(text, tok.bos_id() >= 0);
  int64_t chunks = static_cast<int64_t>(ids.size()) / o.ctx;
  if (chunks == 0)
    throw invalid_input(o.dataset.empty() ? "imatrix" : o.dataset,
                        "the text has " + std::to_string(ids.size()) + " tokens, fewer than one chunk of " +
                            std::to_string(o.ctx) + " (use a longer text or a smaller --ctx)");
  if (o.max_chunks > 0) chunks = std::min(chunks, o.max_chunks);
  Imatrix m;
  if (o.device != device::Kind::Cpu) {
    m = device_imatrix(model, tok, ids, chunks, o, progress);
  } else {
    SquareSums sums(o.process_output, model.config().num_experts, model.config().shared_expert_intermediate_size > 0, pool);
    std::vector<float> logits;
    rt::KvCache cache = model.make_cache(rt::KvDType::F16, o.ctx);  // one cache, its blocks reused by every chunk
    for (int64_t c = 0; c < chunks; ++c) {
      const int32_t seq = cache.add_sequence();
      rt::Batch b;
      const std::vector<int32_t> t = chunk_tokens(ids, tok, c, o.ctx);
      // llama-imatrix asks for every position's logits; output.weight then sees all tokens.
      for (int64_t j = 0; j < o.ctx; ++j) b.add(t[static_cast<size_t>(j)], seq, j, o.process_output);
      model.forward(b, cache, logits, pool, &sums);
      cache.free_sequence(seq);
      if (progress) progress(c + 1, chunks);
    }
    m = sums.result();
  }
  m.chunk_count = static_cast<uint32_t>(chunks);
  m.chunk_size = static_cast<uint32_t>(o.ctx);
  if (!o.dataset.empty()) m.datasets.push_back(o.dataset);
  return m;
}

Imatrix write_imatrix_from_text(const std::string& model, const std::filesystem::path& text,
                                const std::filesystem::path& out, const std::string& out_flag, ImatrixOptions opts,
                                bool force, bool allow_nonfinite, ThreadPool& pool,
                                const std::function<void(int64_t, int64_t)>& progress) {
  check_output_file(out, {model_input_path(model), text}, force, false, out_flag);
  const std::string txt = read_text_input(text.string());
  std::unique_ptr<rt::Model> m = rt::load_model(model, opts.device, opts.lora);
  std::unique_ptr<Tokenizer> tok = load_tokenizer(m->source());
  if (!allow_nonfinite) {
    const std::string bad = rt::find_nonfinite_weight(*m, pool);
    if (!bad.empty())
      throw invalid_input(model, bad + "; an importance matrix of a model with non-finite weights is meaningless (--allow-nonfinite overrides)");
  }
  if (opts.dataset.empty()) opts.dataset = text.filename().string();
  const Imatrix im = compute_imatrix(*m, *tok, txt, opts, pool, progress);
  write_imatrix_gguf(im, out);
  return im;
}

}  // namespace qf
