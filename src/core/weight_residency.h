// Where the runtime keeps a model's weights: read into memory (the default
// when they fit comfortably) or mapped from the file.
#pragma once

#include <cstdint>

#include "core/io.h"

namespace qf {

// The choice for weights of `file_bytes`, given QF_WEIGHTS's value (nullptr
// or empty: auto) and the memory available (0: unknown):
//   auto    InMemory when the weights take at most half the available memory
//           (room left for the KV cache, activations and a second model),
//           Mapped otherwise or when the available memory is unknown
//   memory  InMemory
//   map     Mapped
// Any other value is a Usage error naming QF_WEIGHTS.
FileResidency choose_weight_residency(const char* qf_weights, uint64_t file_bytes, uint64_t available_bytes);

// "memory" or "map", as QF_WEIGHTS spells them.
const char* residency_name(FileResidency residency);

// MemAvailable from /proc/meminfo in bytes; 0 when it cannot be read.
uint64_t available_memory_bytes();

// choose_weight_residency with this process's QF_WEIGHTS and available memory.
FileResidency runtime_weight_residency(uint64_t file_bytes);

// For work that reads each weight once or twice, one layer at a time
// (quantize): Mapped, so that only the layer at hand is resident, unless
// QF_WEIGHTS=memory asks for the whole model in memory.
FileResidency streaming_weight_residency();

}  // namespace qf
