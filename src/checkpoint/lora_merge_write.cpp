// `quantforge merge`: the base folder with its adapters merged, written as a
// Hugging Face folder in the base's dtype.
#include <set>

#include "checkpoint/lora_merge.h"
#include "core/error.h"
#include "core/io.h"

namespace qf {

MergeResult write_merged_model(const std::filesystem::path& base_dir, const std::vector<LoraSpec>& specs,
                               const std::filesystem::path& out) {
  namespace fs = std::filesystem;
  if (specs.empty()) throw Error(ErrorKind::Usage, "merge needs at least one --lora adapter");
  const Checkpoint ck = open_checkpoint_with_loras(base_dir, specs);
  StagingDir stage(out);
  MergeResult res;
  {
    SafetensorsWriter writer(stage.path());
    writer.set_metadata({{"format", "pt"}});
    for (const std::string& name : ck.names()) {
      const Tensor t = ck.tensor(name);
      if (ck.overlay() && ck.overlay()->covers(name)) ++res.merged;
      writer.add(name, t);
      res.bytes += t.nbytes();
    }
    writer.finish();
  }
  // Everything else of the base (config, tokenizer, generation config, ...):
  // the weights' files are the ones just written.
  for (const fs::directory_entry& e : fs::directory_iterator(base_dir)) {
    const std::string n = e.path().filename().string();
    if (!e.is_regular_file() || e.path().extension() == ".safetensors" || n == "model.safetensors.index.json" ||
        e.path().extension() == ".bin" || e.path().extension() == ".pt" || e.path().extension() == ".pth")
      continue;
    fs::copy_file(e.path(), stage.path() / n);
  }
  stage.commit();
  res.path = out;
  res.tensors = static_cast<int64_t>(ck.names().size());
  return res;
}

}  // namespace qf
