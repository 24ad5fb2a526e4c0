// GGUF LoRA adapters: written from PEFT adapters, read for GGUF bases.
#include "convert/gguf_lora.h"

#include <cmath>
#include <map>
#include <set>

#include "convert/hf_to_gguf.h"
#include "core/error.h"
#include "core/io.h"
#include "formats/gguf/gguf_writer.h"
#include "formats/hf/model_tensors.h"

namespace qf {
namespace {

uint32_t ggml_type_of(DType t, const std::string& where) {
  switch (t) {
    case DType::F32: return ggml_type::F32;
    case DType::F16: return ggml_type::F16;
    case DType::BF16: return ggml_type::BF16;
    default: throw unsupported(where, std::string("LoRA tensors are written as F32, F16 or BF16, not ") + dtype_name(t));
  }
}

// The modules a GGUF adapter may hold: each layer's attention and dense MLP
// Linears, and the output head (llama.cpp applies adapters to these).
std::map<std::string, std::string> gguf_lora_modules(const ModelConfig& c) {
  std::map<std::string, std::string> out;  // HF module -> GGUF weight name
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const HfLinear& l : hf_layer_linears(c, i))
      if (l.expert == kDenseLinear || l.expert == kSharedExpertLinear) {
        const std::string g = gguf_tensor_name(p + l.name + ".weight");
        if (!g.empty()) out[p + l.name] = g;
      }
  }
  out["lm_head"] = "output.weight";
  return out;
}

}  // namespace

DType parse_gguf_lora_type(const std::string& name, const std::string& flag) {
  if (name == "F32" || name == "f32") return DType::F32;
  if (name == "BF16" || name == "bf16") return DType::BF16;
  if (name == "F16" || name == "f16") return DType::F16;
  throw Error(ErrorKind::Usage, flag + " " + name + ": a GGUF LoRA adapter is written in F16 (default), BF16 or F32");
}

GgufLoraResult write_gguf_lora(const LoraSpec& spec, const std::filesystem::path& base_dir,
                               const std::filesystem::path& out, DType type) {
  const ModelConfig c = load_model_config(base_dir);
  const std::string where = spec.path.string();
  if (c.quantization_config)
    throw unsupported((base_dir / "config.json").string(), "the base of a GGUF adapter is the unquantized model");
  const std::string arch = gguf_arch(c, (base_dir / "config.json").string());
  Checkpoint ck = Checkpoint::open(base_dir);
  apply_hf_tensor_naming(c, ck);
  const LoraAdapter a = read_peft_adapter(spec, c, ck);
  const uint32_t gtype = ggml_type_of(type, out.string());
  if (a.dora)
    throw unsupported(where, "DoRA adapters have no llama.cpp adapter form; merge them instead "
                             "(quantforge convert BASE --lora ADAPTER --to gguf)");
  if (!a.replaced.empty())
    throw unsupported(where, "the adapter replaces '" + a.replaced.front().tensor +
                                 "' whole (modules_to_save or a trained bias), which a llama.cpp adapter cannot hold; "
                                 "merge it instead (quantforge convert BASE --lora ADAPTER --to gguf)");
  const std::map<std::string, std::string> names = gguf_lora_modules(c);
  // One alpha per file: the config's lora_alpha; each pair's own scale is
  // restored through lora_b where alpha / r differs from it.
  const auto la = a.config.find("lora_alpha");
  const float alpha = la != a.config.end() && la->is_number() ? la->get<float>() : 8.0f;
  GgufWriter w(out);
  w.add_string("general.architecture", arch);
  w.add_string("general.type", "adapter");
  w.add_string("general.name", spec.path.filename().string());
  w.add_u32("general.file_type", type == DType::F32 ? 0u : type == DType::F16 ? 1u : 32u);
  w.add_string("adapter.type", "lora");
  w.add_f32("adapter.lora.alpha", alpha);
  GgufLoraResult res;
  res.alpha = alpha;
  for (const LoraModule& m : a.modules) {
    const auto it = names.find(m.module);
    if (m.embedding || it == names.end())
      throw unsupported(where, "module '" + m.module + "' has no llama.cpp adapter form (attention, dense MLP and "
                               "lm_head only); merge the adapter instead");
    const std::string& g = it->second;
    const int64_t r = m.rank(), in = m.a.dim(1), rows = m.b.dim(0);
    const float llama_scale = alpha != 0 ? alpha / static_cast<float>(r) : 1.0f;
    const float factor = m.scale / llama_scale;
    if (factor != 1.0f) ++res.rescaled;
    std::vector<float> b(static_cast<size_t>(rows * r));
    const int64_t heads = permuted_qk_heads(c, arch, g);
    const float* src = m.b.data_as<float>();
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t from = permuted_qk_source(row, heads, rows);
      for (int64_t k = 0; k < r; ++k) b[static_cast<size_t>(row * r + k)] = src[from * r + k] * factor;
    }
    const Tensor ta = m.a.to(type);
    const Tensor tb = Tensor::from_f32(b, {rows, r}).to(type);
    w.add_tensor(g + ".lora_a", gtype, {static_cast<uint64_t>(in), static_cast<uint64_t>(r)}, ta.data(), ta.nbytes());
    w.add_tensor(g + ".lora_b", gtype, {static_cast<uint64_t>(r), static_cast<uint64_t>(rows)}, tb.data(), tb.nbytes());
    res.tensors += 2;
  }
  res.path = w.finish();
  std::error_code ec;
  res.bytes = std::filesystem::file_size(res.path, ec);
  return res;
}

LoraAdapter read_gguf_lora(const LoraSpec& spec, const ModelConfig& c, const std::string& arch) {
  const std::string where = spec.path.string();
  if (is_folder(spec.path))
    throw unsupported(where, "a GGUF base model takes GGUF LoRA adapters; convert this one with "
                             "`quantforge convert ADAPTER --to gguf-lora --base MODEL -o A.gguf`");
  const GgufFile f = GgufFile::open(spec.path);
  const std::string type = f.has("general.type") ? f.get_string("general.type") : "";
  if (type != "adapter") throw invalid_input(where, "general.type is '" + type + "', expected 'adapter' (not a LoRA adapter)");
  if (f.get_string("adapter.type") != "lora")
    throw unsupported(where, "adapter.type '" + f.get_string("adapter.type") + "' is not read (lora only)");
  const std::string a_arch = f.get_string("general.architecture");
  if (a_arch != arch)
    throw invalid_input(where, "the adapter is for architecture '" + a_arch + "', the base model is '" + arch + "'");
  const float alpha = f.has("adapter.lora.alpha") ? f.get_f32("adapter.lora.alpha") : 0.0f;
  std::map<std::string, std::string> module_of;  // GGUF weight name -> HF module
  for (const auto& [m, g] : gguf_lora_modules(c)) module_of[g] = m;
  LoraAdapter a;
  a.source = where;
  a.user_scale = spec.scale;
  a.config = {{"lora_alpha", alpha}};
  auto read = [&](const GgufTensorInfo& t) {
    if (t.type != ggml_type::F32 && t.type != ggml_type::F16 && t.type != ggml_type::BF16)
      throw unsupported(where, "tensor '" + t.name + "' is of ggml type " + std::to_string(t.type) +
                                   "; LoRA tensors are read in F32, F16 or BF16");
    const DType dt = t.type == ggml_type::F32 ? DType::F32 : t.type == ggml_type::F16 ? DType::F16 : DType::BF16;
    if (t.dims.size() != 2) throw invalid_input(where, "tensor '" + t.name + "' is not 2-D");
    const Shape shape = {static_cast<int64_t>(t.dims[1]), static_cast<int64_t>(t.dims[0])};
    return Tensor::view_of(f.mapping(), f.tensor_data(t), dt, shape).to(DType::F32);
  };
  std::set<std::string> seen;
  for (const GgufTensorInfo& t : f.tensors()) {
    const bool is_a = t.name.size() > 7 && t.name.compare(t.name.size() - 7, 7, ".lora_a") == 0;
    const bool is_b = t.name.size() > 7 && t.name.compare(t.name.size() - 7, 7, ".lora_b") == 0;
    if (!is_a && !is_b) throw unsupported(where, "tensor '" + t.name + "' is not a lora_a/lora_b tensor");
    const std::string g = t.name.substr(0, t.name.size() - 7);
    if (!seen.insert(g).second) continue;
    const auto it = module_of.find(g);
    if (it == module_of.end()) throw invalid_input(where, "tensor '" + t.name + "' adapts no Linear the base model has");
    const GgufTensorInfo* ta = f.find_tensor(g + ".lora_a");
    const GgufTensorInfo* tb = f.find_tensor(g + ".lora_b");
    if (!ta || !tb) throw invalid_input(where, "'" + g + "' has only one of lora_a and lora_b");
    LoraModule m;
    m.module = it->second;
    m.a = read(*ta);  // ne [in, r] -> [r, in]
    m.b = read(*tb);  // ne [r, out] -> [out, r]
    if (m.a.dim(0) != m.b.dim(1))
      throw invalid_input(where, "'" + g + "': lora_a has rank " + std::to_string(m.a.dim(0)) + ", lora_b " +
                                     std::to_string(m.b.dim(1)));
    m.alpha = alpha;
    m.scale = static_cast<float>((alpha != 0 ? alpha / static_cast<float>(m.rank()) : 1.0f) * spec.scale);
    a.modules.push_back(std::move(m));
  }
  if (a.modules.empty()) throw invalid_input(where, "the adapter holds no lora_a/lora_b tensors");
  return a;
}

}  // namespace qf
