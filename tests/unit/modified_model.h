// A copy of a fixture model with one weight changed, for tests of what a
// hostile or broken checkpoint does (NaN routers, huge logits).
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/tensor.h"
#include "formats/safetensors.h"

namespace qf::test {

// Copies the model folder `src` to `dst` (its other files as they are) with
// tensor `name` replaced by change(its values), written as F32.
inline void copy_model_changing(const std::filesystem::path& src, const std::filesystem::path& dst, const std::string& name,
                                const std::function<void(std::vector<float>&)>& change) {
  namespace fs = std::filesystem;
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(src))
    if (e.is_regular_file() && e.path().extension() != ".safetensors") fs::copy_file(e.path(), dst / e.path().filename());
  const Checkpoint ck = Checkpoint::open(src);
  bool found = false;
  SafetensorsWriter w(dst);
  for (const std::string& n : ck.names()) {
    const Tensor t = ck.tensor(n);
    if (n != name) {
      w.add(n, t);
      continue;
    }
    std::vector<float> v = t.to_f32_vector();
    change(v);
    w.add(n, Tensor::from_f32(v, t.shape()));
    found = true;
  }
  w.set_metadata({{"format", "pt"}});
  w.finish();
  if (!found) ADD_FAILURE() << src << " has no tensor " << name;
}

}  // namespace qf::test
