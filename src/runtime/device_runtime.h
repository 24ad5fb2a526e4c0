// The runtime's device code (…_device.cpp in this folder), compiled as the
// host build (qf::host) and, with nvcc, as the cuda build (qf::cuda, when
// QF_HAVE_CUDA): causal attention and the decoder that eval and bench run
// with --device host|cuda. Plain C++: no Thrust or CUDA type appears here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "device/device.h"
#include "runtime/model.h"

namespace qf::rt {

// Most tokens one pass through a layer holds at once: longer inputs run in
// pieces of this many (continuing the cache), bounding the activations.
constexpr int64_t kDevicePassTokens = 512;

// The four distinct Linear inputs of a decoder layer: the normed input of
// q/k/v, o_proj's, the normed input of gate/up, down_proj's.
enum class LayerInput { Attention = 0, O = 1, Mlp = 2, Down = 3 };

// The input a layer Linear's observer slot reads (K, V: q's; Up: gate's).
constexpr LayerInput layer_input_of(LinearObserver::Slot slot) {
  switch (LinearObserver::input_of(slot)) {
    case LinearObserver::O: return LayerInput::O;
    case LinearObserver::Gate: return LayerInput::Mlp;
    case LinearObserver::Down: return LayerInput::Down;
    default: return LayerInput::Attention;
  }
}

// A model's decoder layers run on a device for one sequence at a time, the
// way eval and bench use the runtime:
//   - the weights are uploaded once, in their stored form where the device
//     decodes it (Linear::device_form: GGUF blocks, packed integers, FP8,
//     NVFP4; f16 and bf16 at 2 bytes a weight), decoded into an f32 scratch
//     matrix before each GEMM; the int8 W8A8 form is decoded to f32 at
//     upload by the Linear's own decode (dequantize, then GEMM). A Linear that
//     quantizes its input (W8A8, FP8 or NVFP4 activations) gets it quantized
//     by the CPU's quantize_activations, exactly as the CPU runtime does;
//   - the K/V cache holds f32 values rounded to f16 (the CPU runtime's f16
//     cache gives the same values); other cache types are not offered;
//   - the embedding rows are decoded on the host and uploaded.
// Not thread-safe; one sequence, positions 0..capacity-1.
class DeviceDecoder {
 public:
  virtual ~DeviceDecoder() = default;
  virtual int64_t capacity() const = 0;
  // Positions cached so far (the next token's position).
  virtual int64_t position() const = 0;
  // Forgets the sequence: the next forward starts at position 0.
  virtual void reset() = 0;
  // Runs tokens[0..n) at positions position() .. position() + n - 1,
  // appending their K/V; `logits` receives [rows with want[t], vocab] in
  // order. InvalidInput for a token outside the vocabulary or n beyond the
  // capacity left.
  virtual void forward(const int32_t* tokens, int64_t n, const uint8_t* want, std::vector<float>& logits) = 0;
  // What the cache holds for layer `layer`: [position(), kv_dim] K or V.
  virtual std::vector<float> cached_k(int64_t layer) const = 0;
  virtual std::vector<float> cached_v(int64_t layer) const = 0;
  // From now on (and reset by each call), sum x_j^2 over the tokens of
  // every forward for each input column j of each layer's four Linear
  // inputs and, with `lm_head`, of lm_head's input on the rows that want
  // logits: llama-imatrix's statistics, summed in double over the tokens in
  // order, as the CPU's imatrix does. Dense layers only (Unsupported for a
  // mixture-of-experts model, whose entries are per expert).
  virtual void collect_square_sums(bool lm_head) = 0;
  // The sums so far: [cols] of layer `layer`'s input, or of lm_head's input
  // (layer -1, input ignored); and the tokens they cover.
  virtual std::vector<double> square_sums(int64_t layer, LayerInput input) const = 0;
  virtual int64_t square_sum_tokens(int64_t layer) const = 0;
  // Weight bytes one decode step reads on the device, and cache bytes per position.
  virtual uint64_t weight_bytes_per_token() const = 0;
  virtual uint64_t kv_bytes_per_token() const = 0;
};

// What a capturing pass through a layer measures.
struct LayerCapture {
  bool hessians = false;  // 2/N sum x x^T of each input (N: rows seen)
  bool ranges = false;    // [min(x, 0), max(x, 0)] of each input, NaN ignored
  bool kv_amax = false;   // the largest |K| (after RoPE) and |V|
  bool square_sums = false;  // sum over tokens of x_j^2 per column of each input (the imatrix)
  bool abs_stats = false;    // sum and max over tokens of |x_j| per column of each input (smoothing)
  // Sparse layers: keep each run's MLP input and routing (take_moe_inputs).
  // A capturing run that keeps them and does not write back runs no expert.
  bool moe_inputs = false;
};

// What a sparse layer's run kept (LayerCapture::moe_inputs): the input of
// its sparse MLP (the post-attention normed rows the router reads) and the
// router's choices, as the CPU's LinearObserver sees them
// (observe_moe_input, observe_routing).
struct MoeInputs {
  std::vector<float> x;           // [n, hidden]
  std::vector<int32_t> experts;   // [n, num_experts_per_tok]
};

// One decoder layer on a device, for the sequential calibration pipeline:
// the hidden states of one calibration sequence (positions 0..n-1, a fresh
// cache each run) go in and come out, and a capturing run measures what
// the layer's Linears are quantized from, on the device (GPTQ's Hessians
// by SYRK in double). The same computation as the decoder's layers; a
// sparse (mixture-of-experts) layer routes each token on the device, and the
// statistics of each expert's inputs are taken one expert at a time from the
// rows routed to it, as the CPU pipeline takes them.
class DeviceLayerPass {
 public:
  virtual ~DeviceLayerPass() = default;
  // Uploads decoder layer `layer`'s current weights (again after a
  // transform or quantization changed them).
  virtual void load(int64_t layer) = 0;
  // Starts measuring (the accumulators start empty), until end_capture.
  virtual void begin_capture(const LayerCapture& what) = 0;
  virtual void end_capture() = 0;
  // Runs the loaded layer on x [n, hidden] (host); writes the layer's
  // output back into x when write_back.
  virtual void run(float* x, int64_t n, bool write_back) = 0;
  // Hidden states kept on the device between layers: room for sequences of
  // `lengths` tokens ([sum, hidden] floats, allocated here); store_resident
  // and load_resident copy sequence s in or out, run_resident runs the
  // loaded layer on it in place (write_back) or only to measure.
  virtual void make_resident(const std::vector<int64_t>& lengths) = 0;
  virtual void store_resident(size_t s, const float* x) = 0;
  virtual std::vector<float> load_resident(size_t s) const = 0;
  virtual void run_resident(size_t s, bool write_back) = 0;
  // The measurements since begin_capture.
  virtual int64_t captured_rows(LayerInput input) const = 0;
  virtual std::vector<double> hessian(LayerInput input) const = 0;  // [cols * cols]
  virtual std::pair<float, float> range(LayerInput input) const = 0;
  virtual std::pair<float, float> kv_amax() const = 0;
  // Sparse layers. What the runs since the last call kept (a capture with
  // LayerCapture::moe_inputs), handed over: call it after each sequence's run.
  virtual MoeInputs take_moe_inputs() = 0;
  // Starts measuring expert `expert` (kSharedExpert: the shared one) of the
  // loaded sparse layer as `what` asks (hessians, ranges), in place of the
  // layer's measurements; run_expert runs its gate/up (with its current
  // weights) on x [n, hidden] (host: the rows routed to it). captured_rows,
  // hessian and range then give its gate/up input as LayerInput::Mlp and its
  // down projection's input as LayerInput::Down; begin_capture frees them.
  virtual void begin_expert(int64_t expert, const LayerCapture& what) = 0;
  virtual void run_expert(const float* x, int64_t n) = 0;
};

// The evaluations of the smoothing searches (calibration/smoothing.h: AWQ's
// scale search, SmoothQuant's statistics and alpha search) on a device: the
// layer's calibration inputs are uploaded once, a reference run keeps every
// block's input and output on the device, and each candidate's loss is the
// mean squared difference of a block's output from the reference, summed on
// the device per row in double and over rows in order on the host.
enum class SmoothingBlock {
  Attention,  // o_proj(attention(attn_norm(x))) against the reference's
  O,          // o_proj on the reference's o_proj input
  Mlp,        // the MLP on the reference's normed MLP input
  Down,       // down_proj on the reference's down_proj input
  Layer,      // the whole layer, residuals included
};
class DeviceSmoothingEval {
 public:
  virtual ~DeviceSmoothingEval() = default;
  // The layer's inputs: sequences of `lengths` tokens (positions from 0
  // each), x [sum of lengths, hidden] on the host.
  virtual void set_inputs(const std::vector<int64_t>& lengths, const float* x) = 0;
  // Uploads decoder layer `layer`'s current weights; load_linear re-uploads
  // the Linear kLayerLinears[index] of the loaded layer.
  virtual void load(int64_t layer) = 0;
  virtual void load_linear(int index) = 0;
  // Runs the loaded layer on the inputs, keeping every block's input and
  // output as the reference, and the per-column sum and max of |x| of the
  // four Linear inputs (in the CPU's order: tokens in sequence order).
  virtual void run_reference() = 0;
  virtual std::vector<double> abs_sum(LayerInput input) const = 0;
  virtual std::vector<double> abs_max(LayerInput input) const = 0;
  virtual int64_t tokens() const = 0;
  // The loaded weights' block output against the reference: the mean of
  // the squared differences over all tokens and hidden columns.
  virtual double loss(SmoothingBlock block) = 0;
  // AWQ's clip search for one Linear reading `input`: for a weight change
  // d [rows, cols] (host), err[r * (cols / group) + k] = the mean over the
  // reference's sampled tokens (every step-th) of the squared partial dot
  // product of the token's group k with d's row r, group k. The products
  // are batched GEMMs, one batch per group.
  virtual std::vector<double> clip_errors(LayerInput input, int64_t step, const float* d, int64_t rows, int64_t cols,
                                          int64_t group) = 0;
};

// Device memory a smoothing evaluation over `tokens` tokens in sequences of
// at most `longest` needs: the inputs and reference buffers, one layer, the
// engine's activations.
uint64_t device_smoothing_eval_bytes(const Model& model, int64_t tokens, int64_t longest);

// A smoothing evaluation on device `kind` (Host or Cuda) for sequences of
// at most `longest` tokens.
std::unique_ptr<DeviceSmoothingEval> make_device_smoothing_eval(device::Kind kind, const Model& model, int64_t longest);

// Device memory a layer pass over sequences of up to `capacity` tokens
// needs at most: the largest layer's weights as stored (f32 for quantized
// ones; a sparse layer's router and every expert), its cache, the
// activations of one pass (with a sparse layer's routing and one expert's
// buffers), and the Hessians held at once in double with SYRK's double copy
// of the widest input when `hessians` (a dense layer's four; a sparse
// layer's attention pair, then one expert's two).
uint64_t device_layer_pass_bytes(const Model& model, int64_t capacity, bool hessians);

// A layer pass on device `kind` (Host or Cuda; Internal error for Cpu).
std::unique_ptr<DeviceLayerPass> make_device_layer_pass(device::Kind kind, const Model& model, int64_t capacity,
                                                        int64_t pass_tokens = kDevicePassTokens, bool bf16 = false);

// The smoothing searches' device evaluation runs dense layers only:
// Unsupported naming `what`, with one clear message, for a mixture-of-experts
// model (make_device_smoothing_eval checks it too).
void refuse_sparse_on_device(const Model& model, const std::string& what);

// Device memory a decoder of `model` with `capacity` positions needs at most:
// weights (every expert of a sparse layer), cache, the scratch matrix,
// activations of one pass (with a sparse layer's routing and one expert's
// buffers) and the logits of up to kDevicePassTokens rows.
uint64_t device_decoder_bytes(const Model& model, int64_t capacity);

// A decoder on device `kind` (Host or Cuda; Internal error for Cpu) running
// at most `pass_tokens` tokens through a layer at once.
std::unique_ptr<DeviceDecoder> make_device_decoder(device::Kind kind, const Model& model, int64_t capacity,
                                                   int64_t pass_tokens = kDevicePassTokens);

// read_bandwidth of the device `kind` (Host or Cuda).
double device_read_bandwidth(device::Kind kind, uint64_t bytes);

}  // namespace qf::rt

namespace qf::host {
#include "runtime/device_runtime.inc"
}  // namespace qf::host

#if QF_HAVE_CUDA
namespace qf::cuda {
#include "runtime/device_runtime.inc"
}  // namespace qf::cuda
#endif
