#include <map>

#include "convert/hf_to_gguf.h"
#include "checkpoint/lora_merge.h"
#include "core/error.h"
#include "core/io.h"
#include "core/text_input.h"
#include "formats/gguf/gguf.h"
#include "formats/hf/model_config.h"
#include "formats/safetensors.h"
#include "mixed/gguf_search_internal.h"
#include "quantizers/gguf_mix.h"
#include "quantizers/kquants.h"

namespace qf::mixed {
using detail::allocate;
using detail::budget_of;
using detail::kComputedFrom;
using detail::read_or_compute_imatrix;

namespace {

uint32_t type_by_name(const std::string& name, const std::string& where) {
  for (uint32_t id = 0; id < 64; ++id) {
    const GgmlTypeInfo* i = ggml_type_info(id);
    if (i && name == i->name && kquants::is_supported(id)) return id;
  }
  throw Error(ErrorKind::InvalidInput, where + ": unknown tensor type '" + name + "'");
}

}  // namespace

GgufMixPlan replan_gguf_mix(const nlohmann::json& j, const std::string& where, const std::filesystem::path& dir,
                            const GgufMixOptions& opts, ThreadPool& pool) {
  GgufMixPlan plan;
  try {
    plan.model = dir.string();
    plan.imatrix = j.at("imatrix").get<std::string>();
    plan.parameters = j.at("parameters").get<uint64_t>();
    plan.fixed_extra_bytes = j.at("fixed_extra_bytes").get<uint64_t>();
    plan.probe_tokens = j.at("probe_tokens").get<int64_t>();
    for (const auto& e : j.at("tensors")) {
      GgufMixTensor t;
      t.name = e.at("name").get<std::string>();
      t.parameters = e.at("parameters").get<uint64_t>();
      t.searched = e.contains("candidates");
      if (!t.searched) {
        t.candidates.push_back({type_by_name(e.at("type").get<std::string>(), where), e.at("bytes").get<uint64_t>(), 0, 0});
      } else {
        t.scale = e.at("fit").at("scale").get<double>();
        t.power = e.at("fit").at("power").get<double>();
        for (const auto& pr : e.at("probes"))
          t.probes.push_back({type_by_name(pr.at("type").get<std::string>(), where), pr.at("error").get<double>(),
                              pr.at("measured_kld").get<double>()});
        for (const auto& cd : e.at("candidates"))
          t.candidates.push_back({type_by_name(cd.at("type").get<std::string>(), where), cd.at("bytes").get<uint64_t>(),
                                  cd.at("error").get<double>(), cd.at("predicted_kld").get<double>()});
        if (t.candidates.empty()) throw Error(ErrorKind::InvalidInput, where + ": " + t.name + " has no candidate");
        for (const GgufCandidate& cd : t.candidates)
          if (!(cd.predicted_kl >= 0 && std::isfinite(cd.predicted_kl)))
            throw Error(ErrorKind::InvalidInput, where + ": " + t.name + " has a predicted KL divergence that is negative or not finite");
      }
      plan.tensors.push_back(std::move(t));
    }
    for (const auto& e : j.at("presets"))
      plan.presets.push_back({e.at("name").get<std::string>(), e.at("bytes").get<uint64_t>(), e.at("predicted_kld").get<double>()});
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::InvalidInput, where + ": not a plan written by convert --target-bpw (" + e.what() + ")");
  }
  // The plan must describe this model's tensors.
  ModelConfig c = load_model_config(dir);
  Checkpoint ck = open_checkpoint_with_loras(dir, opts.loras);
  const GgufLayout layout = gguf_layout(c, ck, dir.string());
  std::map<std::string, uint64_t> params;
  for (const gguf_mix::TensorDesc& d : layout.descs) params[d.name] = detail::elements(d.ne);
  if (params.size() != plan.tensors.size())
    throw Error(ErrorKind::InvalidInput, where + ": the plan has " + std::to_string(plan.tensors.size()) + " tensors, the model " +
                                             dir.string() + " " + std::to_string(params.size()));
  for (const GgufMixTensor& t : plan.tensors) {
    const auto it = params.find(t.name);
    if (it == params.end() || it->second != t.parameters)
      throw Error(ErrorKind::InvalidInput, where + ": tensor " + t.name + " is not the model's (" + dir.string() + ")");
  }
  allocate(plan, budget_of(plan, opts));
  // The weights are quantized with the imatrix the plan measured with: given
  // again, or its file, or computed again from the text.
  GgufMixOptions io = opts;
  if (io.imatrix.empty() && io.calib_text.empty()) {
    if (plan.imatrix.rfind(kComputedFrom, 0) == 0)
      throw Error(ErrorKind::Usage, where + " was measured with an imatrix " + plan.imatrix +
                                        ": give --calib (the same text) or --imatrix so the weights are quantized with it");
    io.imatrix = plan.imatrix;
  }
  if (!io.imatrix.empty()) {
    plan.imatrix_data = std::make_shared<Imatrix>(read_imatrix(io.imatrix));
    plan.imatrix = io.imatrix.string();
  } else {
    std::unique_ptr<rt::Model> model = rt::load_hf_model(dir, std::nullopt, rt::LoraLoad{opts.loras, rt::LoraLoad::Mode::Merge});
    std::unique_ptr<Tokenizer> tok = load_tokenizer(dir);
    plan.imatrix_data = std::make_shared<Imatrix>(read_or_compute_imatrix(*model, *tok, read_text_input(io.calib_text), io, pool));
    plan.imatrix = kComputedFrom + io.calib_text.string();
  }
  return plan;
}

void apply_plan(const GgufMixPlan& plan, GgufConvertOptions& g) {
  g.overrides.tensors = plan.types();
  g.imatrix_data = plan.imatrix_data;
  if (g.imatrix.empty()) g.imatrix = plan.imatrix;
  g.preset = plan.file_type_preset();
}

GgufMixPlan plan_for_budget(const std::filesystem::path& dir, const GgufMixOptions& opts,
                            const std::filesystem::path& sensitivity, ThreadPool& pool) {
  if (sensitivity.empty()) return plan_gguf_mix(dir, opts, pool);
  if (!opts.types.empty()) throw Error(ErrorKind::Usage, "a plan given as sensitivity is solved again as it is: the types do not apply");
  const nlohmann::json j = nlohmann::json::parse(read_text_file(sensitivity), nullptr, false);
  if (j.is_discarded()) throw Error(ErrorKind::InvalidInput, sensitivity.string() + ": not JSON");
  return replan_gguf_mix(j, sensitivity.string(), dir, opts, pool);
}

}  // namespace qf::mixed
