#include <cstdio>

#include "formats/gguf/gguf.h"
#include "mixed/gguf_search.h"

namespace qf::mixed {
namespace {

std::string type_name(uint32_t t) { return ggml_type_info(t)->name; }

}  // namespace

nlohmann::ordered_json gguf_mix_json(const GgufMixPlan& p) {
  nlohmann::ordered_json j;
  j["model"] = p.model;
  j["imatrix"] = p.imatrix;
  j["parameters"] = p.parameters;
  j["fixed_extra_bytes"] = p.fixed_extra_bytes;
  j["budget_bytes"] = p.budget_bytes;
  j["bytes"] = p.bytes;
  j["bits_per_weight"] = p.bits_per_weight();
  j["predicted_kld"] = p.predicted_kl;
  j["file_type"] = p.file_type_preset();
  j["solver"] = {{"exact", p.exact}, {"unit_bytes", p.unit}};
  j["lagrangian"] = {{"bytes", p.lagrangian_bytes},
                     {"predicted_kld", p.lagrangian_kl},
                     {"predicted_kld_above_exact", p.lagrangian_kl - p.predicted_kl}};
  j["probe_tokens"] = p.probe_tokens;
  j["seconds"] = {{"imatrix", p.seconds_imatrix}, {"errors", p.seconds_errors}, {"probes", p.seconds_probes}, {"solve", p.seconds_solve}};
  nlohmann::ordered_json ts = nlohmann::ordered_json::array();
  for (const GgufMixTensor& t : p.tensors) {
    const GgufCandidate& c = t.candidates[static_cast<size_t>(t.chosen)];
    nlohmann::ordered_json e;
    e["name"] = t.name;
    e["type"] = type_name(c.type);
    e["bytes"] = c.bytes;
    e["parameters"] = t.parameters;
    if (t.searched) {
      e["predicted_kld"] = c.predicted_kl;
      e["lagrangian_type"] = type_name(t.candidates[static_cast<size_t>(t.lagrangian)].type);
      e["fit"] = {{"scale", t.scale}, {"power", t.power}};
      nlohmann::ordered_json probes = nlohmann::ordered_json::array();
      for (const GgufMixTensor::Probe& pr : t.probes)
        probes.push_back({{"type", type_name(pr.type)}, {"error", pr.error}, {"measured_kld", pr.measured_kl}});
      e["probes"] = probes;
      nlohmann::ordered_json cands = nlohmann::ordered_json::array();
      for (const GgufCandidate& cd : t.candidates)
        cands.push_back({{"type", type_name(cd.type)}, {"bytes", cd.bytes}, {"error", cd.error}, {"predicted_kld", cd.predicted_kl}});
      e["candidates"] = cands;
    }
    ts.push_back(e);
  }
  j["tensors"] = ts;
  nlohmann::ordered_json presets = nlohmann::ordered_json::array();
  for (const GgufMixPoint& q : p.presets)
    presets.push_back({{"name", q.name}, {"bytes", q.bytes}, {"bits_per_weight", 8.0 * static_cast<double>(q.bytes) / static_cast<double>(p.parameters)}, {"predicted_kld", q.predicted_kl}});
  j["presets"] = presets;
  nlohmann::ordered_json curve = nlohmann::ordered_json::array();
  for (const GgufMixPoint& q : p.curve)
    curve.push_back({{"bytes", q.bytes}, {"bits_per_weight", 8.0 * static_cast<double>(q.bytes) / static_cast<double>(p.parameters)}, {"predicted_kld", q.predicted_kl}});
  j["curve"] = curve;
  return j;
}

std::string format_gguf_mix(const GgufMixPlan& p) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-32s %-6s %12s %14s %8s\n", "tensor", "type", "bytes", "predicted KLD", "share");
  out += line;
  for (const GgufMixTensor& t : p.tensors) {
    const GgufCandidate& c = t.candidates[static_cast<size_t>(t.chosen)];
    if (t.searched)
      std::snprintf(line, sizeof line, "%-32s %-6s %12llu %14.3e %7.1f%%\n", t.name.c_str(), type_name(c.type).c_str(),
                    static_cast<unsigned long long>(c.bytes), c.predicted_kl, p.predicted_kl > 0 ? 100.0 * c.predicted_kl / p.predicted_kl : 0.0);
    else
      std::snprintf(line, sizeof line, "%-32s %-6s %12llu %14s\n", t.name.c_str(), type_name(c.type).c_str(),
                    static_cast<unsigned long long>(c.bytes), "(kept)");
    out += line;
  }
  const auto bpw = [&](uint64_t b) { return 8.0 * static_cast<double>(b) / static_cast<double>(p.parameters); };
  std::snprintf(line, sizeof line, "total: %llu bytes of tensor data (%.4f bits per weight; budget %llu), predicted KLD %.6f%s\n",
                static_cast<unsigned long long>(p.bytes), p.bits_per_weight(), static_cast<unsigned long long>(p.budget_bytes),
                p.predicted_kl, p.exact ? "" : " (table coarsened: sizes rounded up)");
  out += line;
  std::snprintf(line, sizeof line, "lagrangian shortcut: %llu bytes (%.4f bpw), predicted KLD %.6f (%+.1f%% against the exact allocation)\n",
                static_cast<unsigned long long>(p.lagrangian_bytes), bpw(p.lagrangian_bytes), p.lagrangian_kl,
                p.predicted_kl > 0 ? 100.0 * (p.lagrangian_kl / p.predicted_kl - 1.0) : 0.0);
  out += line;
  out += "presets under the same model:\n";
  for (const GgufMixPoint& q : p.presets) {
    std::snprintf(line, sizeof line, "  %-7s %12llu bytes (%.4f bpw), predicted KLD %.6f\n", q.name.c_str(),
                  static_cast<unsigned long long>(q.bytes), bpw(q.bytes), q.predicted_kl);
    out += line;
  }
  return out;
}

}  // namespace qf::mixed
