#include "core/weight_residency.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include "core/error.h"

namespace qf {

FileResidency choose_weight_residency(const char* qf_weights, uint64_t file_bytes, uint64_t available_bytes) {
  const std::string_view v = qf_weights ? qf_weights : "";
  if (v == "memory") return FileResidency::InMemory;
  if (v == "map") return FileResidency::Mapped;
  if (!v.empty() && v != "auto") {
    throw Error(ErrorKind::Usage, "QF_WEIGHTS: unknown value '" + printable_text(v) + "' (allowed: auto|memory|map)");
  }
  return available_bytes > 0 && file_bytes <= available_bytes / 2 ? FileResidency::InMemory : FileResidency::Mapped;
}

const char* residency_name(FileResidency residency) {
  return residency == FileResidency::InMemory ? "memory" : "map";
}

uint64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    uint64_t kib = 0;
    std::string unit;
    if (fields >> kib >> unit && unit == "kB") return kib * 1024;
    return 0;
  }
  return 0;
}

FileResidency runtime_weight_residency(uint64_t file_bytes) {
  return choose_weight_residency(std::getenv("QF_WEIGHTS"), file_bytes, available_memory_bytes());
}

}  // namespace qf

namespace qf {

FileResidency streaming_weight_residency() {
  const char* v = std::getenv("QF_WEIGHTS");
  // Validates the value as the runtime does (a bad one is the same Usage error).
  return choose_weight_residency(v, 0, 0) == FileResidency::InMemory && v && std::string_view(v) == "memory"
             ? FileResidency::InMemory
             : FileResidency::Mapped;
}

}  // namespace qf
