#include "inspect/hf_inspect.h"

#include <charconv>
#include <cstdio>
#include <map>
#include <regex>

#include "core/error.h"
#include "core/io.h"
#include "checkpoint/checkpoint_format.h"
#include "formats/hf/model_config.h"
#include "formats/hf/model_tensors.h"
#include "formats/hf/resolve.h"
#include "formats/safetensors.h"

namespace qf {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                                 "special_tokens_map.json", "vocab.json", "merges.txt",
                                 "added_tokens.json", "generation_config.json", "chat_template.jinja"};

json tensor_json(const TensorInfo& t) {
  return {{"name", t.name}, {"shape", t.shape}, {"dtype", dtype_name(t.dtype)}, {"bytes", t.nbytes()}};
}

json config_summary(const ModelConfig& c) {
  json j = {{"hidden_size", c.hidden_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.num_key_value_heads},
            {"head_dim", c.head_dim},
            {"intermediate_size", c.intermediate_size},
            {"vocab_size", c.vocab_size},
            {"max_position_embeddings", c.max_position_embeddings},
            {"rope_theta", c.rope_theta},
            {"rope_scaling", c.rope_scaling ? c.rope_scaling->raw : json(nullptr)},
            {"rms_norm_eps", c.rms_norm_eps},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"attention_bias", c.attention_bias},
            {"mlp_bias", c.mlp_bias},
            {"sliding_window", c.sliding_window ? json(*c.sliding_window) : json(nullptr)},
            {"torch_dtype", c.torch_dtype}};
  if (c.is_moe()) {
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    if (c.moe_intermediate_size) j["moe_intermediate_size"] = c.moe_intermediate_size;
    if (c.shared_expert_intermediate_size) j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
    j["norm_topk_prob"] = c.norm_topk_prob;
    json sparse = json::array();
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      if (c.moe_layer(i)) sparse.push_back(i);
    j["sparse_layers"] = sparse;
  }
  return j;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, units[u]);
  return buf;
}

std::string human_count(double n) {
  char buf[32];
  if (n >= 1e9) std::snprintf(buf, sizeof buf, "%.2fB", n / 1e9);
  else if (n >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  else if (n >= 1e3) std::snprintf(buf, sizeof buf, "%.1fK", n / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

}  // namespace

json inspect_model(const std::string& model, const std::string& revision) {
  ResolvedModel rm = resolve_model(model, revision);
  ModelConfig cfg = load_model_config(rm.dir);
  Checkpoint ck = Checkpoint::open(rm.dir);
  apply_hf_tensor_naming(cfg, ck);

  static const std::regex layer_re(R"(^(?:model\.)?layers\.(\d+)\.)");
  std::map<int64_t, json> layers;
  json other = json::array();
  // A vision-language model's vision tower and projector, apart.
  json parts = {{"vision_tower", {{"parameters", 0}, {"bytes", 0}, {"tensors", json::array()}}},
                {"projector", {{"parameters", 0}, {"bytes", 0}, {"tensors", json::array()}}}};
  std::map<std::string, int64_t> dtypes;
  int64_t params = 0;
  for (const auto& name : ck.names()) {
    const TensorInfo& t = ck.info(name);
    int64_t n = shape_numel(t.shape);
    params += n;
    dtypes[dtype_name(t.dtype)] += n;
    std::smatch m;
    int64_t idx = -1;  // -1: not a layer tensor (or an index beyond int64, listed with the others)
    if (std::regex_search(name, m, layer_re)) {
      const std::string digits = m[1].str();
      if (std::from_chars(digits.data(), digits.data() + digits.size(), idx).ec != std::errc()) idx = -1;
    }
    if (cfg.vlm && is_vision_tensor(name)) {
      const bool projector = name.rfind("visual.merger.", 0) == 0 || name.rfind("multi_modal_projector.", 0) == 0 ||
                             name.rfind("image_newline", 0) == 0;
      json& p = parts[projector ? "projector" : "vision_tower"];
      p["bytes"] = p["bytes"].get<uint64_t>() + t.nbytes();
      p["parameters"] = p["parameters"].get<int64_t>() + n;
      p["tensors"].push_back(tensor_json(t));
    } else if (idx >= 0) {
      json& l = layers[idx];
      if (l.is_null()) l = {{"index", idx}, {"bytes", 0}, {"parameters", 0}, {"tensors", json::array()}};
      l["bytes"] = l["bytes"].get<uint64_t>() + t.nbytes();
      l["parameters"] = l["parameters"].get<int64_t>() + n;
      l["tensors"].push_back(tensor_json(t));
    } else {
      other.push_back(tensor_json(t));
    }
  }
  json files = json::array();
  for (const auto& f : ck.files())
    files.push_back({{"file", f.path().filename().string()}, {"bytes", fs::file_size(f.path())}, {"tensors", f.tensors().size()}});
  json layer_list = json::array();
  for (auto& [_, l] : layers) layer_list.push_back(std::move(l));
  json tok = json::array();
  for (const char* f : kTokenizerFiles)
    if (path_exists(rm.dir / f)) tok.push_back(f);

  json vlm = nullptr;
  if (cfg.vlm) {
    const int64_t vision = parts["vision_tower"]["parameters"].get<int64_t>() + parts["projector"]["parameters"].get<int64_t>();
    vlm = {{"model_type", cfg.vlm->model_type},
           {"vision_config", cfg.vlm->vision},
           {"image_token_id", cfg.vlm->image_token_id},
           {"mrope_section", cfg.vlm->mrope_section},
           {"tensor_naming", ck.naming().identity() ? "as stored" : "renamed"},
           {"vision_tower", parts["vision_tower"]},
           {"projector", parts["projector"]},
           {"language_model", {{"model_type", cfg.model_type}, {"parameters", params - vision}}}};
  }
  return {{"path", rm.dir.string()},
          {"vision_language", vlm},
          {"source", {{"kind", rm.kind}, {"repo_id", rm.repo_id}, {"commit", rm.commit}}},
          {"architecture", cfg.vlm ? cfg.vlm->model_type : cfg.model_type},
          {"architectures", cfg.architectures},
          {"config", config_summary(cfg)},
          {"parameters", params},
          {"total_bytes", ck.total_bytes()},
          {"dtypes", dtypes},
          {"files", files},
          {"layers", layer_list},
          {"other_tensors", other},
          {"tokenizer_files", tok},
          {"quantization_config", cfg.quantization_config ? *cfg.quantization_config : json(nullptr)}};
}

// The checkpoint format's own one-line description ("gptq (gptq): int4 sym
// g128, desc_act", ...), or the raw JSON for other methods and for
// configurations the readers refuse.
static std::string quantization_summary(const json& q) {
  try {
    if (const CheckpointFormat* f = find_checkpoint_format(q.value("quant_method", ""))) return f->describe(q);
  } catch (const json::exception&) {
  } catch (const Error&) {  // a scheme the readers refuse: shown as written
  }
  return q.dump();
}

std::string format_inspect_report(const json& info) {
  std::string out;
  auto line = [&](const std::string& s) { out += s + "\n"; };
  char buf[512];
  line("model:        " + info["path"].get<std::string>());
  if (info["source"]["kind"] == "hf-cache")
    line("source:       Hugging Face cache, " + info["source"]["repo_id"].get<std::string>() + " @ " +
         info["source"]["commit"].get<std::string>());
  std::string archs;
  for (const auto& a : info["architectures"]) archs += (archs.empty() ? "" : ", ") + a.get<std::string>();
  line("architecture: " + info["architecture"].get<std::string>() + (archs.empty() ? "" : " (" + archs + ")"));
  const json& c = info["config"];
  std::snprintf(buf, sizeof buf, "dimensions:   hidden %lld, layers %lld, heads %lld, kv heads %lld, head_dim %lld, intermediate %lld, vocab %lld",
                (long long)c["hidden_size"], (long long)c["num_hidden_layers"], (long long)c["num_attention_heads"],
                (long long)c["num_key_value_heads"], (long long)c["head_dim"], (long long)c["intermediate_size"],
                (long long)c["vocab_size"]);
  line(buf);
  if (c.contains("num_experts")) {
    std::snprintf(buf, sizeof buf, "experts:      %lld per sparse layer (%zu of %lld layers), %lld per token%s, width %lld%s",
                  (long long)c["num_experts"], c["sparse_layers"].size(), (long long)c["num_hidden_layers"],
                  (long long)c["num_experts_per_tok"], c["norm_topk_prob"].get<bool>() ? " (weights renormalised)" : "",
                  (long long)c.value("moe_intermediate_size", 0),
                  c.contains("shared_expert_intermediate_size")
                      ? (", shared expert width " + std::to_string(c["shared_expert_intermediate_size"].get<long long>())).c_str()
                      : "");
    line(buf);
  }
  std::snprintf(buf, sizeof buf, "rope:         theta %g%s, max positions %lld; rms_norm_eps %g; tied embeddings %s",
                c["rope_theta"].get<double>(),
                c["rope_scaling"].is_null() ? "" : (", scaling " + c["rope_scaling"].dump()).c_str(),
                (long long)c["max_position_embeddings"], c["rms_norm_eps"].get<double>(),
                c["tie_word_embeddings"].get<bool>() ? "yes" : "no");
  line(buf);
  std::string dts;
  for (const auto& [k, v] : info["dtypes"].items()) dts += (dts.empty() ? "" : ", ") + k + " " + human_count(v.get<double>());
  line("parameters:   " + human_count(info["parameters"].get<double>()) + " (" + dts + ")");
  std::string files;
  for (const auto& f : info["files"]) files += (files.empty() ? "" : ", ") + f["file"].get<std::string>();
  line("weights:      " + human_bytes(info["total_bytes"].get<double>()) + " in " + std::to_string(info["files"].size()) +
       " file(s): " + files);
  std::string tok;
  for (const auto& t : info["tokenizer_files"]) tok += (tok.empty() ? "" : ", ") + t.get<std::string>();
  line("tokenizer:    " + (tok.empty() ? std::string("none found") : tok));
  line("quantization: " + (info["quantization_config"].is_null() ? std::string("none") : quantization_summary(info["quantization_config"])));
  const json& vl = info.value("vision_language", json(nullptr));
  if (!vl.is_null()) {
    const json& vc = vl["vision_config"];
    auto num = [&](std::initializer_list<const char*> keys) {
      for (const char* k : keys)
        if (vc.contains(k) && vc[k].is_number()) return std::to_string(vc[k].get<long long>());
      return std::string("?");
    };
    line("vision:       " + vl["model_type"].get<std::string>() + ": vision tower " +
         human_count(vl["vision_tower"]["parameters"].get<double>()) + " params (" +
         num({"depth", "num_hidden_layers"}) + " blocks, width " + num({"embed_dim", "hidden_size"}) + ", patch " +
         num({"patch_size"}) + "), projector " + human_count(vl["projector"]["parameters"].get<double>()) +
         " params, language model " + vl["language_model"]["model_type"].get<std::string>() + " " +
         human_count(vl["language_model"]["parameters"].get<double>()) + " params; image token " +
         std::to_string(vl["image_token_id"].get<long long>()) +
         (vl["mrope_section"].empty() ? std::string() : "; multimodal RoPE sections " + vl["mrope_section"].dump()));
  }
  line("");
  auto table = [&](const std::string& title, const json& tensors) {
    line(title);
    for (const auto& t : tensors) {
      std::string shape = "[";
      for (size_t i = 0; i < t["shape"].size(); ++i) shape += (i ? ", " : "") + std::to_string(t["shape"][i].get<int64_t>());
      shape += "]";
      std::snprintf(buf, sizeof buf, "  %-52s %-14s %-8s %12llu", t["name"].get<std::string>().c_str(), shape.c_str(),
                    t["dtype"].get<std::string>().c_str(), (unsigned long long)t["bytes"].get<uint64_t>());
      line(buf);
    }
  };
  std::snprintf(buf, sizeof buf, "  %-52s %-14s %-8s %12s", "tensor", "shape", "dtype", "bytes");
  line(buf);
  for (const auto& l : info["layers"])
    table("layer " + std::to_string(l["index"].get<int64_t>()) + " (" + human_count(l["parameters"].get<double>()) +
              " params, " + human_bytes(l["bytes"].get<double>()) + ")",
          l["tensors"]);
  if (!info["other_tensors"].empty()) table("outside the layers", info["other_tensors"]);
  if (!vl.is_null()) {
    for (const char* part : {"vision_tower", "projector"}) {
      const json& p = vl[part];
      table(std::string(part[0] == 'v' ? "vision tower" : "projector") + " (" + human_count(p["parameters"].get<double>()) +
                " params, " + human_bytes(p["bytes"].get<double>()) + ")",
            p["tensors"]);
    }
  }
  return out;
}

}  // namespace qf
