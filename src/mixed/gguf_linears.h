// Which runtime Linears hold a GGUF tensor's rows, for the sensitivity search:
// "blk.N.attn_q.weight" is layer N's q, "blk.N.ffn_gate_exps.weight" every
// routed expert's gate of layer N (slab e = expert e), "token_embd.weight"
// the embedding, "output.weight" the head.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/model.h"

namespace qf::mixed {

struct TensorLinears {
  // One per slab, in slab order (one for an ordinary tensor, one per expert
  // for a stacked one). Pointers into the model's weights, so a probe can
  // swap them in a copy of the model.
  std::vector<std::shared_ptr<rt::Linear>*> slots;
  // The first decoder layer whose output changes when the tensor does (0 for
  // the embedding, num_hidden_layers for the head alone).
  int64_t first_layer = 0;
  bool embedding = false;  // token_embd: rows are looked up, no imatrix weighting
};

// Unsupported (naming the tensor) for a tensor the runtime holds no Linear for.
TensorLinears tensor_linears(rt::Model& model, const std::string& gguf_name);

}  // namespace qf::mixed
