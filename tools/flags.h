// Checks for numeric flags. Each rejects a value outside its range with one
// message that names the accepted range in plain numbers ("must be an
// integer from 1 to 64, got 100000"), never a silently replaced value.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "device/device.h"
#include "eval/gate_bounds.h"
#include "runtime/kv_format.h"
#include "runtime/model.h"

namespace qf::cli {

// An integer in [lo, hi].
CLI::Validator int_range(int64_t lo, int64_t hi);
// An integer >= lo.
CLI::Validator int_at_least(int64_t lo);
// A finite number >= lo (> lo when `strict`), and <= hi when given.
CLI::Validator finite_at_least(double lo, bool strict, double hi = 0, bool has_hi = false);
// Any finite number.
CLI::Validator finite_number();
// An evaluation gate bound, by the library's rule (eval/gate_bounds.h).
CLI::Validator gate_bound(eval::GateBound b);

// Adds --threads (an integer from 1 to ThreadPool::max_threads(); absent:
// QF_THREADS or every core) to `cmd`, stored in `threads` (0 when absent).
void add_threads_option(CLI::App* cmd, int& threads);

// Adds --device (cpu, cuda, host or auto; default cpu) to `cmd`, stored in
// `device`. See device/device.h for what each word means.
void add_device_option(CLI::App* cmd, std::string& device);

// The KV-cache flags: --kv-dtype (both sides, or a TurboQuant preset),
// --kv-k-dtype, --kv-v-dtype and --kv-rotation; format() parses them
// (rt::parse_kv_format, a Usage error for a bad name).
struct KvFlags {
  std::string both = "f16", k, v, rotation = "none";
  int64_t f16_edge = -1;
  rt::KvFormat format() const { return rt::parse_kv_format(both, k, v, rotation, f16_edge); }
};
void add_kv_options(CLI::App* cmd, KvFlags& kv);

// --lora DIR[:SCALE] (repeatable, applied in order) and, where a command
// can apply an adapter without merging, --lora-mode auto|merge|forward.
// `prefix` names baseline flags ("baseline-" gives --baseline-lora).
struct LoraFlags {
  std::vector<std::string> adapters;
  std::string mode = "auto";
  std::string prefix;
  rt::LoraLoad load() const;
  std::vector<LoraSpec> specs() const { return load().adapters; }
};
void add_lora_options(CLI::App* cmd, LoraFlags& lora, bool with_mode, const std::string& prefix = "");

// The device a command runs on (device::resolve, with "<command> --device
// <word>" in messages), and the host build's thread count from --threads.
device::Kind resolve_device(const std::string& word, const std::string& command, int threads);

}  // namespace qf::cli
