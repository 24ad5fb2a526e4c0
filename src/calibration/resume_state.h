// What an interrupted `quantize` needs to continue: per finished decoder
// layer, its quantized Linears (codes, scales, zero points, g_idx, input
// quantizers, errors, times, notes), the layer's float weights as the
// pipeline left them (norms and Linears kept in full precision, which AWQ and
// SmoothQuant rescale) and its KV-cache ranges.
//
// The state lives beside the output, in the folder ".NAME.resume" (a fixed
// name, so that a run on another host of a shared filesystem finds it), as
//   state.json            {"format": "quantforge-resume", "version": 3,
//                          "fingerprint": {...},
//                          "layers": [{"file": "layer-00000.safetensors",
//                                      "sha256": "..."}, ...],
//                          "layers_done": N}
//   layer-00000.safetensors ...  one per finished layer (metadata "qf_layer")
//   lock                   held (core/file_lock.h) while a run writes
// Each file is replaced atomically, the layer before the count, so a kill at
// any instant leaves a consistent prefix. Before the first layer is finished
// the folder is a registered temporary (an interrupt removes it); from then
// on it stays until the output is committed, whatever ends the run. A resumed run restores the finished
// layers into the model, re-runs only their forward on the calibration set
// (which is deterministic: the runtime's sums do not depend on the thread
// count) to rebuild the hidden states, hands their saved results to the
// exporter in the original order, and goes on from the next layer: the
// output is byte-identical to an uninterrupted run.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <future>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibration/sequential.h"
#include "core/file_lock.h"
#include "runtime/model.h"
#include "runtime/router_linears.h"

namespace qf {

// A finished layer as saved.
struct SavedLayer {
  double seconds = 0;
  std::vector<QuantizedLinearResult> done;          // in the order they were exported
  std::optional<std::pair<float, float>> kv_amax;   // with KV-cache calibration
};

class ResumeState {
 public:
  // The state folder of the output folder `out`.
  static std::filesystem::path folder_for(const std::filesystem::path& out);

  // Takes the lock (Io error naming `out` when another process is writing
  // it). With `resume`, a saved state whose fingerprint equals `fingerprint`
  // is kept; any other state is discarded (log says why). Each layer file is
  // checked against the SHA-256 recorded when it was written: the first
  // missing or damaged one and every layer after it are discarded (log
  // names the file) and run again. Without a usable state the run starts at
  // layer 0.
  ResumeState(const std::filesystem::path& out, nlohmann::ordered_json fingerprint, bool resume,
              const std::function<void(const std::string&)>& log);

  // Finished layers a run may skip (0 when starting over); read before the
  // first save_layer.
  int64_t layers_done() const { return layers_done_; }

  // Saves layer `li` (the next one) after it was exported. The writing runs
  // on a thread of its own, overlapping the next layer's work (the layer's
  // Linears are not changed any more; L holds them by shared pointer); at
  // most one save is in flight, and an error surfaces at the next call.
  void save_layer(const ModelConfig& c, int64_t li, rt::LayerWeights L, std::vector<QuantizedLinearResult> done,
                  double seconds, std::optional<std::pair<float, float>> kv_amax);
  // Waits for the save in flight; rethrows its error.
  void finish();

  // Puts saved layer `li` (< layers_done()) into L: quantized Linears rebuilt
  // from their codes, the other Linears and the norms as saved. InvalidInput
  // naming the file when it is damaged.
  SavedLayer restore_layer(const ModelConfig& c, int64_t li, rt::LayerWeights& L) const;

  // Removes the folder (the output is committed).
  void remove();
  // A state with no finished layer is worth nothing: a run that fails before
  // its first layer leaves no folder behind.
  ~ResumeState();
  ResumeState(const ResumeState&) = delete;
  ResumeState& operator=(const ResumeState&) = delete;

 private:
  std::filesystem::path dir_;
  std::optional<FileLock> lock_;
  nlohmann::ordered_json fingerprint_;
  int64_t layers_done_ = 0;  // changed by the saving thread only while a save is in flight
  std::vector<std::string> layer_sha256_;  // of each finished layer's file, likewise
  std::future<void> pending_;
  // The constructor's work once the lock is held.
  void open_state(const std::filesystem::path& out, bool resume, const std::function<void(const std::string&)>& log);
  void write_state() const;
  void write_layer(int64_t li, const std::vector<rt::LayerLinearId>& ids, const std::vector<rt::RouterLinear>& routers,
                   const rt::LayerWeights& L, const std::vector<QuantizedLinearResult>& done, double seconds,
                   const std::optional<std::pair<float, float>>& kv_amax);
};

}  // namespace qf
