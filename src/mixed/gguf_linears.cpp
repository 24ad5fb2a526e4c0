#include "mixed/gguf_linears.h"

#include <regex>

#include "core/error.h"

namespace qf::mixed {

TensorLinears tensor_linears(rt::Model& model, const std::string& name) {
  rt::ModelWeights& w = model.mutable_weights();
  const int64_t layers = model.config().num_hidden_layers;
  TensorLinears t;
  if (name == "token_embd.weight") {
    t.slots = {&w.embed};
    t.embedding = true;
    // Tied embeddings: the same matrix is also the head.
    if (w.lm_head == w.embed) t.slots.push_back(&w.lm_head);
    return t;
  }
  if (name == "output.weight") {
    t.slots = {&w.lm_head};
    t.first_layer = layers;
    return t;
  }
  static const std::regex blk(R"(^blk\.(\d+)\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)(_exps|_shexp)?\.weight$)");
  std::smatch m;
  if (std::regex_match(name, m, blk)) {
    const int64_t li = std::stoll(m[1].str());
    if (li >= 0 && li < layers) {
      rt::LayerWeights& l = w.layers[static_cast<size_t>(li)];
      const std::string part = m[2].str(), kind = m[3].str();
      t.first_layer = li;
      const auto member = [&](rt::ExpertWeights& e) -> std::shared_ptr<rt::Linear>* {
        return part == "ffn_gate" ? &e.gate : part == "ffn_up" ? &e.up : part == "ffn_down" ? &e.down : nullptr;
      };
      if (kind.empty()) {
        std::shared_ptr<rt::Linear>* s = part == "attn_q"        ? &l.q
                                         : part == "attn_k"      ? &l.k
                                         : part == "attn_v"      ? &l.v
                                         : part == "attn_output" ? &l.o
                                         : part == "ffn_gate"    ? &l.gate
                                         : part == "ffn_up"      ? &l.up
                                                                 : &l.down;
        if (*s) t.slots = {s};
      } else if (kind == "_exps") {
        for (rt::ExpertWeights& e : l.moe.experts) t.slots.push_back(member(e));
      } else if (l.moe.shared.gate) {
        t.slots = {member(l.moe.shared)};
      }
      for (auto* s : t.slots)
        if (!s || !*s) t.slots.clear();
      if (!t.slots.empty()) return t;
    }
  }
  throw Error(ErrorKind::Unsupported, name + ": the runtime holds no matrix for this tensor, so its sensitivity cannot be measured");
}

}  // namespace qf::mixed
