// Fuzz target: a YAML recipe (llm-compressor syntax plus quantforge's
// calibration/export sections), parsed and validated; every modifier's
// schemes are described and validated, and its targets/ignore patterns are
// matched against a few module names. An input starting with "---" is also
// read as a markdown recipe card (YAML front matter).
#include "fuzz_recipe_util.h"
#include "fuzz_util.h"
#include "recipe/recipe.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  qf::fuzz::run([&] { qf::fuzz::exercise_recipe(qf::parse_recipe_text(text, "recipe.yaml")); });
  if (text.rfind("---", 0) == 0) {
    const auto path = qf::fuzz::write_file("recipe/recipe.md", text);
    qf::fuzz::run([&] { qf::fuzz::exercise_recipe(qf::parse_recipe_file(path)); });
  }
  return 0;
}
