// LoRA merge: W' = W + s B A per module (DoRA: rows renormalised to the
// magnitude vector), every adapter in order, in f32, rounded once.
#include "checkpoint/lora_merge.h"

#include <cmath>
#include <map>
#include <set>

#include "core/error.h"
#include "core/io.h"
#include "formats/hf/model_config.h"
#include "formats/hf/model_tensors.h"

namespace qf {
namespace {

class LoraMergeOverlay : public Checkpoint::Overlay {
 public:
  explicit LoraMergeOverlay(std::vector<LoraAdapter> adapters) : adapters_(std::move(adapters)) {
    for (const LoraAdapter& a : adapters_) {
      for (const LoraModule& m : a.modules) covered_.insert(m.module + ".weight");
      for (const LoraReplacement& r : a.replaced) covered_.insert(r.tensor);
    }
  }
  bool covers(const std::string& name) const override { return covered_.count(name) > 0; }
  Tensor tensor(const std::string& name, const Checkpoint& ck) const override {
    const Tensor stored = ck.stored_tensor(name);
    const int64_t out = stored.ndim() >= 1 ? stored.dim(0) : 1;
    const int64_t in = stored.numel() / std::max<int64_t>(out, 1);
    std::vector<float> w = stored.to_f32_vector();
    // The global pool's parallel_for is not re-entrant: the readers of a
    // checkpoint (runtime load, convert, quantize's export) read tensors
    // outside their parallel regions, and must keep doing so.
    apply_lora_updates(adapters_, name, w, out, in, ThreadPool::global());
    return Tensor::from_f32(w, stored.shape()).to(stored.dtype());
  }

 private:
  std::vector<LoraAdapter> adapters_;
  std::set<std::string> covered_;
};

void add_product(const LoraModule& m, std::vector<float>& w, int64_t out, int64_t in, ThreadPool& pool) {
  const int64_t r = m.rank();
  const bool fits = m.embedding ? m.a.dim(1) == out && m.b.dim(0) == in : m.b.dim(0) == out && m.a.dim(1) == in;
  if (!fits || m.b.dim(1) != r)
    throw invalid_input(m.module, "the adapter's shapes do not fit the stored weight [" + std::to_string(out) + ", " +
                                      std::to_string(in) + "]");
  const float* A = m.a.data_as<float>();
  const float* B = m.b.data_as<float>();
  const float s = m.scale;
  pool.parallel_for(out, 16, [&](const Chunk& ch) {
    std::vector<float> acc(static_cast<size_t>(in));
    for (int64_t i = ch.begin; i < ch.end; ++i) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t k = 0; k < r; ++k) {
        if (m.embedding) {  // (B A)^T [vocab, hidden]: row i (a token) = sum_k A[k, i] B[:, k]
          const float aki = A[k * out + i];
          for (int64_t j = 0; j < in; ++j) acc[j] = std::fma(aki, B[j * r + k], acc[j]);
        } else {
          const float bik = B[i * r + k];
          const float* ak = A + k * in;
          for (int64_t j = 0; j < in; ++j) acc[j] = std::fma(bik, ak[j], acc[j]);
        }
      }
      float* wi = w.data() + i * in;
      for (int64_t j = 0; j < in; ++j) wi[j] = std::fma(s, acc[j], wi[j]);
    }
  });
}

void renormalise_rows(const LoraModule& m, std::vector<float>& w, int64_t out, int64_t in, ThreadPool& pool) {
  pool.parallel_for(out, 16, [&](const Chunk& ch) {
    for (int64_t i = ch.begin; i < ch.end; ++i) {
      float* wi = w.data() + i * in;
      double ss = 0;
      for (int64_t j = 0; j < in; ++j) ss += static_cast<double>(wi[j]) * wi[j];
      const double norm = std::sqrt(ss);
      if (!(norm > 0))
        throw invalid_input(m.module, "DoRA: row " + std::to_string(i) + " of the adapted weight is zero");
      const float f = static_cast<float>(m.magnitude[static_cast<size_t>(i)] / norm);
      for (int64_t j = 0; j < in; ++j) wi[j] *= f;
    }
  });
}

}  // namespace

void apply_lora_updates(const std::vector<LoraAdapter>& adapters, const std::string& tensor, std::vector<float>& w,
                        int64_t out, int64_t in, ThreadPool& pool) {
  for (const LoraAdapter& a : adapters) {
    for (const LoraReplacement& r : a.replaced)
      if (r.tensor == tensor) w = r.value.to_f32_vector();
    for (const LoraModule& m : a.modules) {
      if (m.module + ".weight" != tensor) continue;
      add_product(m, w, out, in, pool);
      if (!m.magnitude.empty()) renormalise_rows(m, w, out, in, pool);
    }
  }
}

std::shared_ptr<const Checkpoint::Overlay> lora_merge_overlay(std::vector<LoraAdapter> adapters) {
  return std::make_shared<LoraMergeOverlay>(std::move(adapters));
}

Checkpoint open_checkpoint_with_loras(const std::filesystem::path& dir, const std::vector<LoraSpec>& specs,
                                      FileResidency residency) {
  Checkpoint ck = Checkpoint::open(dir, residency);
  const ModelConfig c = load_model_config(dir);
  apply_hf_tensor_naming(c, ck);
  if (specs.empty()) return ck;
  if (c.quantization_config)
    throw unsupported((dir / "config.json").string(),
                      "a LoRA adapter is merged into an unquantized base (f32/f16/bf16); this checkpoint is "
                      "quantized: merge into the original model and quantize that, or apply the adapter without "
                      "merging (--lora-mode forward)");
  std::vector<LoraAdapter> adapters;
  for (const LoraSpec& s : specs) adapters.push_back(read_peft_adapter(s, c, ck));
  ck.set_overlay(lora_merge_overlay(std::move(adapters)));
  return ck;
}

nlohmann::json lora_provenance(const std::vector<LoraSpec>& specs) {
  nlohmann::json out = nlohmann::json::array();
  for (const LoraSpec& s : specs) out.push_back({{"path", s.path.string()}, {"scale", s.scale}});
  return out;
}

}  // namespace qf
