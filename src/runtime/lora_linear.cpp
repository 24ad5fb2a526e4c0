// The unmerged LoRA forward: a Linear around the base one.
#include "runtime/lora_linear.h"

#include <cmath>
#include <map>

#include "core/error.h"
#include "formats/hf/model_tensors.h"

namespace qf::rt {
namespace {

class LoraLinear : public Linear {
 public:
  LoraLinear(std::shared_ptr<const Linear> base, const LoraModule& m)
      : Linear(base->in_features(), base->out_features()), base_(std::move(base)), m_(m), r_(m.rank()) {
    if (m.embedding) throw unsupported(m.module, "a LoRA on the embedding is applied merged only (--lora-mode merge)");
    if (m.a.dim(1) != in_ || m.b.dim(0) != out_)
      throw invalid_input(m.module, "the adapter's shapes do not fit the base Linear [" + std::to_string(out_) + ", " +
                                        std::to_string(in_) + "]");
    bias_ = base_->bias_values();
    if (!m.magnitude.empty()) {
      // DoRA's row norms of W + s B A, from the base as it decodes.
      row_scale_.resize(static_cast<size_t>(out_));
      std::vector<float> row(static_cast<size_t>(in_));
      for (int64_t i = 0; i < out_; ++i) {
        merged_row(i, row.data());
        double ss = 0;
        for (float v : row) ss += static_cast<double>(v) * v;
        const double norm = std::sqrt(ss);
        if (!(norm > 0)) throw invalid_input(m.module, "DoRA: row " + std::to_string(i) + " of the adapted weight is zero");
        row_scale_[static_cast<size_t>(i)] = static_cast<float>(m.magnitude[static_cast<size_t>(i)] / norm);
      }
    }
  }

  void forward(const float* x, int64_t n, float* y, ThreadPool& pool) const override {
    base_->forward(x, n, y, pool);
    const float* A = m_.a.data_as<float>();
    const float* B = m_.b.data_as<float>();
    pool.parallel_for(n, 1, [&](const Chunk& ch) {
      std::vector<float> t(static_cast<size_t>(r_));
      for (int64_t tok = ch.begin; tok < ch.end; ++tok) {
        const float* xt = x + tok * in_;
        for (int64_t k = 0; k < r_; ++k) {  // t = x A^T
          const float* ak = A + k * in_;
          float acc = 0;
          for (int64_t j = 0; j < in_; ++j) acc = std::fma(xt[j], ak[j], acc);
          t[static_cast<size_t>(k)] = acc;
        }
        float* yt = y + tok * out_;
        for (int64_t i = 0; i < out_; ++i) {
          const float* bi = B + i * r_;
          float acc = 0;
          for (int64_t k = 0; k < r_; ++k) acc = std::fma(bi[k], t[static_cast<size_t>(k)], acc);
          if (row_scale_.empty()) {
            yt[i] = std::fma(m_.scale, acc, yt[i]);
          } else {  // bias + m/||.|| (x W^T + s x A^T B^T)
            const float b = bias_.empty() ? 0.0f : bias_[static_cast<size_t>(i)];
            yt[i] = row_scale_[static_cast<size_t>(i)] * std::fma(m_.scale, acc, yt[i] - b) + b;
          }
        }
      }
    });
  }

  void decode_row(int64_t r, float* out) const override {
    merged_row(r, out);
    if (!row_scale_.empty())
      for (int64_t j = 0; j < in_; ++j) out[j] *= row_scale_[static_cast<size_t>(r)];
  }
  uint64_t weight_bytes() const override {
    return base_->weight_bytes() + static_cast<uint64_t>(m_.a.nbytes() + m_.b.nbytes());
  }
  std::string format() const override {
    return base_->format() + " + " + (row_scale_.empty() ? "LoRA" : "DoRA") + " r" + std::to_string(r_);
  }
  std::vector<float> bias_values() const override { return bias_; }
  const ActQuantParams* input_quantizer() const override { return base_->input_quantizer(); }
  bool quantized() const override { return base_->quantized(); }
  void release_pages() const override { base_->release_pages(); }

 private:
  // Row r of W + s B A, with the same multiply-adds as the merge.
  void merged_row(int64_t r, float* out) const {
    base_->decode_row(r, out);
    const float* A = m_.a.data_as<float>();
    const float* B = m_.b.data_as<float>();
    std::vector<float> acc(static_cast<size_t>(in_), 0.0f);
    for (int64_t k = 0; k < r_; ++k) {
      const float b = B[r * r_ + k];
      for (int64_t j = 0; j < in_; ++j) acc[static_cast<size_t>(j)] = std::fma(b, A[k * in_ + j], acc[static_cast<size_t>(j)]);
    }
    for (int64_t j = 0; j < in_; ++j) out[j] = std::fma(m_.scale, acc[static_cast<size_t>(j)], out[j]);
  }

  std::shared_ptr<const Linear> base_;
  LoraModule m_;
  int64_t r_;
  std::vector<float> bias_;
  std::vector<float> row_scale_;  // DoRA's m / ||W + s B A||; empty without DoRA
};

}  // namespace

std::shared_ptr<Linear> make_lora_linear(std::shared_ptr<const Linear> base, const LoraModule& m) {
  return std::make_shared<LoraLinear>(std::move(base), m);
}

void apply_lora_forward(Model& model, const std::vector<LoraAdapter>& adapters, const std::string& where) {
  const ModelConfig& c = model.config();
  ModelWeights& w = model.mutable_weights();
  std::map<std::string, std::shared_ptr<Linear>*> slots;
  slots["lm_head"] = &w.lm_head;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights& l = model.mutable_layer(i);
    for (const LayerLinearId& id : layer_linears(c, i)) slots[p + id.name] = &layer_linear(l, id);
    for (const HfRouter& r : hf_layer_routers(c, i)) slots[p + r.name] = r.shared_gate ? &l.moe.shared_gate : &l.moe.router;
  }
  for (const LoraAdapter& a : adapters)
    for (const LoraModule& m : a.modules) {
      if (m.embedding)
        throw unsupported(a.source, "the adapter changes the embedding ('" + m.module +
                                        "'), which is applied merged only (--lora-mode merge)");
      const auto it = slots.find(m.module);
      if (it == slots.end() || !*it->second)
        throw invalid_input(a.source, "module '" + m.module + "' is not a Linear of " + where);
      *it->second = make_lora_linear(*it->second, m);
    }
}

}  // namespace qf::rt
