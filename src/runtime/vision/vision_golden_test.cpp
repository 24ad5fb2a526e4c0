// The vision side of tests/data/vlm's fixtures against their reference
// (reference_vision.safetensors, scripts/fixture/make_vlm_fixture.py and the
// vision-only fixtures' scripts beside it): for every image, the processor's
// pixel values bit for bit and the tower + merger/projector output within a
// derived f32 bound (LLaVA-NeXT: every tile, and the packed rows counted as
// the processor counts them); then the errors a bad checkpoint, config or
// image processor file must give.
#include "runtime/vision/vision_model.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>

#include <gtest/gtest.h>

#include "core/io.h"
#include "formats/hf/model_config.h"
#include "formats/hf/model_tensors.h"
#include "formats/safetensors.h"
#include "runtime/vision/anyres.h"
#include "runtime/vision/multimodal_prompt.h"
#include "runtime/vision/qwen2_vl_vision.h"
#include "test_util.h"

namespace qf::rt {
namespace {

std::filesystem::path vlm_dir() { return test::source_dir() / "tests" / "data" / "vlm"; }

struct Loaded {
  ModelConfig cfg;
  Checkpoint ck;
  VisionModel vm;
};

Loaded load(const std::filesystem::path& dir) {
  ModelConfig cfg = load_model_config(dir);
  Checkpoint ck = Checkpoint::open(dir);
  apply_hf_tensor_naming(cfg, ck);
  VisionModel vm = VisionModel::load(cfg, ck, dir);
  return {std::move(cfg), std::move(ck), std::move(vm)};
}

// The bound on max|ours - ref| / max|ref| for two f32 evaluations of the same
// network that differ only in rounding (summation order inside each dot
// product, libm's exp/erf/cos against PyTorch's, the norms' statistics).
//
// One dot product of length K computed in f32 carries an error of at most
// about K u sum|x_i w_i| (u = 2^-24, recursive summation), and, with
// rounding errors of random sign, typically sqrt(K) u sum|x_i w_i|. Relative
// to the largest output of the layer, sum|x_i w_i| is within a small factor
// of it for these layers (their inputs are normalised: LayerNorm before every
// Linear but the patch embedding, whose inputs are bounded pixel values), so
// each matrix product j adds a relative error of about sqrt(K_j) u. Pre-norm
// residual blocks pass an earlier relative error on roughly unchanged (the
// residual adds it, LayerNorm rescales it, attention's softmax and the
// activations have slopes of order 1), so the errors of the chain add up:
//   rel ~ sum_j sqrt(K_j) u   per implementation,
// and the difference of two implementations at most twice that. The factor
// kCondition = 8 covers what the sketch leaves out: the elementwise
// functions' few ulps per layer, the gains of the normalisations and of the
// merger's/projector's MLP above 1, and that the largest output row need not
// be the one with the largest error. The chains (reduction lengths per
// product, in forward order):
//   Qwen2-VL: patch embedding 3*tp*p^2; per block qkv E, q.k head_dim,
//             attention-weighted sum n (patches per frame, an upper bound
//             for 2.5's windows), proj E, fc1 E, fc2 mlp_hidden (2.5: gate E,
//             up E, down intermediate_size); merger mlp.0 and mlp.2 E*merge^2;
//   LLaVA:    patch embedding 3*p^2; per layer run (up to the feature layer)
//             the same six with n = patches + 1 and fc2 intermediate;
//             projector linear_1 E, linear_2 text hidden.
//   LLaVA-NeXT: LLaVA's chain for every tile; the packing copies rows
//             (image_newline included) and adds no rounding.
constexpr double kUnit = 1.0 / (1 << 24), kCondition = 8;

double bound(const std::vector<int64_t>& chain) {
  double s = 0;
  for (int64_t k : chain) s += std::sqrt(static_cast<double>(k));
  return 2 * kCondition * kUnit * s;
}

std::vector<int64_t> qwen_chain(const ModelConfig& cfg, int64_t n) {
  const auto& v = cfg.vlm->vision;
  const bool v25 = cfg.vlm->model_type == "qwen2_5_vl";
  const int64_t E = v25 ? v["hidden_size"] : v["embed_dim"], heads = v["num_heads"], p = v["patch_size"];
  const int64_t tp = v["temporal_patch_size"], m = v["spatial_merge_size"], depth = v["depth"];
  const int64_t mlp =
      v25 ? v["intermediate_size"].get<int64_t>() : static_cast<int64_t>(E * v["mlp_ratio"].get<double>());
  std::vector<int64_t> c{3 * tp * p * p};
  for (int64_t i = 0; i < depth; ++i) {
    c.insert(c.end(), {E, E / heads, n, E});
    if (v25)
      c.insert(c.end(), {E, E, mlp});  // gate, up (their product adds a rounding), down
    else
      c.insert(c.end(), {E, mlp});
  }
  c.insert(c.end(), {E * m * m, E * m * m});
  return c;
}

std::vector<int64_t> llava_chain(const ModelConfig& cfg) {
  const auto& v = cfg.vlm->vision;
  const int64_t E = v["hidden_size"], heads = v["num_attention_heads"], p = v["patch_size"], S = v["image_size"];
  const int64_t layers = v["num_hidden_layers"], inter = v["intermediate_size"];
  const int64_t fl = cfg.raw.value("vision_feature_layer", int64_t(-2));
  const int64_t run = fl < 0 ? layers + 1 + fl : fl, T = (S / p) * (S / p) + 1;
  std::vector<int64_t> c{3 * p * p};
  for (int64_t i = 0; i < run; ++i) c.insert(c.end(), {E, E / heads, T, E, E, inter});
  c.insert(c.end(), {E, cfg.hidden_size});
  return c;
}

size_t bit_differences(const std::vector<float>& a, const std::vector<float>& b) {
  size_t d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return d;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// Every image of the fixture: pixel values bit-equal, embeddings within the bound.
// LLaVA-NeXT's also: the resolution its tiles were cut at, and as many rows as
// LlavaNextProcessor expands <image> into.
void check_fixture(const std::string& name, bool qwen, int expected_images = 4) {
  const std::filesystem::path dir = vlm_dir() / name;
  Loaded m = load(dir);
  Checkpoint ref = Checkpoint::open(dir / "reference_vision.safetensors");
  const auto& meta = ref.metadata();
  int images = 0;
  for (int i = 0; meta.count("image" + std::to_string(i)); ++i, ++images) {
    const std::string key = "image" + std::to_string(i);
    SCOPED_TRACE(name + " " + key + " " + meta.at(key));
    const ImageU8 img = read_image(vlm_dir() / meta.at(key));
    const PixelValues pv = m.vm.preprocess(img);
    const Tensor want_pv = ref.tensor(key + ".pixel_values");
    ASSERT_EQ(pv.shape, want_pv.shape());
    EXPECT_EQ(bit_differences(pv.values, want_pv.to_f32_vector()), 0u) << "pixel values differ from the reference";
    if (qwen) {
      const std::vector<float> thw = ref.tensor(key + ".grid_thw").to_f32_vector();
      EXPECT_EQ(pv.grid_t, thw.at(0));
      EXPECT_EQ(pv.grid_h, thw.at(1));
      EXPECT_EQ(pv.grid_w, thw.at(2));
    }
    const ImageEmbedding e = m.vm.embed_pixels(pv);
    if (m.vm.model_type() == "llava_next") {
      const GridPinpoints& pins = m.vm.preprocess_config().grid_pinpoints;
      const std::vector<float> best = ref.tensor(key + ".best_resolution").to_f32_vector();
      const auto [bh, bw] = select_best_resolution(img.height, img.width, pins);
      EXPECT_EQ(bh, best.at(0));
      EXPECT_EQ(bw, best.at(1));
      EXPECT_EQ(pv.shape[0], 1 + (bh / 56) * (bw / 56));
      EXPECT_EQ(e.n_rows, llava_next_feature_count(img.height, img.width, pins, 56, 14));
    }
    const Tensor want = ref.tensor(key + ".embeds");
    ASSERT_EQ((Shape{e.n_rows, e.hidden}), want.shape());
    EXPECT_EQ(e.grid_t * e.grid_h * e.grid_w, e.n_rows);
    const std::vector<float> w = want.to_f32_vector();
    const double rel = max_diff(e.rows, w) / max_abs(w);
    const double tol = bound(qwen ? qwen_chain(m.cfg, pv.grid_h * pv.grid_w) : llava_chain(m.cfg));
    EXPECT_LE(rel, tol) << "max |diff| / max |ref| = " << rel;
    std::printf("  %s %s: pixel values bit-equal, embeds [%lld, %lld] max|diff|/max|ref| = %.3g (bound %.3g)\n",
                name.c_str(), key.c_str(), static_cast<long long>(e.n_rows), static_cast<long long>(e.hidden), rel,
                tol);
  }
  EXPECT_EQ(images, expected_images);
}

TEST(VisionGolden, Qwen2VLMatchesReference) { check_fixture("qwen2-vl", true); }
TEST(VisionGolden, LlavaMatchesReference) { check_fixture("llava", false); }
// A vision-only Qwen2.5-VL fixture (scripts/fixture/make_qwen25_vision_fixture.py):
// window attention with windows cut short by the grid and empty windows.
TEST(VisionGolden, Qwen25VLMatchesReference) { check_fixture("qwen2_5-vl-vision", true, 3); }
// A vision-only LLaVA-NeXT fixture (scripts/fixture/make_llava_next_vision_fixture.py):
// llava's tower with anyres tiling at three resolutions, padding and
// unpadding along both axes, an odd padding, a tie in select_best_resolution
// and an unpad that int(round(x, 7)) decides.
TEST(VisionGolden, LlavaNextMatchesReference) { check_fixture("llava-next-vision", false, 7); }

// The prompt of a llava_next model: <s>, one <image> token per packed row,
// as many as LlavaNextProcessor expands <image> into for the image's size,
// each taking the next row, then the text.
TEST(VisionGolden, LlavaNextPromptExpandsTheImageToken) {
  Loaded m = load(vlm_dir() / "llava-next-vision");
  const Checkpoint ref = Checkpoint::open(vlm_dir() / "llava-next-vision" / "reference_vision.safetensors");
  const int32_t image_token = static_cast<int32_t>(m.cfg.vlm->image_token_id);
  ThreadPool pool(2);
  for (int i = 0; ref.metadata().count("image" + std::to_string(i)); ++i) {
    const std::string file = ref.metadata().at("image" + std::to_string(i));
    SCOPED_TRACE(file);
    const ImageU8 img = read_image(vlm_dir() / file);
    const int64_t want =
        llava_next_feature_count(img.height, img.width, m.vm.preprocess_config().grid_pinpoints, 56, 14);
    const MultimodalSequence s = image_text_sequence(m.cfg, m.vm.embed(img, pool), {300, 301, 302}, 1);
    ASSERT_EQ(static_cast<int64_t>(s.tokens.size()), 1 + want + 3);
    EXPECT_EQ(std::count(s.tokens.begin(), s.tokens.end(), image_token), want);
    EXPECT_EQ(s.first_text, 1 + want);
    for (int64_t k = 0; k < want; ++k) EXPECT_EQ(s.inputs.embed_row[static_cast<size_t>(1 + k)], k);
    EXPECT_EQ(static_cast<int64_t>(s.inputs.embeds->size()), want * m.cfg.hidden_size);
  }
}

// ----------------------------------------------------------------------------- anyres geometry

TEST(VisionAnyres, SelectBestResolution) {
  const GridPinpoints pins{{56, 112}, {112, 56}, {112, 112}, {56, 168}, {168, 56}};
  using HW = std::pair<int64_t, int64_t>;
  EXPECT_EQ(select_best_resolution(48, 64, pins), (HW{56, 112}));
  EXPECT_EQ(select_best_resolution(70, 90, pins), (HW{112, 112}));  // the only one holding all 6300 pixels
  // 52x40 (h x w) fits whole in 56x112 and 112x56 alike, with the same waste: the first listed wins.
  EXPECT_EQ(select_best_resolution(52, 40, pins), (HW{56, 112}));
  EXPECT_EQ(select_best_resolution(100, 40, pins), (HW{112, 56}));
  EXPECT_EQ(select_best_resolution(47, 188, pins), (HW{56, 168}));
  // LLaVA-v1.6's default resolutions.
  const GridPinpoints v16{{336, 672}, {672, 336}, {672, 672}, {1008, 336}, {336, 1008}};
  EXPECT_EQ(select_best_resolution(600, 800, v16), (HW{672, 672}));
}

TEST(VisionAnyres, FitSizeAndUnpad) {
  using HW = std::pair<int64_t, int64_t>;
  // 90x40 (w x h) into 56x112: the width fills, the height ceil(40 * 112 / 90) = ceil(49.8) = 50.
  EXPECT_EQ(anyres_fit_size(40, 90, {56, 112}), (HW{50, 112}));
  // 40x100 into 112x56: the height fills, the width ceil(44.8) = 45 (11 columns of padding: 5 before, 6 after).
  EXPECT_EQ(anyres_fit_size(100, 40, {112, 56}), (HW{112, 45}));
  EXPECT_EQ(trunc_round7(5.99999999999), 6);
  EXPECT_EQ(trunc_round7(55 * (24.0 / 11)), 120);  // 119.99999999999999
  EXPECT_EQ(trunc_round7(5.9999), 5);
  EXPECT_EQ(trunc_round7(7.0), 7);
  // A 40x90 image's 4x8 feature grid keeps rows 1..2 (new height int(40 * 8 / 90) = 3, padding 0 and 1 -> 0).
  UnpadWindow u = anyres_unpad(40, 90, 4, 8);
  EXPECT_EQ(u.top, 0);
  EXPECT_EQ(u.bottom, 4);
  u = anyres_unpad(84, 120, 8, 8);  // new height int(5.6) = 5: one row off each end
  EXPECT_EQ(u.top, 1);
  EXPECT_EQ(u.bottom, 7);
  EXPECT_EQ(u.left, 0);
  EXPECT_EQ(u.right, 8);
  u = anyres_unpad(100, 40, 8, 4);  // columns: new width int(3.2) = 3, padding 0
  EXPECT_EQ(u.left, 0);
  EXPECT_EQ(u.right, 4);
  u = anyres_unpad(47, 188, 4, 12);  // 47 * (12 / 188) = 2.9999999999999996 counts as 3: nothing cut
  EXPECT_EQ(u.top, 0);
  EXPECT_EQ(u.bottom, 4);
}

TEST(VisionAnyres, FeatureCountAsTheProcessorCounts) {
  const GridPinpoints pins{{56, 112}, {112, 56}, {112, 112}, {56, 168}, {168, 56}};
  EXPECT_EQ(llava_next_feature_count(84, 120, pins, 56, 14), 16 + 6 * 8 + 6);
  EXPECT_EQ(llava_next_feature_count(47, 188, pins, 56, 14), 16 + 4 * 12 + 4);  // int(x) would give 42
  // LLaVA-v1.6 (336-pixel tiles, patch 14): an 800x600 image is tiled 2x2 (a 48x48 grid), its
  // height 600 * 48 / 800 = 36 rows: 36 * 48 + 36 newlines + 576.
  const GridPinpoints v16{{336, 672}, {672, 336}, {672, 672}, {1008, 336}, {336, 1008}};
  EXPECT_EQ(llava_next_feature_count(600, 800, v16, 336, 14), 2340);
  // 55x176 (h x w): 176 * ... the rounding to 7 decimals keeps 1360 (int() alone gave 1262).
  EXPECT_EQ(llava_next_feature_count(55, 176, v16, 336, 14), 1360);
}

TEST(VisionWindows, Qwen25WindowIndex) {
  // 6x8 patches, merge 2: 3x4 merged units; windows of 2x2 units. transformers
  // pads to 4x6 units: windows (row 0) units {0,1,4,5} {2,3,6,7} {} and
  // (row 1) {8,9} {10,11} {}; the empty ones are dropped from the bounds.
  const VisionWindows w = qwen2_5_vl_windows(1, 6, 8, 2, 2);
  EXPECT_EQ(w.order, (std::vector<int64_t>{0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(w.segments, (std::vector<int64_t>{0, 16, 32, 40, 48}));
  // A side the window divides still gets a padded (empty) window; two frames count on.
  const VisionWindows v = qwen2_5_vl_windows(2, 4, 4, 2, 2);
  EXPECT_EQ(v.order, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(v.segments, (std::vector<int64_t>{0, 16, 32}));
  // Windows larger than the grid: one window per frame.
  const VisionWindows one = qwen2_5_vl_windows(1, 4, 6, 2, 8);
  EXPECT_EQ(one.segments, (std::vector<int64_t>{0, 24}));
}

TEST(VisionGolden, EmbedsAnImageFileAndIsThreadCountIndependent) {
  for (const char* name : {"qwen2-vl", "llava", "llava-next-vision"}) {
    Loaded m = load(vlm_dir() / name);
    const ImageU8 img = read_image(vlm_dir() / "images" / "img3_two_shapes.png");
    ThreadPool one(1), three(3);
    const ImageEmbedding a = m.vm.embed(img, one), b = m.vm.embed(img, three);
    EXPECT_EQ(a.rows, b.rows) << name;
    EXPECT_EQ(a.hidden, m.cfg.hidden_size);
    if (std::string(name) == "qwen2-vl") {
      EXPECT_EQ(a.n_rows, 12);  // 84x112 pixels: 6x8 patches, 3x4 after merging
      EXPECT_EQ(a.grid_h, 3);
      EXPECT_EQ(a.grid_w, 4);
    } else if (std::string(name) == "llava-next-vision") {
      EXPECT_EQ(a.n_rows, 70);  // 16 + a 2x2 tiling's 8x8 grid unpadded to 6 rows of 8, + 6 newlines
      EXPECT_EQ(a.grid_h, 1);
      EXPECT_EQ(a.grid_w, 70);
    } else {
      EXPECT_EQ(a.n_rows, 16);  // 56x56 pixels: 4x4 patches, CLS dropped
      EXPECT_EQ(a.grid_h, 1);
      EXPECT_EQ(a.grid_w, 16);
    }
  }
}

// ----------------------------------------------------------------------------- errors

// A copy of a fixture's config files and vision tensors, with edits.
struct FixtureCopy {
  test::TempDir dir;
  explicit FixtureCopy(const std::string& name,
                       const std::function<void(const std::string&, Tensor&, bool& keep)>& edit = {},
                       const std::function<void(nlohmann::json& config, nlohmann::json& pre)>& edit_json = {}) {
    const std::filesystem::path src = vlm_dir() / name;
    nlohmann::json config = nlohmann::json::parse(read_text_file(src / "config.json"));
    nlohmann::json pre = nlohmann::json::parse(read_text_file(src / "preprocessor_config.json"));
    if (edit_json) edit_json(config, pre);
    test::write_file(dir / "config.json", config.dump(2));
    if (!pre.is_null()) test::write_file(dir / "preprocessor_config.json", pre.dump(2));
    Checkpoint ck = Checkpoint::open(src);
    SafetensorsWriter w(dir.path());
    for (const std::string& n : ck.names()) {
      if (!is_vision_tensor(n)) continue;
      Tensor t = ck.tensor(n);
      bool keep = true;
      if (edit) edit(n, t, keep);
      if (keep) w.add(n, t);
    }
    w.finish();
  }
};

TEST(VisionErrors, WrongTensorShapeNamesTheTensor) {
  FixtureCopy qwen("qwen2-vl", [](const std::string& n, Tensor& t, bool&) {
    if (n == "visual.blocks.1.mlp.fc1.weight") t = Tensor::zeros(DType::F16, {255, 64});
  });
  EXPECT_QF_ERROR(load(qwen.dir.path()), ErrorKind::InvalidInput,
                  "tensor 'visual.blocks.1.mlp.fc1.weight' has shape [255, 64], but vision_config");
  FixtureCopy llava("llava", [](const std::string& n, Tensor& t, bool&) {
    if (n == "multi_modal_projector.linear_1.weight") t = Tensor::zeros(DType::F16, {256, 65});
  });
  EXPECT_QF_ERROR(load(llava.dir.path()), ErrorKind::InvalidInput, "multi_modal_projector.linear_1.weight");
  // A layer the tower never runs (past vision_feature_layer -2) is still checked.
  FixtureCopy unused("llava", [](const std::string& n, Tensor& t, bool&) {
    if (n == "vision_tower.vision_model.encoder.layers.2.mlp.fc2.bias") t = Tensor::zeros(DType::F16, {63});
  });
  EXPECT_QF_ERROR(load(unused.dir.path()), ErrorKind::InvalidInput, "encoder.layers.2.mlp.fc2.bias");
}

TEST(VisionErrors, Qwen25ConfigWithQwen2Weights) {
  // A Qwen2-VL checkpoint labelled qwen2_5_vl: the 2.5 tower's RMSNorm and gated MLP tensors are missing.
  FixtureCopy q25("qwen2-vl", {}, [](nlohmann::json& c, nlohmann::json&) {
    c["model_type"] = "qwen2_5_vl";
    auto& v = c["vision_config"];
    v["hidden_size"] = 64;
    v["intermediate_size"] = 256;
    v["out_hidden_size"] = 256;
    v["fullatt_block_indexes"] = {1};
  });
  EXPECT_QF_ERROR(load(q25.dir.path()), ErrorKind::NotFound, "visual.blocks.0.mlp.gate_proj.weight");
  FixtureCopy window("qwen2_5-vl-vision", {}, [](nlohmann::json& c, nlohmann::json&) {
    c["vision_config"]["window_size"] = 20;
  });
  EXPECT_QF_ERROR(load(window.dir.path()), ErrorKind::InvalidInput, "window_size 20");
  FixtureCopy full("qwen2_5-vl-vision", {}, [](nlohmann::json& c, nlohmann::json&) {
    c["vision_config"]["fullatt_block_indexes"] = {1, 3};
  });
  EXPECT_QF_ERROR(load(full.dir.path()), ErrorKind::InvalidInput, "fullatt_block_indexes holds 3");
}

TEST(VisionErrors, MissingOrExtraTensors) {
  FixtureCopy missing("qwen2-vl", [](const std::string& n, Tensor&, bool& keep) {
    keep = n != "visual.merger.ln_q.bias";
  });
  EXPECT_QF_ERROR(load(missing.dir.path()), ErrorKind::NotFound, "visual.merger.ln_q.bias");
  FixtureCopy quantized("qwen2-vl", [](const std::string& n, Tensor& t, bool&) {
    if (n == "visual.blocks.0.attn.proj.weight") t = Tensor::zeros(DType::I8, {64, 64});
  });
  EXPECT_QF_ERROR(load(quantized.dir.path()), ErrorKind::Unsupported, "visual.blocks.0.attn.proj.weight");
  FixtureCopy fewer_layers("llava", {}, [](nlohmann::json& c, nlohmann::json&) {
    c["vision_config"]["num_hidden_layers"] = 2;
  });
  EXPECT_QF_ERROR(load(fewer_layers.dir.path()), ErrorKind::InvalidInput, "vision_config.num_hidden_layers is 2");
}

TEST(VisionErrors, ConfigAndProcessorProblems) {
  FixtureCopy geometry("qwen2-vl", {}, [](nlohmann::json&, nlohmann::json& p) { p["patch_size"] = 16; });
  EXPECT_QF_ERROR(load(geometry.dir.path()), ErrorKind::InvalidInput,
                  "preprocessor_config.json: patch_size 16 differs from config.json's vision_config.patch_size 14");
  FixtureCopy siglip("llava", {}, [](nlohmann::json&, nlohmann::json& p) {
    p["image_processor_type"] = "SiglipImageProcessor";
  });
  EXPECT_QF_ERROR(load(siglip.dir.path()), ErrorKind::Unsupported, "SiglipImageProcessor");
  FixtureCopy std0("llava", {}, [](nlohmann::json&, nlohmann::json& p) { p["image_std"] = {0.2, 0, 0.3}; });
  EXPECT_QF_ERROR(load(std0.dir.path()), ErrorKind::InvalidInput, "preprocessor_config.json: 'image_std'");
  FixtureCopy crop("llava", {}, [](nlohmann::json&, nlohmann::json& p) { p["crop_size"] = 64; });
  EXPECT_QF_ERROR(load(crop.dir.path()), ErrorKind::InvalidInput, "crop_size.height 64");
  FixtureCopy nopre("qwen2-vl", {}, [](nlohmann::json&, nlohmann::json& p) { p = nullptr; });
  EXPECT_QF_ERROR(load(nopre.dir.path()), ErrorKind::NotFound, "preprocessor_config.json");
  FixtureCopy act("qwen2-vl", {}, [](nlohmann::json& c, nlohmann::json&) {
    c["vision_config"]["hidden_act"] = "relu6";
  });
  EXPECT_QF_ERROR(load(act.dir.path()), ErrorKind::Unsupported, "vision_config.hidden_act 'relu6'");
  FixtureCopy heads("qwen2-vl", {}, [](nlohmann::json& c, nlohmann::json&) { c["vision_config"]["num_heads"] = 3; });
  EXPECT_QF_ERROR(load(heads.dir.path()), ErrorKind::InvalidInput, "num_heads 3");
  FixtureCopy feature("llava", {}, [](nlohmann::json& c, nlohmann::json&) { c["vision_feature_layer"] = -5; });
  EXPECT_QF_ERROR(load(feature.dir.path()), ErrorKind::InvalidInput, "vision_feature_layer -5");
}

TEST(VisionErrors, LlavaNextConfigAndProcessor) {
  using json = nlohmann::json;
  // llava's files relabelled llava_next: CLIP's processor is not LLaVA-NeXT's.
  FixtureCopy relabelled("llava", {}, [](json& c, json&) {
    c["model_type"] = "llava_next";
    c["architectures"] = {"LlavaNextForConditionalGeneration"};
  });
  EXPECT_QF_ERROR(load(relabelled.dir.path()), ErrorKind::InvalidInput,
                  "is not the processor of this model (LlavaNextImageProcessor)");
  FixtureCopy none("llava-next-vision", {}, [](json& c, json& p) {
    c.erase("image_grid_pinpoints");
    p.erase("image_grid_pinpoints");
  });
  EXPECT_QF_ERROR(load(none.dir.path()), ErrorKind::InvalidInput,
                  "image_grid_pinpoints is in neither config.json nor preprocessor_config.json");
  FixtureCopy partial("llava-next-vision", {},
                      [](json&, json& p) { p["image_grid_pinpoints"] = {{56, 112}, {56, 100}}; });
  EXPECT_QF_ERROR(load(partial.dir.path()), ErrorKind::InvalidInput,
                  "preprocessor_config.json: image_grid_pinpoints' [56, 100] is not a whole number of 56x56 tiles");
  FixtureCopy model_partial("llava-next-vision", {}, [](json& c, json& p) {
    c["image_grid_pinpoints"] = {{84, 56}};
    p.erase("image_grid_pinpoints");
  });
  EXPECT_QF_ERROR(load(model_partial.dir.path()), ErrorKind::InvalidInput, "[84, 56] is not a whole number of 56x56");
  FixtureCopy differ("llava-next-vision", {}, [](json&, json& p) { p["image_grid_pinpoints"] = {{56, 112}}; });
  EXPECT_QF_ERROR(load(differ.dir.path()), ErrorKind::InvalidInput,
                  "image_grid_pinpoints [[56, 112]] differs from config.json's [[56, 112], [112, 56]");
  FixtureCopy malformed("llava-next-vision", {}, [](json& c, json&) { c["image_grid_pinpoints"] = {{56}}; });
  EXPECT_QF_ERROR(load(malformed.dir.path()), ErrorKind::InvalidInput,
                  "'image_grid_pinpoints' must be a non-empty list of [height, width] pairs");
  FixtureCopy empty("llava-next-vision", {}, [](json&, json& p) { p["image_grid_pinpoints"] = json::array(); });
  EXPECT_QF_ERROR(load(empty.dir.path()), ErrorKind::InvalidInput, "'image_grid_pinpoints' must be");
  FixtureCopy full("llava-next-vision", {}, [](json& c, json&) { c["vision_feature_select_strategy"] = "full"; });
  EXPECT_QF_ERROR(load(full.dir.path()), ErrorKind::Unsupported,
                  "vision_feature_select_strategy 'full' for llava_next");
  FixtureCopy crop("llava-next-vision", {}, [](json&, json& p) { p["crop_size"] = {{"height", 56}, {"width", 28}}; });
  EXPECT_QF_ERROR(load(crop.dir.path()), ErrorKind::InvalidInput, "crop_size.width 28 differs");
}

TEST(VisionErrors, LlavaNextImageNewline) {
  FixtureCopy missing("llava-next-vision",
                      [](const std::string& n, Tensor&, bool& keep) { keep = n != "image_newline"; });
  EXPECT_QF_ERROR(load(missing.dir.path()), ErrorKind::NotFound, "tensor 'image_newline' of the vision tower is missing");
  FixtureCopy shape("llava-next-vision", [](const std::string& n, Tensor& t, bool&) {
    if (n == "image_newline") t = Tensor::zeros(DType::F16, {64});
  });
  EXPECT_QF_ERROR(load(shape.dir.path()), ErrorKind::InvalidInput, "tensor 'image_newline' has shape [64]");
}

// transformers 4.52's names (model.vision_tower.*, model.multi_modal_projector.*,
// model.image_newline) read as the older ones: the same rows.
TEST(VisionGolden, LlavaNextCurrentTensorNames) {
  const std::filesystem::path src = vlm_dir() / "llava-next-vision";
  test::TempDir dir;
  for (const char* f : {"config.json", "preprocessor_config.json"})
    std::filesystem::copy_file(src / f, dir / f);
  {
    Checkpoint ck = Checkpoint::open(src);
    SafetensorsWriter w(dir.path());
    for (const std::string& n : ck.names()) w.add("model." + n, ck.tensor(n));
    // A language model tensor: how the naming tells 4.52's layout from the older one.
    w.add("model.language_model.norm.weight", Tensor::zeros(DType::F16, {256}));
    w.finish();
  }
  Loaded old_names = load(src), new_names = load(dir.path());
  const ImageU8 img = read_image(vlm_dir() / "images" / "img5_tall_disc.png");
  ThreadPool pool(2);
  EXPECT_EQ(new_names.vm.embed(img, pool).rows, old_names.vm.embed(img, pool).rows);
}

TEST(VisionErrors, RefusedModelTypes) {
  const auto text = test::source_dir() / "tests" / "data" / "fixture-llama";
  ModelConfig cfg = load_model_config(text);
  Checkpoint ck = Checkpoint::open(text);
  EXPECT_QF_ERROR(VisionModel::load(cfg, ck, text), ErrorKind::InvalidInput, "text model");
}

TEST(VisionErrors, PixelValuesOfAnotherProcessor) {
  Loaded qwen = load(vlm_dir() / "qwen2-vl");
  Loaded llava = load(vlm_dir() / "llava");
  const ImageU8 img = read_image(vlm_dir() / "images" / "img0_red_circle.png");
  EXPECT_QF_ERROR(qwen.vm.embed_pixels(llava.vm.preprocess(img)), ErrorKind::InvalidInput, "not Qwen2-VL patches");
  EXPECT_QF_ERROR(llava.vm.embed_pixels(qwen.vm.preprocess(img)), ErrorKind::InvalidInput, "[3, 56, 56]");
  Loaded next = load(vlm_dir() / "llava-next-vision");
  EXPECT_QF_ERROR(next.vm.embed_pixels(llava.vm.preprocess(img)), ErrorKind::InvalidInput, "anyres tiles");
  EXPECT_QF_ERROR(llava.vm.embed_pixels(next.vm.preprocess(img)), ErrorKind::InvalidInput, "[3, 56, 56]");
  // Tiles of another image size: the tiling the model derives from grid_h, grid_w disagrees.
  PixelValues pv = next.vm.preprocess(img);  // 64x48: 1 + 2 tiles
  pv.grid_h = pv.grid_w = 100;               // 100x100 would be tiled 2x2
  EXPECT_QF_ERROR(next.vm.embed_pixels(pv), ErrorKind::InvalidInput, "3 tiles, but an image of 100x100");
}

}  // namespace
}  // namespace qf::rt
