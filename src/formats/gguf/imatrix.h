// Importance-matrix files as llama.cpp's llama-imatrix writes them and
// llama-quantize reads them (tools/imatrix/imatrix.cpp, tools/quantize).
//
// GGUF format (a file starting with "GGUF"): metadata general.type = "imatrix",
// imatrix.datasets (string array), imatrix.chunk_count (u32), imatrix.chunk_size
// (u32); no general.architecture. Per weight NAME two F32 tensors:
// NAME.in_sum2 with ne = [in_features, nmat], the sum over tokens of x_j^2, and
// NAME.counts with ne = [1, nmat], the number of tokens (ggml drops trailing 1
// dimensions, so for nmat = 1 they are stored as 1-D [in_features] and [1]).
// Newer llama-imatrix versions add NAME.in_sum (sum of x_j); it is ignored, as
// llama-quantize ignores it. Tensors are written sorted by name, in_sum2 before counts.
//
// Legacy .dat format (anything else), little-endian: int32 n_entries; per entry
// int32 len, name bytes, int32 ncall, int32 nval, float32 values[nval], where
// the values are mean(x_j^2) * ncall; then optionally int32 last_call (the chunk
// count), int32 len, dataset name. Held here as in_sum2 = values, count = ncall,
// so that importance() = values / ncall, llama-quantize's reading.
//
// Validation (InvalidInput naming the file and, where it applies, the tensor):
// truncation, n_entries < 1, bad lengths, trailing bytes, duplicate names, a
// GGUF whose general.type is not "imatrix" or that lacks the imatrix.* keys,
// in_sum2 without counts (or the reverse), non-F32 tensors, count <= 0,
// non-finite values (llama-quantize rejects those) and negative values (sums of
// squares cannot be negative). MoE entries (nmat > 1: a stacked expert tensor,
// one row of sums and one count per expert) may have zero counts for experts
// no token reached, as llama-imatrix writes them; importance() then gives 1
// for that expert's columns, as llama-quantize reads them. A single-matrix
// entry (or an MoE entry whose every count is zero) with a zero count is an
// error.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace qf {

struct ImatrixEntry {
  std::vector<float> in_sum2;  // per input column (per expert, expert-major): sum over tokens of x^2
  float count = 0;             // number of tokens (legacy .dat: ncall); MoE entries: their sum
  std::vector<float> expert_counts;  // MoE entries (nmat > 1): tokens per expert; empty otherwise
  int64_t nmat() const { return expert_counts.empty() ? 1 : static_cast<int64_t>(expert_counts.size()); }
};

struct Imatrix {
  std::map<std::string, ImatrixEntry> entries;  // key: GGUF weight name, e.g. "blk.0.attn_q.weight"
  std::vector<std::string> datasets;
  uint32_t chunk_count = 0, chunk_size = 0;  // chunk_size is 0 for a legacy .dat (not stored there)

  // Mean squared activation per input column (in_sum2[j] / count, in float, as
  // llama-quantize computes it): the weights quantize_rows takes. MoE entries:
  // nmat x in_features values, expert by expert, 1 for an expert with no
  // tokens. Empty if absent.
  std::vector<float> importance(const std::string& tensor) const;
};

// GGUF or legacy .dat, detected by the first four bytes.
Imatrix read_imatrix(const std::filesystem::path& path);

// GGUF format, atomically (nothing under `path` unless it succeeds). InvalidInput
// for an entry that read_imatrix would reject (empty, count <= 0, non-finite).
void write_imatrix_gguf(const Imatrix& m, const std::filesystem::path& path);

}  // namespace qf
