#include "flags.h"

#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/thread_pool.h"

namespace qf::cli {
namespace {

// Parses the whole of `s` as an integer; false for anything else (a sign and
// digits only, no spaces, no fraction, within int64).
bool parse_int(const std::string& s, int64_t& v) {
  if (s.empty()) return false;
  size_t pos = 0;
  try {
    v = std::stoll(s, &pos, 10);
  } catch (...) {
    return false;
  }
  return pos == s.size();
}

bool parse_number(const std::string& s, double& v) {
  if (s.empty()) return false;
  size_t pos = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    return false;
  }
  return pos == s.size();
}

std::string num(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

}  // namespace

CLI::Validator int_range(int64_t lo, int64_t hi) {
  const std::string want = "must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, want](std::string& s) -> std::string {
        int64_t v = 0;
        if (!parse_int(s, v) || v < lo || v > hi) return want + ", got '" + s + "'";
        return {};
      },
      "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

CLI::Validator int_at_least(int64_t lo) {
  const std::string want = "must be an integer >= " + std::to_string(lo);
  return CLI::Validator(
      [lo, want](std::string& s) -> std::string {
        int64_t v = 0;
        if (!parse_int(s, v) || v < lo) return want + ", got '" + s + "'";
        return {};
      },
      "INT >= " + std::to_string(lo));
}

CLI::Validator finite_at_least(double lo, bool strict, double hi, bool has_hi) {
  std::string want = std::string("must be a finite number ") + (strict ? "> " : ">= ") + num(lo);
  if (has_hi) want += " and <= " + num(hi);
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        double v = 0;
        if (!parse_number(s, v) || !std::isfinite(v) || (strict ? !(v > lo) : !(v >= lo)) || (has_hi && !(v <= hi)))
          return want + ", got '" + s + "'";
        return {};
      },
      std::string("NUMBER ") + (strict ? "> " : ">= ") + num(lo));
}

CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        double v = 0;
        if (!parse_number(s, v) || !std::isfinite(v)) return "must be a finite number, got '" + s + "'";
        return {};
      },
      "NUMBER");
}

CLI::Validator gate_bound(eval::GateBound b) {
  const std::string rule = eval::gate_bound_rule(b);
  return CLI::Validator(
      [b, rule](std::string& s) -> std::string {
        double v = 0;
        if (!parse_number(s, v) || !eval::gate_bound_valid(b, v)) return rule + ", got '" + s + "'";
        return {};
      },
      b == eval::GateBound::PplDelta ? "NUMBER" : b == eval::GateBound::PplRatio ? "NUMBER > 0" : "NUMBER >= 0");
}

void add_threads_option(CLI::App* cmd, int& threads) {
  cmd->add_option("--threads", threads, "threads (default: QF_THREADS or all cores)")
      ->check(int_range(1, ThreadPool::max_threads()));
}

void add_device_option(CLI::App* cmd, std::string& device) {
  cmd->add_option("--device", device,
                  "where the work runs: cpu (default), cuda, auto (cuda when a CUDA device is usable, else cpu) "
                  "or host (the device code built for the CPU)")
      ->check(CLI::IsMember({"cpu", "cuda", "host", "auto"}));
}

device::Kind resolve_device(const std::string& word, const std::string& command, int threads) {
  const device::Kind k = device::resolve(word, command + " --device " + word);
  device::set_host_threads(threads);
  return k;
}

void add_kv_options(CLI::App* cmd, KvFlags& kv) {
  cmd->add_option("--kv-dtype", kv.both,
                  "KV-cache type for keys and values: f16 (default), f8, int8, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, "
                  "nvfp4, kivi2, kivi4, or a TurboQuant preset (turboquant_k8v4, turboquant_4bit_nc, "
                  "turboquant_k3v4_nc, turboquant_3bit_nc)");
  cmd->add_option("--kv-k-dtype", kv.k, "KV-cache type of the keys (overrides --kv-dtype for them)");
  cmd->add_option("--kv-v-dtype", kv.v, "KV-cache type of the values (overrides --kv-dtype for them)");
  cmd->add_option("--kv-rotation", kv.rotation,
                  "none (default) or hadamard: rotate Q/K (quantized keys) and V (quantized values) as llama.cpp does");
  cmd->add_option("--kv-f16-edge-layers", kv.f16_edge,
                  "TurboQuant presets: keep this many first and last layers in f16 (default: vLLM's min(2, layers/2))")
      ->check(int_range(0, 1 << 20));
}

rt::LoraLoad LoraFlags::load() const {
  rt::LoraLoad l;
  for (const std::string& a : adapters) l.adapters.push_back(parse_lora_spec(a, "--" + prefix + "lora"));
  l.mode = rt::parse_lora_mode(mode, "--" + prefix + "lora-mode");
  return l;
}

void add_lora_options(CLI::App* cmd, LoraFlags& lora, bool with_mode, const std::string& prefix) {
  lora.prefix = prefix;
  const std::string whose = prefix.empty() ? "" : " of the baseline";
  cmd->add_option("--" + prefix + "lora", lora.adapters,
                  "a PEFT LoRA adapter folder (a GGUF adapter for a GGUF model)" + whose +
                      ", DIR or DIR:SCALE; repeat to apply several in order")
      ->take_all()
      ->allow_extra_args(false);
  if (with_mode)
    cmd->add_option("--" + prefix + "lora-mode", lora.mode,
                    "merge the adapters into the weights, apply them in the forward, or auto (default: merged where "
                    "the base is an unquantized Hugging Face model)" + whose);
}

}  // namespace qf::cli
