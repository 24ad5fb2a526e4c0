#include "inspect/gguf_inspect.h"

#include <cstdio>
#include <map>

#include "formats/gguf/gguf.h"
#include "quantizers/gguf_mix.h"

namespace qf {

using nlohmann::json;

std::string llama_ftype_name(uint32_t ftype) {
  for (const auto& p : gguf_mix::presets())
    if (p.ftype == ftype) return p.name;
  return "ftype " + std::to_string(ftype);
}

namespace {

json value_json(const GgufFile& f, const std::string& key) {
  const GgufValue& v = f.value(key);
  switch (v.type) {
    case GgufType::String: return v.s;
    case GgufType::Bool: return v.u != 0;
    case GgufType::F32:
    case GgufType::F64: return v.f;
    case GgufType::I8:
    case GgufType::I16:
    case GgufType::I32:
    case GgufType::I64: return v.i;
    case GgufType::Array: {
      json a = {{"array", gguf_type_name(v.elem_type)}, {"count", v.count}};
      if (v.count <= 8 && v.elem_type == GgufType::String) a["values"] = f.get_string_array(key);
      return a;
    }
    default: return v.u;
  }
}

}  // namespace

json inspect_gguf(const std::filesystem::path& file) {
  const GgufFile f = GgufFile::open(file);
  json meta = json::object();
  for (const auto& k : f.keys()) meta[k] = value_json(f, k);
  json tensors = json::array();
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_type;  // type -> (elements, bytes)
  uint64_t total = 0, elements = 0;
  for (const auto& t : f.tensors()) {
    const GgmlTypeInfo* info = ggml_type_info(t.type);
    const std::string tn = info ? info->name : "type " + std::to_string(t.type);
    tensors.push_back({{"name", t.name}, {"ne", t.dims}, {"type", tn}, {"bytes", t.nbytes}});
    by_type[tn].first += t.numel();
    by_type[tn].second += t.nbytes;
    total += t.nbytes;
    elements += t.numel();
  }
  // inspect describes malformed files too: keys of the wrong type are shown
  // as they are in the metadata, not interpreted.
  const GgufValue* av = f.find("general.architecture");
  const std::string arch = av && av->type == GgufType::String ? av->s : "";
  json types = json::object();
  for (const auto& [k, v] : by_type)
    types[k] = {{"elements", v.first}, {"bytes", v.second}, {"bits_per_weight", v.first ? 8.0 * v.second / v.first : 0.0}};
  json j = {{"path", file.string()},
            {"format", "gguf"},
            {"version", f.version()},
            {"alignment", f.alignment()},
            {"architecture", arch},
            {"tensor_count", f.tensors().size()},
            {"elements", elements},
            {"tensor_bytes", total},
            {"bits_per_weight", elements ? 8.0 * total / elements : 0.0},
            {"types", types},
            {"metadata", meta},
            {"tensors", tensors}};
  if (const GgufValue* ft = f.find("general.file_type"); ft && ft->type == GgufType::U32)
    j["file_type"] = llama_ftype_name(static_cast<uint32_t>(ft->u));
  return j;
}

std::string format_gguf_report(const json& info) {
  std::string out;
  char buf[512];
  auto line = [&](const std::string& s) { out += s + "\n"; };
  line("model:        " + info["path"].get<std::string>() + " (GGUF v" + std::to_string(info["version"].get<int>()) + ")");
  line("architecture: " + info["architecture"].get<std::string>() +
       (info.contains("file_type") ? ", file type " + info["file_type"].get<std::string>() : ""));
  const json& m = info["metadata"];
  const std::string a = info["architecture"];
  // -1 when absent or not an integer (a malformed file is still reported).
  auto num = [&](const std::string& k) -> long long {
    auto it = m.find(a + "." + k);
    return it != m.end() && it->is_number_integer() ? it->get<long long>() : -1;
  };
  std::snprintf(buf, sizeof buf, "dimensions:   hidden %lld, layers %lld, heads %lld, kv heads %lld, ffn %lld, context %lld",
                num("embedding_length"), num("block_count"), num("attention.head_count"),
                num("attention.head_count_kv"), num("feed_forward_length"), num("context_length"));
  line(buf);
  std::snprintf(buf, sizeof buf, "tensors:      %zu, %.2f MiB, %.3f bits per weight", info["tensors"].size(),
                info["tensor_bytes"].get<double>() / 1048576.0, info["bits_per_weight"].get<double>());
  line(buf);
  for (const auto& [k, v] : info["types"].items()) {
    std::snprintf(buf, sizeof buf, "  %-8s %12.0f elements %10.2f MiB  %.3f bpw", k.c_str(), v["elements"].get<double>(),
                  v["bytes"].get<double>() / 1048576.0, v["bits_per_weight"].get<double>());
    line(buf);
  }
  line("metadata:");
  for (const auto& [k, v] : m.items()) line("  " + k + " = " + v.dump(-1, ' ', false, json::error_handler_t::replace));
  line("tensor table:");
  for (const auto& t : info["tensors"]) {
    std::snprintf(buf, sizeof buf, "  %-40s %-20s %-6s %12llu", t["name"].get<std::string>().c_str(), t["ne"].dump().c_str(),
                  t["type"].get<std::string>().c_str(), static_cast<unsigned long long>(t["bytes"].get<uint64_t>()));
    line(buf);
  }
  return out;
}

}  // namespace qf
