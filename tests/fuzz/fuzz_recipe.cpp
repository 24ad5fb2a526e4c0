// Fuzz target: a YAML recipe (llm-compressor syntax plus quantforge's
// calibration/export sections), parsed and validated; every modifier's
// schemes are described and validated, and its targets/ignore patterns are
// matched against a few module names. An input starting with "---" is also
// read as a markdown recipe card (YAML front matter).
#include "fuzz_util.h"
#include "recipe/recipe.h"

namespace {

void exercise(const qf::Recipe& r) {
  static const char* const modules[] = {"model.layers.0.self_attn.q_proj", "model.layers.11.mlp.down_proj", "lm_head"};
  for (const qf::ModifierSpec& m : r.modifiers) {
    for (const auto& g : m.groups) {
      qf::fuzz::run([&] {
        g.weights.describe();
        g.weights.validate(g.where, 4096);
      });
      if (g.input_activations) qf::fuzz::run([&] { g.input_activations->validate(g.where); });
    }
    if (m.kv_cache_scheme) qf::fuzz::run([&] { m.kv_cache_scheme->validate(m.where); });
    for (const char* name : modules) qf::fuzz::run([&] { qf::scheme_for(m, name); });
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  qf::fuzz::run([&] { exercise(qf::parse_recipe_text(text, "recipe.yaml")); });
  if (text.rfind("---", 0) == 0) {
    const auto path = qf::fuzz::write_file("recipe/recipe.md", text);
    qf::fuzz::run([&] { exercise(qf::parse_recipe_file(path)); });
  }
  return 0;
}
