// The smoothing searches' evaluations on the device (runtime/device_runtime.h):
// one layer, its calibration inputs and a reference run's block inputs and
// outputs resident on the device, so that each AWQ or SmoothQuant candidate
// costs one block's forward and a reduction, not a transfer of activations.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "runtime/layer_engine_device.h"

namespace qf::QF_DEV_NS {

namespace {

using namespace layer_engine;

// out[r] = sum_j (a[r, j] - b[r, j])^2 in double, j in order: one index per row.
struct SqDiffRows {
  const float* a;
  const float* b;
  double* out;
  int64_t cols;
  QF_HD void operator()(int64_t r) const {
    double s = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      const double d = static_cast<double>(a[r * cols + j]) - static_cast<double>(b[r * cols + j]);
      s += d * d;
    }
    out[r] = s;
  }
};

// err[k * rows + r] = sum_t P[k][r + t * rows]^2 / T in double (P: one
// rows x T column-major product per group k): one index per (k, r).
struct MeanSquareOverTokens {
  const float* P;
  double* err;
  int64_t rows, T;
  QF_HD void operator()(int64_t idx) const {
    const int64_t k = idx / rows, r = idx % rows;
    const float* p = P + k * rows * T + r;
    double s = 0.0;
    for (int64_t t = 0; t < T; ++t) s += static_cast<double>(p[t * rows]) * p[t * rows];
    err[idx] = s / static_cast<double>(T);
  }
};

void copy_device(const float* src, int64_t n, float* dst) {
  thrust::copy(thrust::device_pointer_cast(src), thrust::device_pointer_cast(src) + n, thrust::device_pointer_cast(dst));
}

class SmoothingEval final : public rt::DeviceSmoothingEval {
 public:
  SmoothingEval(const rt::Model& m, int64_t longest)
      : m_(m), c_(m.config()), longest_(longest), engine_((check_capacity(c_, longest, rt::kDevicePassTokens), m), longest) {}

  void set_inputs(const std::vector<int64_t>& lengths, const float* x) override {
    int64_t n = 0;
    offsets_.clear();
    for (int64_t len : lengths) {
      if (len <= 0 || len > longest_)
        throw invalid_input("device smoothing", "a sequence of " + std::to_string(len) + " tokens (at most " +
                                                    std::to_string(longest_) + ")");
      offsets_.push_back(n);
      n += len;
    }
    lengths_ = lengths, n_ = n;
    const int64_t h = c_.hidden_size;
    x_in_ = upload(x, n * h);
    for (dvec<float>* v : {&q_in_, &attn_out_, &mlp_in_, &mlp_out_, &layer_out_}) v->resize(static_cast<size_t>(n * h));
    o_in_.resize(static_cast<size_t>(n * c_.q_dim()));
    down_in_.resize(static_cast<size_t>(n * c_.intermediate_size));
    out_.resize(static_cast<size_t>(rt::kDevicePassTokens * h));
    row_sums_.resize(static_cast<size_t>(rt::kDevicePassTokens));
    referenced_ = false;
  }

  void load(int64_t layer) override {
    if (layer < 0 || layer >= c_.num_hidden_layers) throw invalid_input("device smoothing", "no layer " + std::to_string(layer));
    upload_layer(m_, layer, longest_, layer_);
    for (const DeviceLinear& l : layer_.lin) engine_.reserve_widened(l);
    layer_index_ = layer;
  }

  void load_linear(int index) override {
    if (layer_index_ < 0 || index < 0 || index >= 7) throw Error(ErrorKind::Internal, "device smoothing: load_linear before load");
    const rt::LayerLinear& ll = rt::kLayerLinears[index];
    const rt::LayerWeights& L = m_.weights().layers[static_cast<size_t>(layer_index_)];
    layer_.lin[index] = upload_linear(*(L.*ll.member), "model.layers." + std::to_string(layer_index_) + "." + ll.name);
    engine_.reserve_widened(layer_.lin[index]);
  }

  void run_reference() override {
    check_ready(false);
    cap_ = Capture{};
    cap_.what.abs_stats = true;
    const int64_t h = c_.hidden_size, qd = c_.q_dim(), ff = c_.intermediate_size;
    for_each_pass([&](int64_t at, int64_t m, int64_t pos0) {
      engine_.set_x_device(raw(x_in_) + at * h, m);
      engine_.attention_block(layer_, m, pos0, &cap_);
      copy_device(engine_.xn(), m * h, raw(q_in_) + at * h);
      copy_device(engine_.att(), m * qd, raw(o_in_) + at * qd);
      copy_device(engine_.y(), m * h, raw(attn_out_) + at * h);
      engine_.attention_residual(layer_, m);
      copy_device(engine_.xn(), m * h, raw(mlp_in_) + at * h);
      engine_.mlp_block(layer_, m, &cap_);
      copy_device(engine_.g(), m * ff, raw(down_in_) + at * ff);
      copy_device(engine_.y(), m * h, raw(mlp_out_) + at * h);
      for_each_index(m * h, AddInPlace{engine_.x(), engine_.y()});
      copy_device(engine_.x(), m * h, raw(layer_out_) + at * h);
    });
    referenced_ = true;
  }

  std::vector<double> abs_sum(rt::LayerInput input) const override {
    check_ready(true);
    return download(cap_.abs_sum[static_cast<int>(input)]);
  }
  std::vector<double> abs_max(rt::LayerInput input) const override {
    check_ready(true);
    return download(cap_.abs_max[static_cast<int>(input)]);
  }
  int64_t tokens() const override { return n_; }

  std::vector<double> clip_errors(rt::LayerInput input, int64_t step, const float* d, int64_t rows, int64_t cols,
                                  int64_t group) override {
    check_ready(true);
    if (step < 1 || group <= 0 || cols % group != 0 || cols != input_cols(c_, input))
      throw invalid_input("device smoothing", "clip search of a " + std::to_string(rows) + " x " + std::to_string(cols) +
                                                  " weight in groups of " + std::to_string(group));
    // The sampled tokens' rows, gathered once per call: [T, cols].
    const dvec<float>& src = buffer_of(input);
    std::vector<int64_t> idx;
    for (int64_t t = 0; t < n_; t += step) idx.push_back(t);
    const int64_t T = static_cast<int64_t>(idx.size()), ng = cols / group;
    const dvec<int64_t> didx = upload(idx.data(), T);
    dvec<float> xs(static_cast<size_t>(T * cols));
    for_each_index(T * cols, GatherRows{raw(src), raw(didx), raw(xs), cols});
    const dvec<float> dd = upload(d, rows * cols);
    dvec<double> err(static_cast<size_t>(ng * rows));
    // Groups in chunks whose products fit in 64M floats.
    const int64_t per = std::max<int64_t>(1, std::min<int64_t>(ng, (int64_t{1} << 26) / std::max<int64_t>(1, rows * T)));
    dvec<float> P(static_cast<size_t>(per * rows * T));
    for (int64_t k0 = 0; k0 < ng; k0 += per) {
      const int64_t nk = std::min(per, ng - k0);
      // P_k (rows x T) = D_k (rows x group) X_k^T: D_k is op T of the
      // column-major group x rows view of d's columns k*group.., X_k the
      // group x T view of the sampled rows.
      engine_.blas().gemm_strided_batched(Op::T, Op::N, rows, T, group, 1.0f, raw(dd) + k0 * group, cols, group,
                                          raw(xs) + k0 * group, cols, group, 0.0f, raw(P), rows, rows * T, nk);
      for_each_index(nk * rows, MeanSquareOverTokens{raw(P), raw(err) + k0 * rows, rows, T});
    }
    // To [r * ng + k].
    const std::vector<double> byk = download(err);
    std::vector<double> out(byk.size());
    for (int64_t k = 0; k < ng; ++k)
      for (int64_t r = 0; r < rows; ++r) out[static_cast<size_t>(r * ng + k)] = byk[static_cast<size_t>(k * rows + r)];
    return out;
  }

  double loss(rt::SmoothingBlock block) override {
    check_ready(true);
    const int64_t h = c_.hidden_size, qd = c_.q_dim(), ff = c_.intermediate_size;
    double total = 0.0;
    const auto add = [&](const float* got, const float* want, int64_t m) {
      for_each_index(m, SqDiffRows{got, want, raw(row_sums_), h});
      std::vector<double> s(static_cast<size_t>(m));
      thrust::copy(row_sums_.begin(), row_sums_.begin() + static_cast<std::ptrdiff_t>(m), s.begin());
      for (double v : s) total += v;
    };
    switch (block) {
      case rt::SmoothingBlock::Attention:
      case rt::SmoothingBlock::Layer: {
        // Per sequence from its inputs: the attention block, or the whole layer.
        const bool whole = block == rt::SmoothingBlock::Layer;
        const float* want = raw(whole ? layer_out_ : attn_out_);
        for_each_pass([&](int64_t at, int64_t m, int64_t pos0) {
          engine_.set_x_device(raw(x_in_) + at * h, m);
          if (whole) engine_.layer(layer_, m, pos0, nullptr);
          else engine_.attention_block(layer_, m, pos0, nullptr);
          add(whole ? engine_.x() : engine_.y(), want + at * h, m);
        });
        break;
      }
      case rt::SmoothingBlock::Mlp:
        for_each_chunk([&](int64_t at, int64_t m) {
          engine_.set_xn_device(raw(mlp_in_) + at * h, m);
          engine_.mlp_block(layer_, m, nullptr);
          add(engine_.y(), raw(mlp_out_) + at * h, m);
        });
        break;
      case rt::SmoothingBlock::O:
      case rt::SmoothingBlock::Down: {
        // One Linear on the reference's input: o_proj (attention output) or down_proj (MLP output).
        const bool o = block == rt::SmoothingBlock::O;
        DeviceLinear& lin = layer_.lin[o ? 3 : 6];
        const int64_t cols = o ? qd : ff;
        const float* in = raw(o ? o_in_ : down_in_);
        const float* want = raw(o ? attn_out_ : mlp_out_);
        for_each_chunk([&](int64_t at, int64_t m) {
          engine_.linear(lin, in + at * cols, m, raw(out_));
          add(raw(out_), want + at * h, m);
        });
        break;
      }
    }
    return n_ > 0 ? total / static_cast<double>(n_ * h) : 0.0;
  }

 private:
  // The reference run's rows of a Linear input.
  const dvec<float>& buffer_of(rt::LayerInput input) const {
    return input == rt::LayerInput::Attention ? q_in_
           : input == rt::LayerInput::O       ? o_in_
           : input == rt::LayerInput::Mlp     ? mlp_in_
                                              : down_in_;
  }

  void check_ready(bool need_reference) const {
    if (layer_index_ < 0 || n_ == 0) throw Error(ErrorKind::Internal, "device smoothing: load and set_inputs come first");
    if (need_reference && !referenced_) throw Error(ErrorKind::Internal, "device smoothing: run_reference comes first");
  }

  // fn(first token, tokens, position of the first) over each sequence in
  // passes of at most kDevicePassTokens tokens, in order.
  template <class F>
  void for_each_pass(F fn) {
    for (size_t s = 0; s < lengths_.size(); ++s)
      for (int64_t t0 = 0; t0 < lengths_[s]; t0 += rt::kDevicePassTokens)
        fn(offsets_[s] + t0, std::min(rt::kDevicePassTokens, lengths_[s] - t0), t0);
  }
  // fn(first token, tokens) over all tokens in chunks, for blocks without attention.
  template <class F>
  void for_each_chunk(F fn) {
    for (int64_t t0 = 0; t0 < n_; t0 += rt::kDevicePassTokens) fn(t0, std::min(rt::kDevicePassTokens, n_ - t0));
  }

  const rt::Model& m_;
  const ModelConfig& c_;
  int64_t longest_, n_ = 0, layer_index_ = -1;
  bool referenced_ = false;
  std::vector<int64_t> lengths_, offsets_;
  LayerEngine engine_;
  DeviceLayer layer_;
  Capture cap_;
  dvec<float> x_in_, q_in_, o_in_, attn_out_, mlp_in_, down_in_, mlp_out_, layer_out_, out_;
  dvec<double> row_sums_;
};

}  // namespace

std::unique_ptr<rt::DeviceSmoothingEval> make_smoothing_eval(const rt::Model& model, int64_t longest) {
  return std::make_unique<SmoothingEval>(model, longest);
}

}  // namespace qf::QF_DEV_NS
