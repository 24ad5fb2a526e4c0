// Vision-language models to GGUF: the language model's file and the CLIP
// mmproj file, read back with our GGUF reader and checked against what
// llama.cpp b4748's clip.cpp and llama-model.cpp read, and against the
// checkpoint's values.
#include "convert/gguf_mmproj.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "convert/hf_to_gguf.h"
#include "core/thread_pool.h"
#include "formats/gguf/gguf.h"
#include "formats/hf/model_tensors.h"
#include "formats/safetensors.h"
#include "test_util.h"

namespace qf {
namespace {

using namespace qf::test;
using json = nlohmann::json;

std::filesystem::path qwen_fixture() { return source_dir() / "tests/data/vlm/qwen2-vl"; }
std::filesystem::path llava_fixture() { return source_dir() / "tests/data/vlm/llava"; }

json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

// A copy of a model folder with config.json patched (merge_patch) and,
// when `tensors` is given, model.safetensors rewritten: each stored tensor
// passed through it (return Tensor() to drop it), plus `extra`.
std::filesystem::path copy_model(const std::filesystem::path& src, const std::filesystem::path& dst, const json& patch,
                                 const std::function<Tensor(const std::string&, const Tensor&)>& tensors = {},
                                 const std::map<std::string, Tensor>& extra = {}) {
  std::filesystem::create_directories(dst);
  for (const auto& e : std::filesystem::directory_iterator(src)) {
    const std::string n = e.path().filename().string();
    if (n == "config.json" || (tensors && n == "model.safetensors")) continue;
    std::filesystem::create_symlink(e.path(), dst / n);
  }
  json c = read_json(src / "config.json");
  c.merge_patch(patch);
  write_file(dst / "config.json", c.dump(2));
  if (tensors) {
    const Checkpoint ck = Checkpoint::open(src);
    SafetensorsWriter w(dst);
    for (const std::string& n : ck.names()) {
      const Tensor t = tensors(n, ck.tensor(n));
      if (t.data()) w.add(n, t);
    }
    for (const auto& [n, t] : extra) w.add(n, t);
    w.finish();
  }
  return dst;
}

GgufConvertResult convert(const std::filesystem::path& dir, const std::filesystem::path& out, GgufConvertOptions o = {}) {
  std::filesystem::create_directories(out.parent_path());
  return convert_hf_to_gguf(dir, out, o, ThreadPool::global());
}

// The stored checkpoint with the working names the converter reads.
Checkpoint open_working(const std::filesystem::path& dir) {
  Checkpoint ck = Checkpoint::open(dir);
  apply_hf_tensor_naming(load_model_config(dir), ck);
  return ck;
}

// Every key clip.cpp b4748's clip_model_load reads, with the GGUF type its
// getter asserts; `required` ones it fails without.
struct KeyRule {
  const char* key;
  GgufType type;
  bool required;
};
const KeyRule kClipKeys[] = {
    {"general.file_type", GgufType::U32, true},
    {"general.description", GgufType::String, true},
    {"general.name", GgufType::String, false},
    {"clip.has_text_encoder", GgufType::Bool, true},
    {"clip.has_vision_encoder", GgufType::Bool, true},
    {"clip.has_llava_projector", GgufType::Bool, false},
    {"clip.has_minicpmv_projector", GgufType::Bool, false},
    {"clip.has_glm_projector", GgufType::Bool, false},
    {"clip.has_qwen2vl_merger", GgufType::Bool, false},
    {"clip.minicpmv_version", GgufType::I32, false},
    {"clip.projector_type", GgufType::String, false},
    {"clip.use_gelu", GgufType::Bool, true},
    {"clip.use_silu", GgufType::Bool, false},
    {"clip.vision.embedding_length", GgufType::U32, true},
    {"clip.vision.attention.head_count", GgufType::U32, true},
    {"clip.vision.feed_forward_length", GgufType::U32, true},
    {"clip.vision.block_count", GgufType::U32, true},
    {"clip.vision.image_size", GgufType::U32, true},
    {"clip.vision.patch_size", GgufType::U32, true},
    {"clip.vision.projection_dim", GgufType::U32, true},
    {"clip.vision.attention.layer_norm_epsilon", GgufType::F32, true},
    {"clip.vision.image_mean", GgufType::Array, true},
    {"clip.vision.image_std", GgufType::Array, true},
    {"clip.vision.image_grid_pinpoints", GgufType::Array, false},
    {"clip.vision.mm_patch_merge_type", GgufType::String, false},
    {"clip.vision.image_crop_resolution", GgufType::U32, false},
};

void expect_clip_keys(const GgufFile& f) {
  for (const KeyRule& r : kClipKeys) {
    const GgufValue* v = f.find(r.key);
    if (!v) {
      EXPECT_FALSE(r.required) << "missing " << r.key;
      continue;
    }
    EXPECT_EQ(v->type, r.type) << r.key;
  }
  EXPECT_FALSE(f.get_bool("clip.has_text_encoder"));
  EXPECT_TRUE(f.get_bool("clip.has_vision_encoder"));
  for (const char* k : {"clip.vision.image_mean", "clip.vision.image_std"}) {
    EXPECT_EQ(f.value(k).elem_type, GgufType::F32) << k;
    EXPECT_EQ(f.value(k).count, 3u) << k;
  }
  const std::vector<float> mean = f.get_float_array("clip.vision.image_mean"), sd = f.get_float_array("clip.vision.image_std");
  EXPECT_FLOAT_EQ(mean[0], 0.48145466f);
  EXPECT_FLOAT_EQ(mean[2], 0.40821073f);
  EXPECT_FLOAT_EQ(sd[1], 0.26130258f);
  if (f.has("clip.vision.image_grid_pinpoints")) {
    EXPECT_EQ(f.value("clip.vision.image_grid_pinpoints").elem_type, GgufType::I32);
  }
}

struct Want {
  std::vector<uint64_t> ne;
  uint32_t type;
};

// The tensors clip.cpp's loader fetches for a tower of `blocks` blocks (ne
// and type), the common ones first.
std::map<std::string, Want> block_tensors(int blocks, uint64_t E, uint64_t F, uint32_t mat) {
  std::map<std::string, Want> m;
  for (int i = 0; i < blocks; ++i) {
    const std::string b = "v.blk." + std::to_string(i) + ".";
    for (const char* a : {"attn_q", "attn_k", "attn_v", "attn_out"}) {
      m[b + a + ".weight"] = {{E, E}, mat};
      m[b + a + ".bias"] = {{E}, ggml_type::F32};
    }
    for (const char* a : {"ln1", "ln2"}) {
      m[b + a + ".weight"] = {{E}, ggml_type::F32};
      m[b + a + ".bias"] = {{E}, ggml_type::F32};
    }
    m[b + "ffn_down.weight"] = {{E, F}, mat};  // fc1: [F, E] in the checkpoint
    m[b + "ffn_down.bias"] = {{F}, ggml_type::F32};
    m[b + "ffn_up.weight"] = {{F, E}, mat};
    m[b + "ffn_up.bias"] = {{E}, ggml_type::F32};
  }
  return m;
}

void expect_tensors(const GgufFile& f, const std::map<std::string, Want>& want) {
  std::set<std::string> names;
  for (const GgufTensorInfo& t : f.tensors()) names.insert(t.name);
  for (const auto& [n, w] : want) {
    const GgufTensorInfo* t = f.find_tensor(n);
    if (!t) {
      ADD_FAILURE() << "missing tensor " << n;
      continue;
    }
    EXPECT_EQ(t->dims, w.ne) << n;
    EXPECT_EQ(t->type, w.type) << n;
  }
  EXPECT_EQ(names.size(), want.size());
  for (const std::string& n : names) EXPECT_TRUE(want.count(n)) << "unexpected tensor " << n;
}

// A GGUF tensor's bytes against bytes of the checkpoint (same dtype).
void expect_bytes(const GgufFile& f, const std::string& name, const void* src, size_t n) {
  const GgufTensorInfo* t = f.find_tensor(name);
  ASSERT_NE(t, nullptr) << name;
  ASSERT_EQ(t->nbytes, n) << name;
  EXPECT_EQ(std::memcmp(f.tensor_data(*t), src, n), 0) << name;
}

// An f32 GGUF tensor against a checkpoint tensor's values (any float dtype).
void expect_values(const GgufFile& f, const std::string& name, const Tensor& src) {
  const GgufTensorInfo* t = f.find_tensor(name);
  ASSERT_NE(t, nullptr) << name;
  ASSERT_EQ(t->type, ggml_type::F32) << name;
  const std::vector<float> want = src.to_f32_vector();
  ASSERT_EQ(t->numel(), want.size()) << name;
  EXPECT_EQ(std::memcmp(f.tensor_data(*t), want.data(), want.size() * 4), 0) << name;
}

// ---------------------------------------------------------------------------

class Qwen2VlGguf : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    res_ = new GgufConvertResult(convert(qwen_fixture(), *dir_ / "qwen2vl-f16.gguf"));
  }
  static void TearDownTestSuite() {
    delete res_;
    delete dir_;
  }
  static TempDir* dir_;
  static GgufConvertResult* res_;
};
TempDir* Qwen2VlGguf::dir_ = nullptr;
GgufConvertResult* Qwen2VlGguf::res_ = nullptr;

TEST_F(Qwen2VlGguf, WritesBothFilesBesideEachOther) {
  EXPECT_EQ(res_->path, *dir_ / "qwen2vl-f16.gguf");
  EXPECT_EQ(res_->mmproj_path, *dir_ / "mmproj-qwen2vl-f16.gguf");
  EXPECT_EQ(default_mmproj_path("/a/b/model-q4.gguf"), std::filesystem::path("/a/b/mmproj-model-q4.gguf"));
  EXPECT_GT(res_->mmproj_bytes, 0u);
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir_->path())) ++files;
  EXPECT_EQ(files, 2u);  // no temporaries left
}

TEST_F(Qwen2VlGguf, LanguageModelIsQwen2vlWithSections) {
  const GgufFile f = GgufFile::open(res_->path);
  EXPECT_EQ(f.get_string("general.architecture"), "qwen2vl");
  const GgufValue& sec = f.value("qwen2vl.rope.dimension_sections");
  EXPECT_EQ(sec.type, GgufType::Array);
  EXPECT_EQ(sec.elem_type, GgufType::I32);
  EXPECT_EQ(f.get_int_array("qwen2vl.rope.dimension_sections"), (std::vector<int64_t>{4, 6, 6, 0}));
  EXPECT_EQ(f.get_u32("qwen2vl.block_count"), 4u);
  EXPECT_EQ(f.get_u32("qwen2vl.embedding_length"), 256u);
  EXPECT_EQ(f.get_u32("qwen2vl.attention.head_count"), 8u);
  EXPECT_EQ(f.get_u32("qwen2vl.attention.head_count_kv"), 4u);
  EXPECT_FALSE(f.has("qwen2.block_count"));
  EXPECT_FALSE(f.has("qwen2vl.rope.scaling.type"));
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens").size(), 4100u);
  // llama-model.cpp's QWEN2 tensors (biases required), nothing of the vision tower.
  std::set<std::string> want = {"token_embd.weight", "output_norm.weight", "output.weight"};
  for (int i = 0; i < 4; ++i)
    for (const char* t : {"attn_norm.weight", "ffn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_q.bias",
                          "attn_k.bias", "attn_v.bias", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"})
      want.insert("blk." + std::to_string(i) + "." + t);
  std::set<std::string> got;
  for (const GgufTensorInfo& t : f.tensors()) got.insert(t.name);
  EXPECT_EQ(got, want);
  // qwen2 rows are not permuted: the f16 weights are the checkpoint's bytes.
  const Checkpoint ck = open_working(qwen_fixture());
  const Tensor q = ck.tensor("model.layers.2.self_attn.q_proj.weight");
  expect_bytes(f, "blk.2.attn_q.weight", q.data(), q.nbytes());
  expect_values(f, "blk.1.attn_k.bias", ck.tensor("model.layers.1.self_attn.k_proj.bias"));
}

TEST_F(Qwen2VlGguf, MmprojHasEveryKeyClipReads) {
  const GgufFile f = GgufFile::open(res_->mmproj_path);
  expect_clip_keys(f);
  EXPECT_EQ(f.get_string("general.architecture"), "clip");
  EXPECT_EQ(f.get_string("general.name"), "qwen2-vl");
  EXPECT_EQ(f.get_u32("general.file_type"), 1u);
  EXPECT_TRUE(f.get_bool("clip.has_qwen2vl_merger"));
  EXPECT_FALSE(f.has("clip.has_llava_projector"));
  EXPECT_EQ(f.get_string("clip.projector_type"), "qwen2vl_merger");
  EXPECT_FALSE(f.get_bool("clip.use_gelu"));  // quick_gelu
  EXPECT_FALSE(f.get_bool("clip.use_silu"));
  EXPECT_EQ(f.get_u32("clip.vision.patch_size"), 14u);
  EXPECT_EQ(f.get_u32("clip.vision.image_size") % 28, 0u);
  EXPECT_EQ(f.get_u32("clip.vision.embedding_length"), 64u);
  EXPECT_EQ(f.get_u32("clip.vision.feed_forward_length"), 256u);
  EXPECT_EQ(f.get_u32("clip.vision.projection_dim"), 256u);
  EXPECT_EQ(f.get_u32("clip.vision.attention.head_count"), 4u);
  EXPECT_EQ(f.get_u32("clip.vision.block_count"), 2u);
  EXPECT_FLOAT_EQ(f.get_f32("clip.vision.attention.layer_norm_epsilon"), 1e-6f);
  EXPECT_FALSE(f.has("clip.vision.image_grid_pinpoints"));
}

TEST_F(Qwen2VlGguf, MmprojTensorsAsClipLoadsThem) {
  const GgufFile f = GgufFile::open(res_->mmproj_path);
  std::map<std::string, Want> want = block_tensors(2, 64, 256, ggml_type::F16);
  want["v.patch_embd.weight"] = {{14, 14, 3, 64}, ggml_type::F16};
  want["v.patch_embd.weight.1"] = {{14, 14, 3, 64}, ggml_type::F16};
  want["v.position_embd.weight"] = {{10, 10}, ggml_type::F32};
  want["v.post_ln.weight"] = {{64}, ggml_type::F32};
  want["v.post_ln.bias"] = {{64}, ggml_type::F32};
  want["mm.0.weight"] = {{256, 256}, ggml_type::F16};
  want["mm.0.bias"] = {{256}, ggml_type::F32};
  want["mm.2.weight"] = {{256, 256}, ggml_type::F16};
  want["mm.2.bias"] = {{256}, ggml_type::F32};
  expect_tensors(f, want);  // and no v.class_embd / v.pre_ln, which would change clip.cpp's graph
}

TEST_F(Qwen2VlGguf, MmprojValuesAreTheCheckpoints) {
  const GgufFile f = GgufFile::open(res_->mmproj_path);
  const Checkpoint ck = open_working(qwen_fixture());
  // The Conv3d [64, 3, 2, 14, 14]: frame t of every (out, in) kernel.
  const Tensor conv = ck.tensor("visual.patch_embed.proj.weight");
  ASSERT_EQ(conv.dtype(), DType::F16);
  const auto* c = conv.data_as<uint16_t>();
  for (int t = 0; t < 2; ++t) {
    std::vector<uint16_t> slice;
    for (int o = 0; o < 64; ++o)
      for (int ch = 0; ch < 3; ++ch)
        for (int k = 0; k < 14 * 14; ++k) slice.push_back(c[((o * 3 + ch) * 2 + t) * 196 + k]);
    expect_bytes(f, t == 0 ? "v.patch_embd.weight" : "v.patch_embd.weight.1", slice.data(), slice.size() * 2);
  }
  for (int b = 0; b < 2; ++b) {
    const std::string hf = "visual.blocks." + std::to_string(b) + ".", g = "v.blk." + std::to_string(b) + ".";
    const Tensor qkv = ck.tensor(hf + "attn.qkv.weight"), qkv_b = ck.tensor(hf + "attn.qkv.bias");
    const char* parts[] = {"attn_q", "attn_k", "attn_v"};
    for (int p = 0; p < 3; ++p) {
      expect_bytes(f, g + parts[p] + ".weight", qkv.data_as<uint16_t>() + p * 64 * 64, 64 * 64 * 2);
      expect_values(f, g + parts[p] + ".bias", qkv_b.rows(p * 64, (p + 1) * 64));
    }
    const Tensor proj = ck.tensor(hf + "attn.proj.weight"), fc1 = ck.tensor(hf + "mlp.fc1.weight"), fc2 = ck.tensor(hf + "mlp.fc2.weight");
    expect_bytes(f, g + "attn_out.weight", proj.data(), proj.nbytes());
    expect_bytes(f, g + "ffn_down.weight", fc1.data(), fc1.nbytes());
    expect_bytes(f, g + "ffn_up.weight", fc2.data(), fc2.nbytes());
    expect_values(f, g + "attn_out.bias", ck.tensor(hf + "attn.proj.bias"));
    expect_values(f, g + "ffn_down.bias", ck.tensor(hf + "mlp.fc1.bias"));
    expect_values(f, g + "ffn_up.bias", ck.tensor(hf + "mlp.fc2.bias"));
    expect_values(f, g + "ln1.weight", ck.tensor(hf + "norm1.weight"));
    expect_values(f, g + "ln1.bias", ck.tensor(hf + "norm1.bias"));
    expect_values(f, g + "ln2.weight", ck.tensor(hf + "norm2.weight"));
    expect_values(f, g + "ln2.bias", ck.tensor(hf + "norm2.bias"));
  }
  expect_values(f, "v.post_ln.weight", ck.tensor("visual.merger.ln_q.weight"));
  expect_values(f, "v.post_ln.bias", ck.tensor("visual.merger.ln_q.bias"));
  const Tensor m0 = ck.tensor("visual.merger.mlp.0.weight"), m2 = ck.tensor("visual.merger.mlp.2.weight");
  expect_bytes(f, "mm.0.weight", m0.data(), m0.nbytes());
  expect_bytes(f, "mm.2.weight", m2.data(), m2.nbytes());
  expect_values(f, "mm.0.bias", ck.tensor("visual.merger.mlp.0.bias"));
  expect_values(f, "mm.2.bias", ck.tensor("visual.merger.mlp.2.bias"));
  const std::vector<float> zeros(100, 0.0f);
  expect_bytes(f, "v.position_embd.weight", zeros.data(), 400);
}

TEST_F(Qwen2VlGguf, QuantizedLanguageModelKeepsTheMmprojF16) {
  GgufConvertOptions o;
  o.preset = "Q4_K_M";
  o.mmproj = *dir_ / "sub" / "vision.gguf";
  std::filesystem::create_directories(*dir_ / "sub");
  const GgufConvertResult r = convert(qwen_fixture(), *dir_ / "sub" / "q4.gguf", o);
  EXPECT_EQ(r.mmproj_path, *dir_ / "sub" / "vision.gguf");
  EXPECT_FALSE(std::filesystem::exists(*dir_ / "sub" / "mmproj-q4.gguf"));
  const GgufFile lm = GgufFile::open(r.path);
  EXPECT_EQ(lm.get_string("general.architecture"), "qwen2vl");
  EXPECT_EQ(lm.find_tensor("blk.0.attn_q.weight")->type, ggml_type::Q4_K);
  std::ifstream a(r.mmproj_path, std::ios::binary), b(res_->mmproj_path, std::ios::binary);
  const std::string sa((std::istreambuf_iterator<char>(a)), {}), sb((std::istreambuf_iterator<char>(b)), {});
  EXPECT_TRUE(sa == sb) << "the mmproj depends on the language model's preset";
}

TEST_F(Qwen2VlGguf, NoMmprojWritesTheLanguageModelOnly) {
  TempDir d;
  GgufConvertOptions o;
  o.no_mmproj = true;
  const GgufConvertResult r = convert(qwen_fixture(), d / "lm.gguf", o);
  EXPECT_TRUE(r.mmproj_path.empty());
  EXPECT_FALSE(std::filesystem::exists(d / "mmproj-lm.gguf"));
  std::ifstream a(r.path, std::ios::binary), b(res_->path, std::ios::binary);
  const std::string sa((std::istreambuf_iterator<char>(a)), {}), sb((std::istreambuf_iterator<char>(b)), {});
  EXPECT_TRUE(sa == sb) << "the language model depends on --no-mmproj";
}

TEST(Qwen2VlGgufDtypes, Bf16VisionWeightsBecomeF32MatricesAndF16Convolutions) {
  TempDir d;
  const auto model = copy_model(qwen_fixture(), d / "bf16", json::object(), [](const std::string& n, const Tensor& t) {
    return n.rfind("visual.", 0) == 0 ? t.to(DType::BF16) : t.to(t.dtype());
  });
  const GgufConvertResult r = convert(model, d / "out" / "m.gguf");
  const GgufFile f = GgufFile::open(r.mmproj_path);
  EXPECT_EQ(f.get_u32("general.file_type"), 0u);
  EXPECT_EQ(f.find_tensor("v.blk.0.attn_q.weight")->type, ggml_type::F32);
  EXPECT_EQ(f.find_tensor("mm.2.weight")->type, ggml_type::F32);
  EXPECT_EQ(f.find_tensor("v.patch_embd.weight")->type, ggml_type::F16);
  EXPECT_EQ(f.find_tensor("v.blk.0.ln1.weight")->type, ggml_type::F32);
  const Checkpoint ck = open_working(model);
  expect_values(f, "v.blk.1.attn_v.weight", ck.tensor("visual.blocks.1.attn.qkv.weight").rows(128, 192));
}

// ---------------------------------------------------------------------------

TEST(LlavaGguf, LanguageModelAndMmproj) {
  TempDir d;
  const GgufConvertResult r = convert(llava_fixture(), d / "llava.gguf");
  const GgufFile lm = GgufFile::open(r.path);
  EXPECT_EQ(lm.get_string("general.architecture"), "llama");
  EXPECT_EQ(lm.get_u32("llama.vocab_size"), 4097u);
  EXPECT_EQ(lm.tensors().size(), 3u + 4u * 9u);
  for (const GgufTensorInfo& t : lm.tensors())
    EXPECT_TRUE(t.name.rfind("blk.", 0) == 0 || t.name == "token_embd.weight" || t.name == "output_norm.weight" ||
                t.name == "output.weight")
        << t.name;

  const GgufFile f = GgufFile::open(r.mmproj_path);
  EXPECT_EQ(r.mmproj_path, d / "mmproj-llava.gguf");
  expect_clip_keys(f);
  EXPECT_TRUE(f.get_bool("clip.has_llava_projector"));
  EXPECT_FALSE(f.has("clip.has_qwen2vl_merger"));
  EXPECT_EQ(f.get_string("clip.projector_type"), "mlp");
  EXPECT_FALSE(f.get_bool("clip.use_gelu"));  // quick_gelu
  EXPECT_EQ(f.get_u32("clip.vision.image_size"), 56u);
  EXPECT_EQ(f.get_u32("clip.vision.patch_size"), 14u);
  EXPECT_EQ(f.get_u32("clip.vision.embedding_length"), 64u);
  EXPECT_EQ(f.get_u32("clip.vision.feed_forward_length"), 256u);
  EXPECT_EQ(f.get_u32("clip.vision.attention.head_count"), 4u);
  EXPECT_EQ(f.get_u32("clip.vision.projection_dim"), 256u);
  EXPECT_FLOAT_EQ(f.get_f32("clip.vision.attention.layer_norm_epsilon"), 1e-5f);
  // vision_feature_layer -2 of 3 layers: clip.cpp runs block_count - 1 = 2.
  EXPECT_EQ(f.get_u32("clip.vision.block_count"), 3u);
  EXPECT_FALSE(f.has("clip.vision.mm_patch_merge_type"));

  std::map<std::string, Want> want = block_tensors(3, 64, 256, ggml_type::F16);
  want["v.class_embd"] = {{64}, ggml_type::F32};
  want["v.patch_embd.weight"] = {{14, 14, 3, 64}, ggml_type::F16};
  want["v.position_embd.weight"] = {{64, 17}, ggml_type::F16};
  want["v.pre_ln.weight"] = {{64}, ggml_type::F32};
  want["v.pre_ln.bias"] = {{64}, ggml_type::F32};
  want["mm.0.weight"] = {{64, 256}, ggml_type::F16};
  want["mm.0.bias"] = {{256}, ggml_type::F32};
  want["mm.2.weight"] = {{256, 256}, ggml_type::F16};
  want["mm.2.bias"] = {{256}, ggml_type::F32};
  expect_tensors(f, want);  // no v.post_ln: the features are taken before it

  const Checkpoint ck = open_working(llava_fixture());
  const std::string vm = "vision_tower.vision_model.";
  expect_values(f, "v.class_embd", ck.tensor(vm + "embeddings.class_embedding"));
  for (auto [g, hf] : {std::pair<const char*, std::string>{"v.patch_embd.weight", vm + "embeddings.patch_embedding.weight"},
                       {"v.position_embd.weight", vm + "embeddings.position_embedding.weight"},
                       {"mm.0.weight", "multi_modal_projector.linear_1.weight"},
                       {"mm.2.weight", "multi_modal_projector.linear_2.weight"}}) {
    const Tensor t = ck.tensor(hf);
    expect_bytes(f, g, t.data(), t.nbytes());
  }
  expect_values(f, "v.pre_ln.weight", ck.tensor(vm + "pre_layrnorm.weight"));
  expect_values(f, "mm.2.bias", ck.tensor("multi_modal_projector.linear_2.bias"));
  for (int i = 0; i < 3; ++i) {
    const std::string hf = vm + "encoder.layers." + std::to_string(i) + ".", g = "v.blk." + std::to_string(i) + ".";
    for (auto [a, b] : {std::pair<const char*, const char*>{"attn_q", "self_attn.q_proj"}, {"attn_k", "self_attn.k_proj"},
                        {"attn_v", "self_attn.v_proj"}, {"attn_out", "self_attn.out_proj"}, {"ffn_down", "mlp.fc1"},
                        {"ffn_up", "mlp.fc2"}}) {
      const Tensor w = ck.tensor(hf + b + ".weight");
      expect_bytes(f, g + a + ".weight", w.data(), w.nbytes());
      expect_values(f, g + a + ".bias", ck.tensor(hf + b + ".bias"));
    }
    expect_values(f, g + "ln1.weight", ck.tensor(hf + "layer_norm1.weight"));
    expect_values(f, g + "ln2.bias", ck.tensor(hf + "layer_norm2.bias"));
  }
}

// clip.cpp runs block_count - 1 layers: block_count is the feature layer + 1.
TEST(LlavaGguf, FeatureLayerSetsTheBlockCount) {
  TempDir d;
  const GgufFile first = GgufFile::open(
      convert(copy_model(llava_fixture(), d / "f1", {{"vision_feature_layer", 1}}), d / "o1" / "m.gguf").mmproj_path);
  EXPECT_EQ(first.get_u32("clip.vision.block_count"), 2u);
  EXPECT_NE(first.find_tensor("v.blk.1.attn_q.weight"), nullptr);
  EXPECT_EQ(first.find_tensor("v.blk.2.attn_q.weight"), nullptr);

  // The last layer: all three run, and the fourth block clip.cpp loads is zeros.
  const GgufFile last = GgufFile::open(
      convert(copy_model(llava_fixture(), d / "f-1", {{"vision_feature_layer", -1}}), d / "o2" / "m.gguf").mmproj_path);
  EXPECT_EQ(last.get_u32("clip.vision.block_count"), 4u);
  const GgufTensorInfo* pad = last.find_tensor("v.blk.3.ffn_down.weight");
  ASSERT_NE(pad, nullptr);
  EXPECT_EQ(pad->dims, (std::vector<uint64_t>{64, 256}));
  EXPECT_EQ(pad->type, ggml_type::F16);
  const uint8_t* p = last.tensor_data(*pad);
  EXPECT_TRUE(std::all_of(p, p + pad->nbytes, [](uint8_t b) { return b == 0; }));
  EXPECT_NE(last.find_tensor("v.blk.3.ln2.bias"), nullptr);

  EXPECT_QF_ERROR(convert(copy_model(llava_fixture(), d / "f-5", {{"vision_feature_layer", -5}}), d / "o3" / "m.gguf"),
                  ErrorKind::InvalidInput, "vision_feature_layer -5");
  EXPECT_QF_ERROR(convert(copy_model(llava_fixture(), d / "list", {{"vision_feature_layer", {-2, -3}}}), d / "o4" / "m.gguf"),
                  ErrorKind::Unsupported, "not a list");
  EXPECT_QF_ERROR(convert(copy_model(llava_fixture(), d / "full", {{"vision_feature_select_strategy", "full"}}), d / "o5" / "m.gguf"),
                  ErrorKind::Unsupported, "vision_feature_select_strategy 'full'");
  for (const char* o : {"o3", "o4", "o5"}) EXPECT_FALSE(std::filesystem::exists(d / o / "m.gguf")) << o;
}

TEST(LlavaGguf, NextWritesGridAndNewline) {
  TempDir d;
  const std::vector<float> nl = randn(256, 7, 0.02f);
  const json patch = {{"model_type", "llava_next"},
                      {"architectures", {"LlavaNextForConditionalGeneration"}},
                      {"image_grid_pinpoints", {{56, 112}, {112, 56}, {112, 112}}}};
  const auto model = copy_model(llava_fixture(), d / "next", patch, [](const std::string&, const Tensor& t) { return t.to(t.dtype()); },
                                {{"image_newline", Tensor::from_f32(nl, {256}).to(DType::F16)}});
  const GgufConvertResult r = convert(model, d / "o" / "next.gguf");
  EXPECT_EQ(GgufFile::open(r.path).get_string("general.architecture"), "llama");
  const GgufFile f = GgufFile::open(r.mmproj_path);
  expect_clip_keys(f);
  EXPECT_EQ(f.get_string("general.description"), "image encoder for LLaVA-NeXT");
  EXPECT_EQ(f.get_string("clip.vision.mm_patch_merge_type"), "spatial_unpad");
  EXPECT_EQ(f.get_u32("clip.vision.image_crop_resolution"), 56u);
  EXPECT_EQ(f.get_int_array("clip.vision.image_grid_pinpoints"), (std::vector<int64_t>{56, 112, 112, 56, 112, 112}));
  const GgufTensorInfo* t = f.find_tensor("model.image_newline");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dims, (std::vector<uint64_t>{256}));
  expect_values(f, "model.image_newline", Tensor::from_f32(nl, {256}).to(DType::F16));
}

// ---------------------------------------------------------------------------

// Nothing under either final name (nor a temporary) after a refused conversion.
void expect_empty(const std::filesystem::path& dir) {
  if (!std::filesystem::exists(dir)) return;
  for (const auto& e : std::filesystem::directory_iterator(dir)) ADD_FAILURE() << "left behind: " << e.path();
}

TEST(VlmGgufErrors, Qwen25VlNeedsNoMmproj) {
  TempDir d;
  const auto model = copy_model(qwen_fixture(), d / "q25", {{"model_type", "qwen2_5_vl"}, {"architectures", {"Qwen2_5_VLForConditionalGeneration"}}});
  std::filesystem::create_directories(d / "out");
  EXPECT_QF_ERROR(convert(model, d / "out" / "m.gguf"), ErrorKind::Unsupported, "--no-mmproj");
  expect_empty(d / "out");
  GgufConvertOptions o;
  o.no_mmproj = true;
  const GgufConvertResult r = convert(model, d / "out" / "m.gguf", o);
  const GgufFile f = GgufFile::open(r.path);
  EXPECT_EQ(f.get_string("general.architecture"), "qwen2vl");
  EXPECT_EQ(f.get_int_array("qwen2vl.rope.dimension_sections"), (std::vector<int64_t>{4, 6, 6, 0}));
  EXPECT_FALSE(std::filesystem::exists(d / "out" / "mmproj-m.gguf"));
  // The planner refuses it too.
  const Checkpoint ck = open_working(model);
  EXPECT_QF_ERROR(plan_mmproj(load_model_config(model), ck, model, "x"), ErrorKind::Unsupported, "Qwen2.5-VL");
}

TEST(VlmGgufErrors, MmprojOptionsOnATextModel) {
  TempDir d;
  GgufConvertOptions o;
  o.mmproj = d / "mm.gguf";
  EXPECT_QF_ERROR(convert(source_dir() / "tests/data/fixture-llama", d / "m.gguf", o), ErrorKind::InvalidInput, "is a text model");
  o = {};
  o.no_mmproj = true;
  EXPECT_QF_ERROR(convert(source_dir() / "tests/data/fixture-llama", d / "m.gguf", o), ErrorKind::InvalidInput, "--no-mmproj");
  expect_empty(d.path());
}

TEST(VlmGgufErrors, UnwritableMmprojLeavesNoLanguageModel) {
  TempDir d;
  std::filesystem::create_directories(d / "out");
  GgufConvertOptions o;
  o.mmproj = d / "no-such-folder" / "mm.gguf";
  EXPECT_QF_ERROR(convert(qwen_fixture(), d / "out" / "m.gguf", o), ErrorKind::Io, "no-such-folder");
  expect_empty(d / "out");
  o.mmproj = d / "out" / "m.gguf";
  EXPECT_QF_ERROR(convert(qwen_fixture(), d / "out" / "m.gguf", o), ErrorKind::InvalidInput, "must differ");
  expect_empty(d / "out");
}

TEST(VlmGgufErrors, VisionConfigAgainstTheTensors) {
  TempDir d;
  std::filesystem::create_directories(d / "out");
  const json deeper = {{"vision_config", {{"depth", 3}}}};
  EXPECT_QF_ERROR(convert(copy_model(qwen_fixture(), d / "deep", deeper), d / "out" / "m.gguf"), ErrorKind::NotFound,
                  "visual.blocks.2.attn.qkv.weight' is missing");
  const json shallower = {{"vision_config", {{"depth", 1}}}};
  EXPECT_QF_ERROR(convert(copy_model(qwen_fixture(), d / "shallow", shallower), d / "out" / "m.gguf"), ErrorKind::InvalidInput,
                  "visual.blocks.1.");
  const json wider = {{"vision_config", {{"mlp_ratio", 2}}}};
  EXPECT_QF_ERROR(convert(copy_model(qwen_fixture(), d / "wide", wider), d / "out" / "m.gguf"), ErrorKind::InvalidInput,
                  "visual.blocks.0.mlp.fc1.weight' has shape [256, 64], but the config implies [128, 64]");
  const json merge = {{"vision_config", {{"spatial_merge_size", 1}}}};
  EXPECT_QF_ERROR(convert(copy_model(qwen_fixture(), d / "merge", merge), d / "out" / "m.gguf"), ErrorKind::Unsupported,
                  "spatial_merge_size 1");
  const json act = {{"vision_config", {{"hidden_act", "relu"}}}};
  EXPECT_QF_ERROR(convert(copy_model(qwen_fixture(), d / "act", act), d / "out" / "m.gguf"), ErrorKind::Unsupported,
                  "hidden_act 'relu'");
  EXPECT_QF_ERROR(convert(copy_model(llava_fixture(), d / "pact", {{"projector_hidden_act", "relu"}}), d / "out" / "m.gguf"),
                  ErrorKind::Unsupported, "projector_hidden_act 'relu'");
  // A vision tensor gone from the file.
  const auto missing = copy_model(llava_fixture(), d / "missing", json::object(), [](const std::string& n, const Tensor& t) {
    return n == "multi_modal_projector.linear_2.weight" ? Tensor() : t.to(t.dtype());
  });
  EXPECT_QF_ERROR(convert(missing, d / "out" / "m.gguf"), ErrorKind::NotFound, "multi_modal_projector.linear_2.weight' is missing");
  expect_empty(d / "out");
}

TEST(VlmGgufErrors, NonFiniteVisionWeight) {
  TempDir d;
  const auto model = copy_model(qwen_fixture(), d / "nan", json::object(), [](const std::string& n, const Tensor& t) {
    Tensor c = t.to(t.dtype());
    if (n == "visual.blocks.1.mlp.fc2.weight") c.mutable_data_as<uint16_t>()[5] = 0x7e00;  // f16 NaN
    return c;
  });
  std::filesystem::create_directories(d / "out");
  EXPECT_QF_ERROR(convert(model, d / "out" / "m.gguf"), ErrorKind::InvalidInput, "visual.blocks.1.mlp.fc2.weight' (for v.blk.1.ffn_up.weight) holds nan");
  expect_empty(d / "out");
  GgufConvertOptions o;
  o.allow_nonfinite = true;
  EXPECT_NO_THROW(convert(model, d / "out" / "m.gguf", o));
}

TEST(VlmGgufErrors, MalformedPreprocessorConfig) {
  TempDir d;
  const auto model = copy_model(qwen_fixture(), d / "pp", json::object());
  std::filesystem::remove(model / "preprocessor_config.json");
  write_file(model / "preprocessor_config.json", R"({"image_mean": [0.5, 0.5], "image_std": [0.5, 0.5, 0.5]})");
  EXPECT_QF_ERROR(convert(model, d / "out" / "m.gguf"), ErrorKind::InvalidInput, "image_mean must be a list of 3 numbers");
}

}  // namespace
}  // namespace qf
