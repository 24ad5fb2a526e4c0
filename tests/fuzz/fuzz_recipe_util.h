// Shared by the recipe fuzz targets (fuzz_recipe.cpp, fuzz_recipe_json.cpp):
// what is done with a recipe that parsed.
#pragma once

#include "fuzz_util.h"
#include "recipe/recipe.h"

namespace qf::fuzz {

// Every scheme described and validated, and the scheme chosen for a few
// module names, each step under run() (qf::Error is the expected outcome).
inline void exercise_recipe(const qf::Recipe& r) {
  static const char* const modules[] = {"model.layers.0.self_attn.q_proj", "model.layers.11.mlp.down_proj", "lm_head"};
  for (const qf::ModifierSpec& m : r.modifiers) {
    for (const auto& g : m.groups) {
      run([&] {
        g.weights.describe();
        g.weights.validate(g.where, 4096);
      });
      if (g.input_activations) run([&] { g.input_activations->validate(g.where); });
    }
    if (m.kv_cache_scheme) run([&] { m.kv_cache_scheme->validate(m.where); });
    for (const char* name : modules) run([&] { qf::scheme_for(m, name); });
  }
}

}  // namespace qf::fuzz
