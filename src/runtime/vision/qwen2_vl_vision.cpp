// Qwen2-VL's (and Qwen2.5-VL's) vision tower on one image's pixel values.
//
// Rotary embedding: each patch's (row, column) in the patch grid, in the
// pixel rows' order (merge windows contiguous). head_dim / 2 angles per
// patch: the row times head_dim / 4 inverse frequencies of
// VisionRotaryEmbedding(head_dim / 2), then the column times the same; the
// angle vector is repeated twice to head_dim and applied to q and k with
// rotate_half, as apply_rotary_pos_emb_vision does. Attention is full within
// each temporal frame (cu_seqlens: grid_h * grid_w rows each).
//
// Qwen2.5-VL: the patch rows and their angles are permuted, merged unit by
// merged unit, into window order (qwen2_5_vl_windows) right after the patch
// embedding; blocks listed in fullatt_block_indexes attend within frames,
// the others within windows; the merger's rows come out in window order and
// are put back in image order (transformers' argsort(window_index)).
#include "runtime/vision/qwen2_vl_vision.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "formats/safetensors.h"

namespace qf::rt {
namespace {

using vision::DenseLinear;
using vision::Norm;

constexpr float kNormEps = 1e-6f;

struct Block {
  Norm norm1, norm2;  // LayerNorm (2), RMSNorm (2.5: no bias)
  DenseLinear qkv, proj;
  DenseLinear fc1, fc2;           // 2
  DenseLinear gate, up, down;     // 2.5
  bool full_attention = true;     // 2.5: in fullatt_block_indexes
};

class Qwen2VLVision final : public VisionTower {
 public:
  Qwen2VLVision(const Qwen2VLVisionConfig& c, const vision::VisionTensors& t) : c_(c) {
    const int64_t E = c.embed_dim, m2 = c.merge_size * c.merge_size, F = c.mlp_hidden;
    const std::string why =
        "vision_config (" + std::string(c.v2_5 ? "hidden_size " : "embed_dim ") + std::to_string(E) + ", depth " +
        std::to_string(c.depth) + (c.v2_5 ? ", intermediate_size " : ", mlp_ratio -> ") + std::to_string(F) +
        ", patch_size " + std::to_string(c.patch_size) + ", temporal_patch_size " +
        std::to_string(c.temporal_patch_size) + ", spatial_merge_size " + std::to_string(c.merge_size) +
        (c.v2_5 ? ", out_hidden_size " : ", hidden_size ") + std::to_string(c.out_hidden) + ")";
    const int64_t p = c.patch_size, tp = c.temporal_patch_size;
    patch_.in = 3 * tp * p * p;
    patch_.out = E;
    patch_.w = t.get("visual.patch_embed.proj.weight", {E, 3, tp, p, p}, why);  // no bias
    auto norm = [&](const std::string& name) {
      return c.v2_5 ? vision::load_rms_norm(t, name, E, kNormEps, why)
                    : vision::load_layer_norm(t, name, E, kNormEps, why);
    };
    for (int64_t i = 0; i < c.depth; ++i) {
      const std::string b = "visual.blocks." + std::to_string(i) + ".";
      Block blk;
      blk.norm1 = norm(b + "norm1");
      blk.norm2 = norm(b + "norm2");
      blk.qkv = vision::load_linear(t, b + "attn.qkv", 3 * E, E, true, why);
      blk.proj = vision::load_linear(t, b + "attn.proj", E, E, true, why);
      if (c.v2_5) {
        blk.gate = vision::load_linear(t, b + "mlp.gate_proj", F, E, true, why);
        blk.up = vision::load_linear(t, b + "mlp.up_proj", F, E, true, why);
        blk.down = vision::load_linear(t, b + "mlp.down_proj", E, F, true, why);
        blk.full_attention = std::count(c.full_attention_blocks.begin(), c.full_attention_blocks.end(), i) > 0;
      } else {
        blk.fc1 = vision::load_linear(t, b + "mlp.fc1", F, E, true, why);
        blk.fc2 = vision::load_linear(t, b + "mlp.fc2", E, F, true, why);
      }
      blocks_.push_back(std::move(blk));
    }
    ln_q_ = norm("visual.merger.ln_q");
    mlp0_ = vision::load_linear(t, "visual.merger.mlp.0", E * m2, E * m2, true, why);
    mlp2_ = vision::load_linear(t, "visual.merger.mlp.2", c.out_hidden, E * m2, true, why);
  }

  int64_t hidden() const override { return c_.out_hidden; }

  ImageEmbedding forward(const PixelValues& pv, ThreadPool& pool) const override {
    const int64_t E = c_.embed_dim, m = c_.merge_size, m2 = m * m, hd = c_.head_dim(), F = c_.mlp_hidden;
    const int64_t n = pv.grid_t * pv.grid_h * pv.grid_w;
    if (pv.shape.size() != 2 || pv.shape[0] != n || pv.shape[1] != patch_.in || n < 1 || pv.grid_h % m != 0 ||
        pv.grid_w % m != 0 || pv.values.size() != static_cast<size_t>(n * patch_.in))
      throw invalid_input("qwen2_vl vision tower", "pixel values of shape " + shape_str(pv.shape) + " with grid " +
                                                       std::to_string(pv.grid_t) + "x" + std::to_string(pv.grid_h) +
                                                       "x" + std::to_string(pv.grid_w) +
                                                       " are not Qwen2-VL patches of this model");
    std::vector<float> x(static_cast<size_t>(n * E));
    vision::linear_forward(patch_, pv.values.data(), n, x.data(), pool);
    std::vector<float> cs = rotary_cos_sin(pv);
    std::vector<int64_t> frames;
    for (int64_t t = 0; t <= pv.grid_t; ++t) frames.push_back(t * pv.grid_h * pv.grid_w);
    VisionWindows win;
    if (c_.v2_5) {
      win = qwen2_5_vl_windows(pv.grid_t, pv.grid_h, pv.grid_w, m, c_.window_units());
      x = permute_units(x, win.order, m2 * E);
      std::vector<float> c(cs.begin(), cs.begin() + n * hd), s(cs.begin() + n * hd, cs.end());
      c = permute_units(c, win.order, m2 * hd);
      s = permute_units(s, win.order, m2 * hd);
      std::copy(c.begin(), c.end(), cs.begin());
      std::copy(s.begin(), s.end(), cs.begin() + n * hd);
    }

    std::vector<float> h(x.size()), qkv(static_cast<size_t>(n * 3 * E)), att(x.size()), tmp(x.size());
    std::vector<float> mlp(static_cast<size_t>(n * F)), up(c_.v2_5 ? mlp.size() : 0);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (const Block& b : blocks_) {
      norm_rows(b.norm1, x.data(), n, h.data());
      vision::linear_forward(b.qkv, h.data(), n, qkv.data(), pool);
      apply_rotary(qkv.data(), n, cs);
      vision::attention(qkv.data(), qkv.data() + E, qkv.data() + 2 * E, 3 * E, n, c_.num_heads, hd, scale,
                        b.full_attention ? frames : win.segments, att.data(), pool);
      vision::linear_forward(b.proj, att.data(), n, tmp.data(), pool);
      for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
      norm_rows(b.norm2, x.data(), n, h.data());
      if (c_.v2_5) {  // down(act(gate(x)) * up(x))
        vision::linear_forward(b.gate, h.data(), n, mlp.data(), pool);
        vision::linear_forward(b.up, h.data(), n, up.data(), pool);
        vision::activate(c_.act, mlp.data(), static_cast<int64_t>(mlp.size()));
        for (size_t i = 0; i < mlp.size(); ++i) mlp[i] *= up[i];
        vision::linear_forward(b.down, mlp.data(), n, tmp.data(), pool);
      } else {
        vision::linear_forward(b.fc1, h.data(), n, mlp.data(), pool);
        vision::activate(c_.act, mlp.data(), static_cast<int64_t>(mlp.size()));
        vision::linear_forward(b.fc2, mlp.data(), n, tmp.data(), pool);
      }
      for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
    }
    // The merger: rows of a merge window are consecutive, so [n, E] read as
    // [n / m^2, m^2 E] puts each window's patches side by side.
    norm_rows(ln_q_, x.data(), n, h.data());
    const int64_t rows = n / m2;
    std::vector<float> mid(static_cast<size_t>(rows * mlp0_.out));
    vision::linear_forward(mlp0_, h.data(), rows, mid.data(), pool);
    vision::activate(vision::Activation::Gelu, mid.data(), static_cast<int64_t>(mid.size()));
    ImageEmbedding e;
    e.rows.resize(static_cast<size_t>(rows * c_.out_hidden));
    vision::linear_forward(mlp2_, mid.data(), rows, e.rows.data(), pool);
    if (c_.v2_5) {  // back to image order: row j of the output is unit win.order[j]
      std::vector<float> back(e.rows.size());
      for (int64_t j = 0; j < rows; ++j)
        std::copy_n(e.rows.data() + j * c_.out_hidden, c_.out_hidden, back.data() + win.order[j] * c_.out_hidden);
      e.rows = std::move(back);
    }
    e.n_rows = rows;
    e.hidden = c_.out_hidden;
    e.grid_t = pv.grid_t;
    e.grid_h = pv.grid_h / m;
    e.grid_w = pv.grid_w / m;
    return e;
  }

 private:
  void norm_rows(const Norm& nrm, const float* x, int64_t n, float* y) const {
    if (c_.v2_5)
      vision::rms_norm_rows(nrm, x, n, c_.embed_dim, y);
    else
      vision::layer_norm_rows(nrm, x, n, c_.embed_dim, y);
  }

  // Units of `width` floats reordered: unit j of the result is unit order[j].
  static std::vector<float> permute_units(const std::vector<float>& v, const std::vector<int64_t>& order,
                                          int64_t width) {
    std::vector<float> out(v.size());
    for (size_t j = 0; j < order.size(); ++j)
      std::copy_n(v.data() + order[j] * width, width, out.data() + static_cast<int64_t>(j) * width);
    return out;
  }

  // [n, head_dim] cos then [n, head_dim] sin, one row per patch.
  std::vector<float> rotary_cos_sin(const PixelValues& pv) const {
    const int64_t hd = c_.head_dim(), quarter = hd / 4, m = c_.merge_size;
    const int64_t n = pv.grid_t * pv.grid_h * pv.grid_w, bw_count = pv.grid_w / m;
    // VisionRotaryEmbedding(dim = hd / 2): 1 / 10000^(arange(0, dim, 2) / dim), in float32 as torch computes it.
    std::vector<float> inv(static_cast<size_t>(quarter));
    for (int64_t i = 0; i < quarter; ++i)
      inv[i] = 1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / static_cast<float>(hd / 2));
    std::vector<float> cs(static_cast<size_t>(2 * n * hd));
    for (int64_t r = 0; r < n; ++r) {
      const int64_t in_frame = r % (pv.grid_h * pv.grid_w), window = in_frame / (m * m), k = in_frame % (m * m);
      const int64_t hpos = (window / bw_count) * m + k / m, wpos = (window % bw_count) * m + k % m;
      float* c = cs.data() + r * hd;
      float* s = cs.data() + (n + r) * hd;
      for (int64_t i = 0; i < hd / 2; ++i) {
        const float a = static_cast<float>(i < quarter ? hpos : wpos) * inv[i % quarter];
        c[i] = c[i + hd / 2] = std::cos(a);
        s[i] = s[i + hd / 2] = std::sin(a);
      }
    }
    return cs;
  }

  // q and k (the first two thirds of each qkv row) rotated in place:
  // x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1).
  void apply_rotary(float* qkv, int64_t n, const std::vector<float>& cs) const {
    const int64_t E = c_.embed_dim, hd = c_.head_dim(), half = hd / 2;
    for (int64_t r = 0; r < n; ++r) {
      const float* c = cs.data() + r * hd;
      const float* s = cs.data() + (n + r) * hd;
      for (int64_t part = 0; part < 2; ++part)
        for (int64_t h = 0; h < c_.num_heads; ++h) {
          float* v = qkv + r * 3 * E + part * E + h * hd;
          for (int64_t i = 0; i < half; ++i) {
            const float a = v[i], b = v[i + half];
            v[i] = a * c[i] - b * s[i];
            v[i + half] = b * c[i + half] + a * s[i + half];
          }
        }
    }
  }

  Qwen2VLVisionConfig c_;
  DenseLinear patch_;
  std::vector<Block> blocks_;
  Norm ln_q_;
  DenseLinear mlp0_, mlp2_;
};

}  // namespace

Qwen2VLVisionConfig parse_qwen2_vl_vision_config(const ModelConfig& cfg, const std::string& where) {
  const nlohmann::json& vc = cfg.vlm->vision;
  Qwen2VLVisionConfig c;
  c.v2_5 = cfg.vlm->model_type == "qwen2_5_vl";
  c.depth = vision::config_int(vc, "depth", c.depth, where);
  c.num_heads = vision::config_int(vc, "num_heads", c.num_heads, where);
  if (c.v2_5) {  // Qwen2_5_VLVisionConfig's names and defaults
    c.embed_dim = vision::config_int(vc, "hidden_size", 3584, where);
    c.mlp_hidden = vision::config_int(vc, "intermediate_size", 3420, where);
    c.out_hidden = vision::config_int(vc, "out_hidden_size", 3584, where);
    c.window_size = vision::config_int(vc, "window_size", 112, where);
  } else {
    c.embed_dim = vision::config_int(vc, "embed_dim", c.embed_dim, where);
    const double ratio = vision::config_number(vc, "mlp_ratio", 4.0, where);
    c.mlp_hidden = static_cast<int64_t>(static_cast<double>(c.embed_dim) * ratio);  // int(embed_dim * mlp_ratio)
    c.out_hidden = vision::config_int(vc, "hidden_size", c.out_hidden, where);
  }
  c.in_channels = vision::config_int(vc, vc.contains("in_channels") ? "in_channels" : "in_chans", 3, where);
  c.patch_size = vision::config_int(vc, "patch_size", c.patch_size, where);
  c.merge_size = vision::config_int(vc, "spatial_merge_size", c.merge_size, where);
  c.temporal_patch_size = vision::config_int(vc, "temporal_patch_size", c.temporal_patch_size, where);
  c.act = vision::parse_activation(vision::config_string(vc, "hidden_act", c.v2_5 ? "silu" : "quick_gelu", where),
                                   where, "vision_config.hidden_act");
  const char* width_key = c.v2_5 ? "vision_config.hidden_size " : "vision_config.embed_dim ";
  if (c.embed_dim % c.num_heads != 0 || c.head_dim() % 4 != 0)
    throw invalid_input(where, width_key + std::to_string(c.embed_dim) + " over num_heads " +
                                   std::to_string(c.num_heads) +
                                   " must give a head_dim divisible by 4 (the 2-D rotary embedding's halves)");
  if (c.mlp_hidden < 1) throw invalid_input(where, "vision_config.mlp_ratio gives an empty MLP");
  if (c.in_channels != 3)
    throw unsupported(where, "vision_config.in_chans " + std::to_string(c.in_channels) + " (images are RGB: 3)");
  if (c.out_hidden != cfg.hidden_size)
    throw invalid_input(where, std::string(c.v2_5 ? "vision_config.out_hidden_size " : "vision_config.hidden_size ") +
                                   std::to_string(c.out_hidden) +
                                   " (the patch merger's output) differs from the language model's hidden_size " +
                                   std::to_string(cfg.hidden_size));
  if (c.v2_5) {
    if (c.window_units() < 1)
      throw invalid_input(where, "vision_config.window_size " + std::to_string(c.window_size) +
                                     " is smaller than one merged unit (spatial_merge_size * patch_size)");
    c.full_attention_blocks = {7, 15, 23, 31};
    if (auto it = vc.find("fullatt_block_indexes"); it != vc.end() && !it->is_null()) {
      if (!it->is_array())
        throw invalid_input(where, "vision_config.fullatt_block_indexes must be a list of block indices");
      c.full_attention_blocks.clear();
      for (const auto& e : *it) {
        if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= c.depth)
          throw invalid_input(where, "vision_config.fullatt_block_indexes holds " + printable_text(e.dump()) +
                                         ", not a block index below depth " + std::to_string(c.depth));
        c.full_attention_blocks.push_back(e.get<int64_t>());
      }
    }
  }
  return c;
}

std::unique_ptr<VisionTower> load_qwen2_vl_vision(const ModelConfig& cfg, const Checkpoint& ck,
                                                  const std::string& where) {
  const Qwen2VLVisionConfig c = parse_qwen2_vl_vision_config(cfg, where);
  vision::check_layer_count(ck, "visual.blocks.", c.depth, where, "vision_config.depth");
  return std::make_unique<Qwen2VLVision>(c, vision::VisionTensors(cfg, ck, where));
}

}  // namespace qf::rt
