#include "eval/probe_kl.h"

#include "core/error.h"
#include "runtime/cpu/kernels.h"

namespace qf::eval {
namespace {

rt::Batch span_batch(const Span& s, int32_t seq) {
  rt::Batch b;
  rt::add_sequence(b, s.tokens, seq, s.mm.get(), 0, static_cast<int64_t>(s.tokens.size()));
  return b;
}

}  // namespace

ProbeRunner::ProbeRunner(const rt::Model& baseline, std::vector<Span> spans, ThreadPool& pool,
                         rt::LinearObserver* observer)
    : base_(baseline), spans_(std::move(spans)), pool_(pool) {
  const int64_t layers = base_.config().num_hidden_layers, h = base_.config().hidden_size, vocab = base_.vocab_size();
  for (const Span& s : spans_) {
    const auto n = static_cast<int64_t>(s.tokens.size());
    rt::KvCache cache = base_.make_cache(rt::KvDType::F16, n);
    const rt::Batch b = span_batch(s, cache.add_sequence());
    base_.check_batch(b, cache);
    std::vector<std::vector<float>> in;
    std::vector<float> x(static_cast<size_t>(n * h));
    base_.embed(b, x.data());
    for (int64_t l = 0; l < layers; ++l) {
      in.push_back(x);
      base_.forward_layer(l, b, x.data(), cache, pool_, observer);
    }
    in.push_back(x);
    std::vector<float> logits;
    base_.head(b, x.data(), logits, pool_, observer);
    // Positions 0 .. n-2 predict the next token.
    logits.resize(static_cast<size_t>(std::max<int64_t>(0, n - 1) * vocab));
    std::vector<double> lse(static_cast<size_t>(std::max<int64_t>(0, n - 1)));
    for (int64_t t = 0; t + 1 < n; ++t) lse[static_cast<size_t>(t)] = rt::logsumexp(logits.data() + t * vocab, vocab);
    scored_ += std::max<int64_t>(0, n - 1);
    inputs_.push_back(std::move(in));
    base_logits_.push_back(std::move(logits));
    base_lse_.push_back(std::move(lse));
  }
  if (scored_ <= 0) throw Error(ErrorKind::InvalidInput, "probe text: no token to score (the text is shorter than two tokens)");
}

double ProbeRunner::kl(const rt::Model& model, int64_t first_layer) const {
  const int64_t layers = model.config().num_hidden_layers, vocab = model.vocab_size();
  double sum = 0;
  for (size_t si = 0; si < spans_.size(); ++si) {
    const auto n = static_cast<int64_t>(spans_[si].tokens.size());
    if (n < 2) continue;
    rt::KvCache cache = model.make_cache(rt::KvDType::F16, n);
    const rt::Batch b = span_batch(spans_[si], cache.add_sequence());
    model.check_batch(b, cache);
    std::vector<float> x;
    if (first_layer <= 0) {
      x.resize(inputs_[si][0].size());
      model.embed(b, x.data());
    } else {
      x = inputs_[si][static_cast<size_t>(std::min(first_layer, layers))];
    }
    for (int64_t l = std::max<int64_t>(0, first_layer); l < layers; ++l) model.forward_layer(l, b, x.data(), cache, pool_);
    std::vector<float> logits;
    model.head(b, x.data(), logits, pool_);
    const float* base = base_logits_[si].data();
    const std::vector<double>& base_lse = base_lse_[si];
    // Per position, in parallel; summed in position order.
    std::vector<double> per(static_cast<size_t>(n - 1));
    pool_.parallel_for(n - 1, 64, [&](const Chunk& ch) {
      for (int64_t t = ch.begin; t < ch.end; ++t) {
        const float* q = logits.data() + t * vocab;
        per[static_cast<size_t>(t)] =
            rt::kl_divergence(base + t * vocab, base_lse[static_cast<size_t>(t)], q, rt::logsumexp(q, vocab), vocab);
      }
    });
    for (double k : per) sum += k;
  }
  return sum / static_cast<double>(scored_);
}

}  // namespace qf::eval
