// The bundled fixture model (tests/data/fixture-llama) quantized with the
// test recipe tests/data/recipes/NAME.yaml on tests/data/text/calibration.txt,
// once per process: later calls with the same name return the same folder,
// which is removed when the process ends.
#pragma once

#include <filesystem>
#include <string>

#include "calibration/quantize_model.h"
#include "core/thread_pool.h"
#include "test_util.h"

namespace qf::test {

inline std::filesystem::path fixture_model() { return source_dir() / "tests" / "data" / "fixture-llama"; }

// A QuantizeJob with the four paths set and the rest at their defaults.
inline QuantizeJob quantize_job(const std::string& model, const std::filesystem::path& recipe,
                                const std::filesystem::path& out, const std::filesystem::path& calib) {
  QuantizeJob j;
  j.model = model, j.recipe = recipe, j.out = out, j.calib = calib;
  return j;
}

inline std::filesystem::path quantized_fixture(const std::string& recipe) {
  static TempDir dir;
  const auto out = dir.path() / recipe;
  if (!std::filesystem::exists(out))
    quantize_model(quantize_job(fixture_model().string(), source_dir() / "tests/data/recipes" / (recipe + ".yaml"), out,
                                source_dir() / "tests/data/text/calibration.txt"),
                   ThreadPool::global(), [](const std::string&) {});
  return out;
}

}  // namespace qf::test
