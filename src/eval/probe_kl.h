// The KL divergence a model's output moves by when some of its weights are
// replaced, measured by the runtime on a few spans of text ("probes"): the
// sensitivity measurements of the size-budget searches (GGUF and
// compressed-tensors, docs/mixed-precision.md).
//
// The baseline runs once: its logits (and their logsumexp) at every scored
// position and the hidden state entering each decoder layer (and the head)
// are kept. A probe model that differs from the baseline only from layer L on
// (a Linear of layer L or later, or the head) is then run from the stored
// input of layer L, so a probe costs the layers it changes, not the whole
// model. KL per position is the runtime's kernel eval::evaluate uses.
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "eval/perplexity.h"
#include "runtime/model.h"

namespace qf::eval {

class ProbeRunner {
 public:
  // Runs the baseline over the spans (every position but the last of each
  // span is scored), reporting every Linear's input to `observer` when given.
  // InvalidInput when the spans score no token.
  ProbeRunner(const rt::Model& baseline, std::vector<Span> spans, ThreadPool& pool,
              rt::LinearObserver* observer = nullptr);

  // Mean KL(baseline || model) over the scored positions, in nats, for a
  // model equal to the baseline in its embedding and in layers below
  // `first_layer` (0: the embedding may differ too; num_hidden_layers: only
  // the head differs). A non-finite logit makes the result NaN.
  double kl(const rt::Model& model, int64_t first_layer) const;

  int64_t tokens_scored() const { return scored_; }

 private:
  const rt::Model& base_;
  std::vector<Span> spans_;
  ThreadPool& pool_;
  int64_t scored_ = 0;
  // Per span: [layers + 1][tokens * hidden] inputs, the baseline's logits
  // [scored tokens * vocab] and their logsumexp per scored token.
  std::vector<std::vector<std::vector<float>>> inputs_;
  std::vector<std::vector<float>> base_logits_;
  std::vector<std::vector<double>> base_lse_;
};

}  // namespace qf::eval
