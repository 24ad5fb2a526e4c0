// How a checkpoint spells its tensor names, against the names quantforge
// works with. A vision-language model's language model is read and written
// under the text model's names ("model.layers.N.", "model.embed_tokens",
// "model.norm", "lm_head"), whatever the checkpoint calls them
// ("language_model.model.", "model.language_model.", ...); its vision tower
// and projector keep names of their own ("visual.", "vision_tower.",
// "multi_modal_projector."). A TensorNaming is a list of prefix pairs; a
// name that no pair's prefix starts is the same in both spellings.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace qf {

struct TensorNaming {
  // (working prefix, stored prefix), e.g. ("model.", "model.language_model.").
  std::vector<std::pair<std::string, std::string>> prefixes;

  bool identity() const;
  // The stored spelling of a working name: the pair with the longest working
  // prefix that starts it.
  std::string to_stored(const std::string& name) const;
  // The stored spelling of a module name (a tensor name without its last
  // component: "lm_head" of a LLaVA checkpoint is "language_model.lm_head").
  std::string module_to_stored(const std::string& module) const;
  // The working spelling of a stored name: the pair with the longest stored
  // prefix that starts it.
  std::string to_working(const std::string& stored) const;
};

}  // namespace qf
