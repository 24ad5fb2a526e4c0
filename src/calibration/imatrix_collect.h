// The importance matrix llama.cpp's llama-imatrix computes, from our runtime:
// for every Linear of the decoder blocks, the sum over calibration tokens of
// x_j^2 per input column, and the token count. Chunks follow llama-imatrix:
// the text tokenized once, cut into non-overlapping chunks of ctx tokens whose
// first token is replaced by BOS; every token of a chunk counts.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "core/thread_pool.h"
#include "device/device.h"
#include "formats/gguf/imatrix.h"
#include "formats/tokenizer/tokenizer.h"
#include "runtime/model.h"

namespace qf {

struct ImatrixOptions {
  int64_t ctx = 512;
  int64_t max_chunks = 0;       // 0: every chunk of the text
  bool process_output = false;  // also output.weight (llama-imatrix --process-output)
  std::string dataset;          // name recorded in imatrix.datasets
  // Where the forward passes and the sums run: the CPU runtime, or the
  // device decoder (runtime/device_runtime.h), which sums on the device.
  device::Kind device = device::Kind::Cpu;
  rt::LoraLoad lora;  // adapters loaded with the model (merged, or in the forward of a GGUF model)
};

// Entries are keyed by GGUF tensor name (blk.N.attn_q.weight, ...).
Imatrix compute_imatrix(const rt::Model& model, const Tokenizer& tok, const std::string& text,
                        const ImatrixOptions& opts, ThreadPool& pool,
                        const std::function<void(int64_t, int64_t)>& progress = {});

// `quantforge imatrix` and the Python module's imatrix(): checks `out`
// (`out_flag` names it in messages; an existing file only with `force`, an
// input never), loads the model and its tokenizer, refuses non-finite weights
// unless allow_nonfinite, computes over the text file and writes the GGUF
// imatrix. progress(done, total) counts chunks.
Imatrix write_imatrix_from_text(const std::string& model, const std::filesystem::path& text,
                                const std::filesystem::path& out, const std::string& out_flag, ImatrixOptions opts,
                                bool force, bool allow_nonfinite, ThreadPool& pool,
                                const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace qf
