// Linear over GGUF blocks. Few tokens (decode): activations are quantized to
// the weight type's vec_dot_type once per token, then each thread takes a
// range of weight rows and dots every token against each row while it is in
// cache. Many tokens (prefill, perplexity): at the AMX level the types of
// cpu/amx_gemm.h go to the tiles as codes and scales; otherwise weight tiles
// are decoded to f32 and go through the f32 GEMM of forward_row_tiles; at
// AVX-512 Q8_0 rows are decoded in the GEMM's registers instead
// (gemm_tile_q8_0, the same floats).
//
// Q8_0 weights regrouped in place (cpu/q8_0_groups.h) decode 16 rows per dot
// product; the GEMM paths and decode_row read rows, which are unpacked from
// their group first (a copy, byte for byte the stored row).
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/io.h"
#include "quantizers/kquants.h"
#include "runtime/cpu/amx_gemm.h"
#include "runtime/cpu/q8_0_groups.h"
#include "runtime/cpu/kernels.h"
#include "runtime/linear.h"

namespace qf::rt {
namespace {

// From this many tokens on, a forward runs the GEMM with f32 activations (on
// f32 tiles decoded from the blocks, or on Q8_0 rows decoded in registers);
// below it (decode, short batches) it quantizes the activations and
// runs the block dot products, which read each weight byte once per token.
constexpr int64_t kDequantizeTokens = 16;

class BlockLinear final : public Linear {
 public:
  BlockLinear(uint32_t type, const void* data, int64_t rows, int64_t cols, std::shared_ptr<const void> owner,
              std::vector<float> bias, uint8_t* regroup)
      : Linear(cols, rows), type_(type), act_type_(kquants::vec_dot_type(type)),
        data_(static_cast<const uint8_t*>(data)), owner_(std::move(owner)), bias_(std::move(bias)),
        row_bytes_(kquants::row_size(type, cols)), act_bytes_(kquants::row_size(act_type_, cols)) {
    if (regroup && type == ggml_type::Q8_0 && q8_0_groups_fast()) {
      grouped_rows_ = rows / kQ8_0GroupRows * kQ8_0GroupRows;
      std::vector<uint8_t> scratch;
      for (int64_t r = 0; r < grouped_rows_; r += kQ8_0GroupRows)
        q8_0_group_pack(regroup + static_cast<size_t>(r) * row_bytes_, cols / 32, scratch);
    }
  }

  void forward(const float* x, int64_t n, float* y, ThreadPool& pool) const override {
    if (n >= kDequantizeTokens && qf::simd_level() >= SimdLevel::Amx && amx_gemm_supports(type_)) {
      // AMX tiles: the weights' integer codes against the activations split
      // into two bf16 pieces (16 significant bits), each sub-block's scale
      // and min applied in f32 (cpu/amx_gemm.h).
      // (A lambda naming a thread_local would reach each pool thread's own
      // copy: the threads get this one by reference.)
      thread_local AmxActivations mine;
      AmxActivations& act = mine;
      amx_activations_reserve(act, n, in_, amx_sub_block(type_), amx_has_min(type_));
      pool.parallel_for(act.blocks, 1, [&](const Chunk& c) { amx_prepare_activations(x, in_, act, c.begin, c.end); });
      const AmxActivations& shared = act;
      forward_row_gemm(n, y, out_, bias_, pool, [&](int64_t r0, int64_t rows) {
        thread_local AmxWeightTile tile;
        thread_local std::vector<uint8_t> unpacked;
        amx_decode_tile(type_, rows_at(r0, rows, unpacked), row_bytes_, rows, in_, tile);
        amx_gemm_tile(shared, tile, y + r0, out_);
      });
      return;
    }
    if (n >= kDequantizeTokens && type_ == ggml_type::Q8_0 && qf::simd_level() >= SimdLevel::Avx512) {
      // Q8_0 rows go to the GEMM as they are, decoded in registers (the
      // floats of the decoded tiles below, with about a quarter of the bytes
      // read and no tile written). The k-quants decode too slowly to repeat
      // for every block of tokens, and so does Q8_0 at AVX2, whose blocks
      // take 4 tokens at a time, not 6 (measured: 46-57 tok/s prefill in
      // registers against 58-62 from tiles).
      forward_row_gemm(n, y, out_, bias_, pool, [&](int64_t r0, int64_t rows) {
        thread_local std::vector<uint8_t> unpacked;
        gemm_tile_q8_0(x, n, in_, rows_at(r0, rows, unpacked), rows, in_, y + r0, out_);
      });
      return;
    }
    if (n >= kDequantizeTokens) {
      // Prefill and evaluation: a tile of rows is decoded to f32 once and
      // multiplied with every token by the register-blocked f32 GEMM, whose
      // speed the per-row block dot products cannot reach; the activations
      // stay f32 (not rounded to 8 bits, unlike the path below).
      forward_row_tiles(x, n, y, in_, out_, bias_, pool, [&](int64_t r0, int64_t rows, float* buf) -> const float* {
        thread_local std::vector<uint8_t> unpacked;
        const uint8_t* w = rows_at(r0, rows, unpacked);
        for (int64_t r = 0; r < rows; ++r) kquants::dequantize_row(type_, w + static_cast<size_t>(r) * row_bytes_, buf + r * in_, in_);
        return buf;
      });
      return;
    }
    thread_local std::vector<uint8_t> act;
    act.resize(static_cast<size_t>(n) * act_bytes_);
    uint8_t* a = act.data();
    pool.parallel_for(n, std::max<int64_t>(1, n / (2 * pool.size())), [&](const Chunk& c) {
      for (int64_t t = c.begin; t < c.end; ++t)
        kquants::quantize_activation(act_type_, x + t * in_, a + static_cast<size_t>(t) * act_bytes_, in_);
    });
    if (grouped_rows_ > 0) return forward_groups(a, n, y, pool);
    const kquants::DotKernel dot = kquants::dot_kernel(type_, in_);
    constexpr int64_t kTile = 16;
    const int64_t tiles = (out_ + kTile - 1) / kTile;
    pool.parallel_for(tiles, std::max<int64_t>(1, tiles / (4 * pool.size())), [&](const Chunk& c) {
      for (int64_t tile = c.begin; tile < c.end; ++tile) {
        const int64_t r0 = tile * kTile, r1 = std::min(out_, r0 + kTile);
        for (int64_t t = 0; t < n; ++t) {
          const uint8_t* at = a + static_cast<size_t>(t) * act_bytes_;
          float* yt = y + t * out_;
          for (int64_t r = r0; r < r1; ++r) {
            if (n == 1 && r + 1 < out_) {  // decode streams the weights: fetch the next row while this one is dotted
              const uint8_t* ahead = data_ + static_cast<size_t>(r + 1) * row_bytes_;
              for (size_t off = 0; off < row_bytes_; off += 64) __builtin_prefetch(ahead + off);
            }
            const float v = dot(in_, data_ + static_cast<size_t>(r) * row_bytes_, at);
            yt[r] = bias_.empty() ? v : v + bias_[static_cast<size_t>(r)];
          }
        }
      }
    });
  }

  void decode_row(int64_t r, float* out) const override {
    thread_local std::vector<uint8_t> unpacked;
    kquants::dequantize_row(type_, rows_at(r, 1, unpacked), out, in_);
  }
  uint64_t weight_bytes() const override { return static_cast<uint64_t>(row_bytes_) * static_cast<uint64_t>(out_); }
  void release_pages() const override { release_mapped_pages(data_, static_cast<size_t>(weight_bytes())); }
  std::vector<float> bias_values() const override { return bias_; }
  std::string format() const override { return ggml_type_info(type_)->name; }
  bool quantized() const override { return true; }
  DeviceWeightForm device_form() const override {
    DeviceWeightForm f;
    if (grouped_rows_ > 0) return f;  // not the stored layout
    f.kind = DeviceWeightForm::Kind::GgufBlocks;
    f.ggml_type = type_, f.blocks = data_, f.row_bytes = row_bytes_;
    return f;
  }

 private:
  // Rows [r0, r0 + rows) in the row layout: in place, or (some of them in
  // groups) unpacked into `buf`.
  const uint8_t* rows_at(int64_t r0, int64_t rows, std::vector<uint8_t>& buf) const {
    if (r0 >= grouped_rows_) return data_ + static_cast<size_t>(r0) * row_bytes_;
    buf.resize(static_cast<size_t>(rows) * row_bytes_);
    for (int64_t r = r0; r < r0 + rows; ++r) {
      uint8_t* dst = buf.data() + static_cast<size_t>(r - r0) * row_bytes_;
      if (r < grouped_rows_)
        q8_0_group_unpack_row(data_ + static_cast<size_t>(r - r % kQ8_0GroupRows) * row_bytes_, in_ / 32,
                              static_cast<int>(r % kQ8_0GroupRows), dst);
      else
        std::memcpy(dst, data_ + static_cast<size_t>(r) * row_bytes_, row_bytes_);
    }
    return buf.data();
  }

  // Decode of regrouped Q8_0 (n < kDequantizeTokens): each pool claim is two
  // groups of 16 rows (q8_0_groups_dot's two streams), dotted with every token
  // while they are in cache; the rows past the last group are one more claim,
  // dotted as rows.
  void forward_groups(const uint8_t* a, int64_t n, float* y, ThreadPool& pool) const {
    constexpr int64_t kPer = 2;
    const int64_t blocks = in_ / 32, groups = grouped_rows_ / kQ8_0GroupRows, pairs = (groups + kPer - 1) / kPer;
    thread_local std::vector<Q8_0GroupActivation> acts;
    std::vector<Q8_0GroupActivation>& mine = acts;
    mine.resize(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t)
      q8_0_group_activation(a + static_cast<size_t>(t) * act_bytes_, blocks, mine[static_cast<size_t>(t)]);
    const std::vector<Q8_0GroupActivation>& shared = mine;
    const kquants::DotKernel dot = kquants::dot_kernel(type_, in_);
    const size_t group_bytes = kQ8_0GroupRows * row_bytes_;
    const int64_t claims = pairs + (grouped_rows_ < out_ ? 1 : 0);
    pool.parallel_for(claims, std::max<int64_t>(1, claims / (4 * pool.size())), [&](const Chunk& c) {
      for (int64_t i = c.begin; i < c.end; ++i) {
        const int64_t g0 = i * kPer, count = std::min(kPer, groups - g0);
        const int64_t r0 = i < pairs ? g0 * kQ8_0GroupRows : grouped_rows_;
        const int64_t r1 = i < pairs ? r0 + count * kQ8_0GroupRows : out_;
        for (int64_t t = 0; t < n; ++t) {
          float* yt = y + t * out_;
          if (i < pairs) {
            q8_0_groups_dot(data_ + static_cast<size_t>(g0) * group_bytes, count, blocks, shared[static_cast<size_t>(t)], yt + r0);
          } else {
            for (int64_t r = r0; r < r1; ++r)
              yt[r] = dot(in_, data_ + static_cast<size_t>(r) * row_bytes_, a + static_cast<size_t>(t) * act_bytes_);
          }
          if (!bias_.empty())
            for (int64_t r = r0; r < r1; ++r) yt[r] += bias_[static_cast<size_t>(r)];
        }
      }
    });
  }

  uint32_t type_, act_type_;
  const uint8_t* data_;
  std::shared_ptr<const void> owner_;
  std::vector<float> bias_;
  size_t row_bytes_, act_bytes_;
  int64_t grouped_rows_ = 0;  // rows [0, grouped_rows_) are in groups of 16
};

}  // namespace

std::unique_ptr<Linear> make_block_linear(uint32_t type, const void* data, int64_t rows, int64_t cols,
                                          std::shared_ptr<const void> owner, const Tensor* bias,
                                          const std::string& name, uint8_t* regroup) {
  const GgmlTypeInfo* info = ggml_type_info(type);
  if (!info || !kquants::is_supported(type) || type == ggml_type::Q8_K || type == ggml_type::Q8_1)
    throw unsupported(name, "the runtime cannot multiply ggml type " + std::string(info ? info->name : "#" + std::to_string(type)));
  if (cols % info->block_size != 0)
    throw invalid_input(name, "row length " + std::to_string(cols) + " is not a multiple of the " + info->name +
                                  " block size " + std::to_string(info->block_size));
  std::vector<float> b;
  if (bias) {
    if (bias->numel() != rows) throw invalid_input(name, "bias has " + std::to_string(bias->numel()) + " values for " + std::to_string(rows) + " rows");
    b = bias->to_f32_vector();
  }
  return std::make_unique<BlockLinear>(type, data, rows, cols, std::move(owner), std::move(b), regroup);
}

}  // namespace qf::rt
