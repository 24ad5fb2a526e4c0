// An independent forward pass of the Llama family (llama, mistral, qwen2,
// qwen3) for tests: written from the Hugging Face transformers semantics only,
// in double precision, every position recomputed from scratch (no KV cache),
// and no runtime code.
//
// Beside each logit it computes how far the runtime's f32 logit may honestly
// be from it. The runtime's result differs from the exact one for two
// reasons, treated separately:
//
// 1. Rounding of the f16 K/V cache: a discontinuous function. A K or V element
//    that lies close to the middle between two halves may round either way,
//    depending on the last bits of the f32 arithmetic before it (so on the
//    SIMD level). One such flip moves a logit by up to ~1e-4 of its range,
//    hundreds of times the f32 noise, so no fixed tolerance can be both
//    machine-independent and tight. Instead the reference reads back what the
//    runtime cached (Options::cache) and checks each element: it must be the
//    f16 rounding of the exact value, or, where the exact value is within the
//    f32 error bound of k (below) of an f16 rounding boundary, the half on
//    the other side. A value outside that set is a bug (counted in
//    Result::cache_errors). The reference then continues with the cached
//    values, so what follows is continuous in the rounding errors.
//
// 2. f32 rounding everywhere else: bounded by re-running the reference with
//    every operation given a random error of the size the standard analysis
//    gives for it (Monte Carlo arithmetic, D. S. Parker 1997; the model of
//    independent rounding errors of Higham & Mary, "A New Approach to
//    Probabilistic Rounding Error Analysis", SIAM J. Sci. Comput. 2019):
//      - a dot product or sum of n terms in f32: the sequential recursive sum
//        has error sum_k d_k S_k over its partial sums S_k (and the products'
//        own roundings), |d_k| <= u = 2^-24, so with independent uniform d_k
//        a normal error of standard deviation u sqrt((sum_k S_k^2 + sum t_k^2) / 3)
//        (the runtime's blocked SIMD sums have shorter partial sums, so this
//        is the larger of the two);
//      - every other f32 operation (+ - * /, the rounding of a product, of
//        cos, sin, sqrt, of the f32 inverse RoPE frequencies): a uniform
//        relative error within u (cosf/sinf: absolute u, their values being
//        below 1; powf-based frequencies: inv_freq_ulps * u);
//      - exp: uniform within 2e-7 + 1.5 u |x| relative (the runtime's AVX2
//        polynomial: at most 1.06 u + 1.5 u |x| on every float in [-87, 87]
//        against long double, the 1.5 u |x| being the rounding of x log2(e)
//        that the range reduction scales up; std::exp on a float: 1 ulp).
//    These errors propagate through every layer exactly as the computation
//    does (correlations included), and the bound on each logit is
//    kBoundFactor (10) times the largest deviation from the exact logit over
//    kSamples (16) samples. Were the runtime's error a normal variable with
//    the model's spread, it would exceed ten times the largest of 16 samples
//    with probability 4e-12 per logit (1.5e-7 with 8 samples: too likely
//    over the 1e5 logits a test run compares); the runtime's real errors are
//    smaller still (shorter partial sums, fused multiply-adds).
//    The same deviations of K (and V) over the samples, times kBoundFactor,
//    are the "f32 error bound of k" used in 1.
//
// The bounds come out near 2e-5 of max |logit| for the test models, and the
// runtime's f32 logits within a quarter of them; a bug of relative size 1e-3
// on the path (a scale, a norm, a frequency) or a dropped term moves logits by
// 1e-4 to 1e-2 of max |logit|.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "formats/safetensors.h"

namespace qf::test::reference {

using Vec = std::vector<double>;

constexpr double kU32 = 1.0 / 16777216.0;  // f32 unit roundoff, 2^-24
constexpr int kSamples = 16;
constexpr double kBoundFactor = 10.0;

// The hyperparameters, from the test's own knowledge of the model (never from
// the runtime's parsed config).
struct Arch {
  int64_t hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, inter = 0, vocab = 0;
  double eps = 1e-6;
  Vec inv_freq;                 // head_dim / 2 RoPE inverse frequencies
  double inv_freq_ulps = 0;     // the runtime's f32 inv_freq are within inv_freq_ulps * u (relative) of these
  bool qk_norm = false;         // qwen3: RMSNorm of every q and k head
  bool tie = false;             // logits from the embedding
  std::vector<int64_t> window;  // per layer; 0 (or absent) = full attention

  int64_t q_dim() const { return heads * head_dim; }
  int64_t kv_dim() const { return kv_heads * head_dim; }
  int64_t window_of(int64_t layer) const {
    return layer < static_cast<int64_t>(window.size()) ? window[static_cast<size_t>(layer)] : 0;
  }
};

// The bound (in units of u) on the runtime's f32 inverse frequencies
// 1 / powf(theta, 2i/d), then divided by a scaling factor: powf within 1 ulp
// (2u), the reciprocal u, a scaling step u; when 2i/d is not a float the
// rounded exponent moves the power by up to u ln(theta) relative.
inline double rope_inv_freq_ulps(double theta, int64_t head_dim, bool scaled) {
  bool exact_exponents = true;
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const double ex = 2.0 * static_cast<double>(i) / static_cast<double>(head_dim);
    exact_exponents = exact_exponents && static_cast<double>(static_cast<float>(ex)) == ex;
  }
  return 3.0 + (scaled ? 1.0 : 0.0) + (exact_exponents ? 0.0 : std::log(theta));
}

// Weights by Hugging Face name, in double. rel_err[name] (default 0): each
// stored value may be this far (relative) from the value the test means, for
// checks of exact identities on weights that were rounded to f32.
struct Weights {
  std::map<std::string, Vec> t;
  std::map<std::string, double> rel_err;

  static Weights load(const std::filesystem::path& dir) {
    Weights w;
    Checkpoint ck = Checkpoint::open(dir);
    for (const auto& name : ck.names()) {
      std::vector<float> f = ck.tensor(name).to_f32_vector();
      w.t[name] = Vec(f.begin(), f.end());
    }
    return w;
  }
  void set(const std::string& name, const std::vector<float>& v) { t[name] = Vec(v.begin(), v.end()); }
  const Vec& get(const std::string& name) const {
    auto it = t.find(name);
    if (it == t.end()) throw std::runtime_error("reference: no tensor " + name);
    return it->second;
  }
  const Vec* find(const std::string& name) const {
    auto it = t.find(name);
    return it == t.end() ? nullptr : &it->second;
  }
};

// What the runtime's cache holds for one sequence: k[layer][position] and
// v[layer][position], kv_dim values each (f16 values as floats).
struct CacheValues {
  std::vector<std::vector<std::vector<float>>> k, v;
};

struct Options {
  // The runtime's cached K/V (see 1. above); nullptr: the reference keeps K
  // and V exact (for identities in exact arithmetic).
  const CacheValues* cache = nullptr;
  bool f32_noise = true;  // the samples model the runtime's f32 rounding (2. above)
  int samples = kSamples;
  uint64_t seed = 1;
};

// Logits [T][vocab], elementwise bounds on |runtime - reference|, and the
// cache elements outside what f16 rounding allows.
struct Result {
  std::vector<Vec> logits, bound;
  int64_t cache_errors = 0;
  std::string first_cache_error;
};

// ---- f16 rounding, written out here (not taken from core/dtype) --------------

// A float rounded to the nearest IEEE half (ties to even), as a double.
inline double round_f16(float xf) {
  const double x = xf;
  if (x == 0.0 || !std::isfinite(x)) return x;
  int e = 0;
  std::frexp(x, &e);                              // |x| in [2^(e-1), 2^e)
  const int lead = std::max(e - 1, -14);          // subnormals share the 2^-14 exponent
  const double ulp = std::ldexp(1.0, lead - 10);  // 11 significant bits
  return std::nearbyint(x / ulp) * ulp;
}

namespace detail {

// Deterministic random numbers (xorshift64*), independent of the library.
struct Noise {
  uint64_t s;
  explicit Noise(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull) {}
  double uniform() {  // in [-1, 1)
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    return static_cast<double>((s * 2685821657736338717ull) >> 11) * (2.0 / 9007199254740992.0) - 1.0;
  }
  double normal() {  // Box-Muller
    double a = 0.5 * (uniform() + 1.0), b = 0.5 * (uniform() + 1.0);
    if (a < 1e-300) a = 1e-300;
    return std::sqrt(-2.0 * std::log(a)) * std::cos(2.0 * M_PI * b);
  }
};

// One pass: exact when noise == nullptr, else one Monte Carlo sample.
struct Pass {
  const Arch& a;
  const Weights& w;
  const Options& o;
  Noise* noise;

  // x (1 + d), |d| <= rel u: one f32 operation.
  bool f32() const { return noise && o.f32_noise; }
  double op(double x, double rel = 1.0) { return f32() ? x * (1.0 + rel * kU32 * noise->uniform()) : x; }
  // The sum of n terms t[i] as the f32 sequential sum rounds it (see 2.).
  double sum(const double* t, int64_t n) {
    double s = 0, ss = 0;
    for (int64_t i = 0; i < n; ++i) s += t[i], ss += s * s + t[i] * t[i];
    return f32() ? s + kU32 * std::sqrt(ss / 3.0) * noise->normal() : s;
  }
  double dot(const double* x, const double* y, int64_t n, int64_t ystride = 1) {
    thread_local Vec t;
    t.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = x[i] * y[i * ystride];
    return sum(t.data(), n);
  }
  double exp_op(double x) {
    const double e = std::exp(x);
    return f32() ? e * (1.0 + (2e-7 + 1.5 * kU32 * std::fabs(x)) * noise->uniform()) : e;
  }

  // The stored weights, perturbed within rel_err in a sample.
  std::map<std::string, Vec> perturbed = {};
  const Vec& weight(const std::string& name) {
    auto it = w.rel_err.find(name);
    if (!noise || it == w.rel_err.end() || it->second == 0) return w.get(name);
    auto [pos, fresh] = perturbed.try_emplace(name, w.get(name));
    if (fresh)
      for (double& v : pos->second) v *= 1.0 + it->second * noise->uniform();
    return pos->second;
  }
  const Vec* find_weight(const std::string& name) { return w.find(name) ? &weight(name) : nullptr; }

  // y = W x (+ b), W [out, in].
  Vec linear(const std::string& prefix, const Vec& x, int64_t out) {
    const Vec& W = weight(prefix + ".weight");
    const int64_t in = static_cast<int64_t>(x.size());
    if (static_cast<int64_t>(W.size()) != out * in) throw std::runtime_error("reference: shape of " + prefix);
    const Vec* b = find_weight(prefix + ".bias");
    Vec y(static_cast<size_t>(out));
    for (int64_t r = 0; r < out; ++r) {
      double acc = dot(W.data() + r * in, x.data(), in);
      if (b) acc = op(acc + (*b)[static_cast<size_t>(r)]);
      y[static_cast<size_t>(r)] = acc;
    }
    return y;
  }

  // y = x / sqrt(mean(x^2) + eps) * w over n elements. The runtime sums x^2 in
  // double (exact enough), adds the f32 eps, rounds the scale to f32 and
  // forms (x r) w in f32.
  void rms_norm(const double* x, const Vec& wt, int64_t n, double* y) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
    const double r = op(1.0 / std::sqrt(ss / static_cast<double>(n) + op(a.eps)));
    for (int64_t i = 0; i < n; ++i) y[i] = op(op(x[i] * r) * wt[static_cast<size_t>(i)]);
  }

  // rotate_half RoPE of one head at position p, pairs (i, i + hd/2).
  Vec inv_freq = {};  // per pass: the runtime's f32 frequencies are within inv_freq_ulps u
  void rope(double* v, int64_t p) {
    const int64_t half = a.head_dim / 2;
    for (int64_t i = 0; i < half; ++i) {
      const double ang = op(static_cast<double>(p) * inv_freq[static_cast<size_t>(i)]);
      double co = std::cos(ang), sn = std::sin(ang);
      if (f32()) co += kU32 * noise->uniform(), sn += kU32 * noise->uniform();
      const double x0 = v[i], x1 = v[i + half];
      v[i] = op(op(x0 * co) - op(x1 * sn));
      v[i + half] = op(op(x1 * co) + op(x0 * sn));
    }
  }

  // Logits [T][vocab]; K and V before the cache (kv_pre) are recorded for the
  // cache check: kv_pre[layer][position] = K then V, kv_dim each.
  std::vector<Vec> run(const std::vector<int32_t>& tokens, std::vector<std::vector<Vec>>& kv_pre) {
    const int64_t T = static_cast<int64_t>(tokens.size()), H = a.hidden, hd = a.head_dim, kvd = a.kv_dim();
    const int64_t nh = a.heads, group = nh / a.kv_heads;
    inv_freq = a.inv_freq;
    if (f32())
      for (double& f : inv_freq) f *= 1.0 + a.inv_freq_ulps * kU32 * noise->uniform();
    const double scale = op(1.0 / std::sqrt(static_cast<double>(hd)), 2.0);  // f32 sqrt and division
    const Vec& emb = weight("model.embed_tokens.weight");
    std::vector<Vec> x(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      const size_t r = static_cast<size_t>(tokens[static_cast<size_t>(t)]) * static_cast<size_t>(H);
      x[static_cast<size_t>(t)] = Vec(emb.begin() + static_cast<std::ptrdiff_t>(r), emb.begin() + static_cast<std::ptrdiff_t>(r + H));
    }
    kv_pre.assign(static_cast<size_t>(a.layers), std::vector<Vec>(static_cast<size_t>(T)));
    for (int64_t l = 0; l < a.layers; ++l) {
      const size_t ls = static_cast<size_t>(l);
      const std::string p = "model.layers." + std::to_string(l) + ".";
      std::vector<Vec> q(static_cast<size_t>(T)), k(q.size()), v(q.size());
      for (int64_t t = 0; t < T; ++t) {
        const size_t ts = static_cast<size_t>(t);
        Vec xn(static_cast<size_t>(H));
        rms_norm(x[ts].data(), weight(p + "input_layernorm.weight"), H, xn.data());
        q[ts] = linear(p + "self_attn.q_proj", xn, a.q_dim());
        k[ts] = linear(p + "self_attn.k_proj", xn, kvd);
        v[ts] = linear(p + "self_attn.v_proj", xn, kvd);
        if (a.qk_norm) {
          const Vec &qn = weight(p + "self_attn.q_norm.weight"), &kn = weight(p + "self_attn.k_norm.weight");
          for (int64_t h = 0; h < nh; ++h) rms_norm(q[ts].data() + h * hd, qn, hd, q[ts].data() + h * hd);
          for (int64_t h = 0; h < a.kv_heads; ++h) rms_norm(k[ts].data() + h * hd, kn, hd, k[ts].data() + h * hd);
        }
        for (int64_t h = 0; h < nh; ++h) rope(q[ts].data() + h * hd, t);
        for (int64_t h = 0; h < a.kv_heads; ++h) rope(k[ts].data() + h * hd, t);
        Vec& pre = kv_pre[ls][ts];
        pre = k[ts];
        pre.insert(pre.end(), v[ts].begin(), v[ts].end());
        if (o.cache) {  // continue with what the runtime cached (checked by forward())
          for (int64_t i = 0; i < kvd; ++i) {
            k[ts][static_cast<size_t>(i)] = o.cache->k.at(ls).at(ts).at(static_cast<size_t>(i));
            v[ts][static_cast<size_t>(i)] = o.cache->v.at(ls).at(ts).at(static_cast<size_t>(i));
          }
        }
      }
      const int64_t win = a.window_of(l);
      for (int64_t t = 0; t < T; ++t) {
        const size_t ts = static_cast<size_t>(t);
        Vec att(static_cast<size_t>(a.q_dim()), 0.0);
        const int64_t lo = win > 0 ? std::max<int64_t>(0, t - win + 1) : 0;
        const int64_t n = t - lo + 1;
        for (int64_t h = 0; h < nh; ++h) {
          const int64_t kvh = h / group;
          Vec sc(static_cast<size_t>(n)), col(static_cast<size_t>(n));
          double mx = -1e300;
          for (int64_t j = lo; j <= t; ++j) {
            const size_t jj = static_cast<size_t>(j - lo);
            sc[jj] = op(dot(q[ts].data() + h * hd, k[static_cast<size_t>(j)].data() + kvh * hd, hd) * scale);
            mx = std::max(mx, sc[jj]);
          }
          for (double& s : sc) s = exp_op(op(s - mx));
          const double inv = op(1.0 / sum(sc.data(), n));
          for (double& s : sc) s = op(s * inv);
          for (int64_t i = 0; i < hd; ++i) {
            for (int64_t j = lo; j <= t; ++j) col[static_cast<size_t>(j - lo)] = v[static_cast<size_t>(j)][static_cast<size_t>(kvh * hd + i)];
            att[static_cast<size_t>(h * hd + i)] = dot(sc.data(), col.data(), n);
          }
        }
        const Vec ov = linear(p + "self_attn.o_proj", att, H);
        for (int64_t i = 0; i < H; ++i) x[ts][static_cast<size_t>(i)] = op(x[ts][static_cast<size_t>(i)] + ov[static_cast<size_t>(i)]);
      }
      for (int64_t t = 0; t < T; ++t) {
        const size_t ts = static_cast<size_t>(t);
        Vec xn(static_cast<size_t>(H));
        rms_norm(x[ts].data(), weight(p + "post_attention_layernorm.weight"), H, xn.data());
        Vec g = linear(p + "mlp.gate_proj", xn, a.inter);
        const Vec up = linear(p + "mlp.up_proj", xn, a.inter);
        for (size_t i = 0; i < g.size(); ++i) g[i] = op(op(g[i] / op(1.0 + exp_op(-g[i]))) * up[i]);
        const Vec d = linear(p + "mlp.down_proj", g, H);
        for (int64_t i = 0; i < H; ++i) x[ts][static_cast<size_t>(i)] = op(x[ts][static_cast<size_t>(i)] + d[static_cast<size_t>(i)]);
      }
    }
    std::vector<Vec> logits;
    const std::string head = a.tie ? "model.embed_tokens" : "lm_head";
    for (int64_t t = 0; t < T; ++t) {
      Vec xn(static_cast<size_t>(H));
      rms_norm(x[static_cast<size_t>(t)].data(), weight("model.norm.weight"), H, xn.data());
      logits.push_back(linear(head, xn, a.vocab));
    }
    return logits;
  }
};

}  // namespace detail

// The logits of one sequence at positions 0..T-1 (causal, windowed per layer)
// with their bounds (see the top of this file).
inline Result forward(const Arch& a, const Weights& w, const std::vector<int32_t>& tokens, const Options& o = {}) {
  std::vector<std::vector<Vec>> kv_exact, kv_s;
  Result r;
  {
    detail::Pass exact{a, w, o, nullptr};
    r.logits = exact.run(tokens, kv_exact);
  }
  r.bound.assign(r.logits.size(), Vec(static_cast<size_t>(a.vocab), 0.0));
  // Largest deviation of K/V before the cache over the samples.
  std::vector<std::vector<Vec>> kv_dev = kv_exact;
  for (auto& l : kv_dev)
    for (auto& t : l) std::fill(t.begin(), t.end(), 0.0);
  const bool noisy = o.f32_noise || !w.rel_err.empty();
  for (int s = 0; noisy && s < o.samples; ++s) {
    detail::Noise noise(o.seed * 1000 + static_cast<uint64_t>(s));
    detail::Pass pass{a, w, o, &noise};
    const std::vector<Vec> lg = pass.run(tokens, kv_s);
    for (size_t t = 0; t < lg.size(); ++t)
      for (size_t j = 0; j < lg[t].size(); ++j)
        r.bound[t][j] = std::max(r.bound[t][j], std::fabs(lg[t][j] - r.logits[t][j]));
    for (size_t l = 0; l < kv_s.size(); ++l)
      for (size_t t = 0; t < kv_s[l].size(); ++t)
        for (size_t i = 0; i < kv_s[l][t].size(); ++i)
          kv_dev[l][t][i] = std::max(kv_dev[l][t][i], std::fabs(kv_s[l][t][i] - kv_exact[l][t][i]));
  }
  for (Vec& row : r.bound)
    for (double& b : row) b *= kBoundFactor;
  if (o.cache) {
    // Each cached element must lie between the f16 roundings of the ends of
    // [k - tau, k + tau], tau = kBoundFactor x the largest deviation of k over
    // the samples (the ends widened by one float, which covers a tie there).
    const int64_t kvd = a.kv_dim();
    for (size_t l = 0; l < kv_exact.size(); ++l)
      for (size_t t = 0; t < kv_exact[l].size(); ++t)
        for (int64_t i = 0; i < 2 * kvd; ++i) {
          const size_t is = static_cast<size_t>(i);
          const double k = kv_exact[l][t][is], tau = kBoundFactor * kv_dev[l][t][is];
          const float lo = std::nextafter(static_cast<float>(k - tau), -std::numeric_limits<float>::infinity());
          const float hi = std::nextafter(static_cast<float>(k + tau), std::numeric_limits<float>::infinity());
          const double got = i < kvd ? o.cache->k.at(l).at(t).at(is) : o.cache->v.at(l).at(t).at(static_cast<size_t>(i - kvd));
          if (got >= round_f16(lo) && got <= round_f16(hi)) continue;
          if (r.cache_errors++ == 0)
            r.first_cache_error = "layer " + std::to_string(l) + " position " + std::to_string(t) + " " +
                                  (i < kvd ? "K" : "V") + "[" + std::to_string(i % kvd) + "] = " + std::to_string(got) +
                                  ", exact " + std::to_string(k) + " (f16 " + std::to_string(round_f16(static_cast<float>(k))) + ")";
        }
  }
  return r;
}

// The largest |got - ref| / bound over all logits (got: [rows * vocab]
// floats, row-major, for the reference's rows from first_row on).
struct Check {
  double worst_ratio = 0;  // max |got - ref| / bound; above 1: outside the bound somewhere
  double max_diff = 0;     // max |got - ref|
  double max_bound = 0;    // the largest bound
  double max_abs = 0;      // max |ref|
  bool size_ok = true;
};

inline Check compare(const std::vector<float>& got, const Result& ref, size_t first_row = 0) {
  Check c;
  size_t i = 0;
  for (size_t r = first_row; r < ref.logits.size(); ++r)
    for (size_t j = 0; j < ref.logits[r].size(); ++j, ++i) {
      const double want = ref.logits[r][j], b = ref.bound[r][j];
      c.max_abs = std::max(c.max_abs, std::fabs(want));
      c.max_bound = std::max(c.max_bound, b);
      if (i >= got.size()) {
        c.size_ok = false;
        continue;
      }
      const double d = std::fabs(static_cast<double>(got[i]) - want);
      if (std::isnan(d)) {
        c.worst_ratio = INFINITY;
        continue;
      }
      c.max_diff = std::max(c.max_diff, d);
      c.worst_ratio = std::max(c.worst_ratio, b > 0 ? d / b : (d > 0 ? INFINITY : 0.0));
    }
  if (i != got.size()) c.size_ok = false;
  if (!c.size_ok) c.worst_ratio = INFINITY;
  return c;
}

}  // namespace qf::test::reference
