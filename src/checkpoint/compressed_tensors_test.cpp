#include "checkpoint/compressed_tensors.h"

#include <random>

#include <gtest/gtest.h>

#include "core/sha256.h"
#include "checkpoint/manifest.h"
#include "checkpoint/pack.h"
#include "quantized_tensor_util.h"
#include "test_util.h"

namespace qf {
namespace {

using json = nlohmann::json;

TEST(CompressedTensors, RoundTripAllWidthsAndStrategies) {
  test::TempDir d;
  struct Case {
    QuantizedTensor q;
    bool actorder;
    std::string prefix;
  };
  std::vector<Case> cases;
  uint32_t seed = 1;
  const DType dts[] = {DType::F16, DType::BF16, DType::F32};
  for (int bits = 2; bits <= 8; ++bits)
    for (bool sym : {true, false})
      for (QuantStrategy st : {QuantStrategy::Tensor, QuantStrategy::Channel, QuantStrategy::Group}) {
        const bool perm = st == QuantStrategy::Group && bits % 2 == 1;
        // Odd sizes: 37 outputs (zero points straddle words), 48 inputs (packed rows straddle for 3/5/6/7 bits).
        auto q = random_qt(QuantScheme::make(bits, sym, st, 16, dts[seed % 3]), 37, 48, perm, seed);
        ++seed;
        cases.push_back({q, perm, "model.layers." + std::to_string(cases.size()) + ".mlp.down_proj"});
      }
  {
    SafetensorsWriter w(d.path());
    for (const auto& c : cases) add_compressed_tensors_linear(w, c.prefix, c.q);
    w.finish();
  }
  const auto ck = Checkpoint::open(d.path());
  for (const auto& c : cases) {
    const json args = compressed_tensors_weights_args(c.q.scheme, c.actorder);
    const auto back = read_compressed_tensors_linear(ck, c.prefix, args);
    expect_same(c.q, back, c.prefix + " " + c.q.scheme.describe());
    EXPECT_EQ(ck.contains(c.prefix + ".weight_zero_point"), !c.q.scheme.symmetric) << c.prefix;
    EXPECT_EQ(ck.contains(c.prefix + ".weight_g_idx"), c.actorder) << c.prefix;
    EXPECT_EQ(back.dequantize(), c.q.dequantize()) << c.prefix;
  }
}

// The exact tensors, checked word by word against hand-computed values.
TEST(CompressedTensors, HandComputedLayout) {
  test::TempDir d;
  // 4-bit asymmetric, one group of 8 per row; 8 rows, 8 inputs.
  QuantizedTensor q = random_qt(QuantScheme::make(4, false, QuantStrategy::Group, 8), 8, 8, false, 5);
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 8; ++c) q.q[r * 8 + c] = static_cast<uint8_t>(r == 0 ? c : 15 - c);
  for (int r = 0; r < 8; ++r) q.zeros[r] = r;  // signed zp r - 8, stored offset back to r
  QuantizedTensor t = random_qt(QuantScheme::make(8, false, QuantStrategy::Tensor), 2, 4, false, 6);
  t.zeros[0] = 100;  // signed 100 - 128 = -28
  QuantizedTensor sy = random_qt(QuantScheme::make(4, true, QuantStrategy::Channel), 3, 8, false, 7);
  {
    SafetensorsWriter w(d.path());
    add_compressed_tensors_linear(w, "a", q);
    add_compressed_tensors_linear(w, "t", t);
    add_compressed_tensors_linear(w, "s", sy);
    w.finish();
  }
  const auto ck = Checkpoint::open(d.path());
  const auto packed = ck.tensor("a.weight_packed");
  EXPECT_EQ(packed.dtype(), DType::I32);
  EXPECT_EQ(packed.shape(), (Shape{8, 1}));
  EXPECT_EQ(static_cast<uint32_t>(packed.data_as<int32_t>()[0]), 0x76543210u);
  EXPECT_EQ(static_cast<uint32_t>(packed.data_as<int32_t>()[1]), 0x89ABCDEFu);  // 15 - c
  const auto zp = ck.tensor("a.weight_zero_point");
  EXPECT_EQ(zp.dtype(), DType::I32);
  EXPECT_EQ(zp.shape(), (Shape{1, 1}));  // [ceil(8*4/32), groups]
  EXPECT_EQ(static_cast<uint32_t>(zp.data_as<int32_t>()[0]), 0x76543210u);
  const auto ws = ck.tensor("a.weight_shape");
  EXPECT_EQ(ws.dtype(), DType::I64);
  EXPECT_EQ(ws.data_as<int64_t>()[0], 8);
  EXPECT_EQ(ws.data_as<int64_t>()[1], 8);
  EXPECT_EQ(ck.info("a.weight_scale").shape, (Shape{8, 1}));
  EXPECT_EQ(ck.info("a.weight_scale").dtype, DType::F16);
  // Tensor strategy: scale [1], zero point unpacked I8 [1], signed.
  EXPECT_EQ(ck.info("t.weight_scale").shape, (Shape{1}));
  const auto tz = ck.tensor("t.weight_zero_point");
  EXPECT_EQ(tz.dtype(), DType::I8);
  EXPECT_EQ(tz.shape(), (Shape{1}));
  EXPECT_EQ(tz.data_as<int8_t>()[0], -28);
  // Symmetric channel: scale [out, 1], no zero point, no g_idx.
  EXPECT_EQ(ck.info("s.weight_scale").shape, (Shape{3, 1}));
  EXPECT_FALSE(ck.contains("s.weight_zero_point"));
  EXPECT_FALSE(ck.contains("s.weight_g_idx"));
}

TEST(CompressedTensors, ReaderNamesTheBadTensor) {
  test::TempDir d;
  const auto q = random_qt(QuantScheme::make(4, false, QuantStrategy::Group, 16), 4, 32, false, 9);
  {
    SafetensorsWriter w(d.path());
    add_compressed_tensors_linear(w, "ok", q);
    // Same tensors, but weight_packed stored as I64 and the scale with a wrong shape.
    const auto packed = pack_int32_rows(q.q.data(), 4, 32, 4);
    std::vector<int64_t> wide(packed.begin(), packed.end());
    w.add("bad.weight_packed", DType::I64, {4, 4}, wide.data(), wide.size() * 8);
    const int64_t shape[2] = {4, 32};
    w.add("bad.weight_shape", DType::I64, {2}, shape, sizeof shape);
    w.add("shp.weight_packed", DType::I32, {4, 4}, packed.data(), packed.size() * 4);
    w.add("shp.weight_shape", DType::I64, {2}, shape, sizeof shape);
    std::vector<uint16_t> sc(4 * 3, 0x3c00);
    w.add("shp.weight_scale", DType::F16, {4, 3}, sc.data(), sc.size() * 2);
    w.finish();
  }
  const auto ck = Checkpoint::open(d.path());
  const json args = compressed_tensors_weights_args(q.scheme, false);
  EXPECT_QF_ERROR(read_compressed_tensors_linear(ck, "bad", args), ErrorKind::InvalidInput, "bad.weight_packed: dtype is I64");
  EXPECT_QF_ERROR(read_compressed_tensors_linear(ck, "shp", args), ErrorKind::InvalidInput,
                  "shp.weight_scale: shape is [4, 3], expected [4, 2]");
  EXPECT_QF_ERROR(read_compressed_tensors_linear(ck, "missing", args), ErrorKind::NotFound, "missing.weight_shape");
  // Arguments that disagree with the stored tensors.
  json wrong = args;
  wrong["num_bits"] = 8;
  EXPECT_QF_ERROR(read_compressed_tensors_linear(ck, "ok", wrong), ErrorKind::InvalidInput, "ok.weight_packed: shape is [4, 4], expected [4, 8]");
  json ao = args;
  ao["actorder"] = "group";
  EXPECT_QF_ERROR(read_compressed_tensors_linear(ck, "ok", ao), ErrorKind::NotFound, "ok.weight_g_idx");
  json fl = args;
  fl["type"] = "float";
  EXPECT_QF_ERROR(read_compressed_tensors_linear(ck, "ok", fl), ErrorKind::Unsupported, "only integer weights");
  json blk = args;
  blk["strategy"] = "block";
  EXPECT_QF_ERROR(read_compressed_tensors_linear(ck, "ok", blk), ErrorKind::Unsupported, "'block'");
}

TEST(CompressedTensors, SchemeFromArgsInfersLikeCompressedTensors) {
  bool ao = true;
  auto s = compressed_tensors_scheme_from_args(json{{"num_bits", 4}, {"group_size", 128}}, &ao);
  EXPECT_EQ(s.strategy, QuantStrategy::Group);
  EXPECT_EQ(s.group_size, 128);
  EXPECT_TRUE(s.symmetric);
  EXPECT_FALSE(ao);
  s = compressed_tensors_scheme_from_args(json{{"num_bits", 8}, {"group_size", -1}, {"symmetric", false}});
  EXPECT_EQ(s.strategy, QuantStrategy::Channel);
  EXPECT_FALSE(s.symmetric);
  s = compressed_tensors_scheme_from_args(json{{"num_bits", 8}});
  EXPECT_EQ(s.strategy, QuantStrategy::Tensor);
  compressed_tensors_scheme_from_args(json{{"num_bits", 4}, {"group_size", 32}, {"actorder", "dynamic"}}, &ao);
  EXPECT_TRUE(ao);
  compressed_tensors_scheme_from_args(json{{"num_bits", 4}, {"group_size", 32}, {"actorder", "weight"}}, &ao);
  EXPECT_FALSE(ao);
  EXPECT_QF_ERROR(compressed_tensors_scheme_from_args(json{{"num_bits", 4}, {"dynamic", true}}), ErrorKind::Unsupported, "dynamic");
  EXPECT_QF_ERROR(compressed_tensors_scheme_from_args(json{{"num_bits", 1}}), ErrorKind::InvalidInput,
                  "compressed-tensors weights args: num_bits: must be 2..8 for int weights, got 1");
  EXPECT_QF_ERROR(compressed_tensors_scheme_from_args(json{{"num_bits", 4}, {"strategy", "group"}}), ErrorKind::InvalidInput,
                  "strategy: 'group' needs a positive group_size");
  // The same resolver as recipes: asymmetric float weights, group act-order on
  // float weights and dtypes quantforge cannot write are refused here too.
  EXPECT_QF_ERROR(compressed_tensors_scheme_from_args(json{{"num_bits", 8}, {"type", "float"}, {"symmetric", false}}),
                  ErrorKind::Unsupported, "float weights are symmetric");
  EXPECT_QF_ERROR(compressed_tensors_scheme_from_args(json{{"num_bits", 4}, {"group_size", 128}, {"zp_dtype", "torch.float8_e4m3fn"}}),
                  ErrorKind::Unsupported, "zp_dtype: 'float8_e4m3fn' is not supported");
  EXPECT_QF_ERROR(compressed_tensors_scheme_from_args(json{{"num_bits", 4}, {"group_size", 128}, {"actorder", "sometimes"}}),
                  ErrorKind::InvalidInput, "actorder: expected static, weight, group, dynamic");
  EXPECT_QF_ERROR(compressed_tensors_scheme_from_args(json{{"num_bits", 4}, {"group_size", 128}, {"dynamic", "often"}}),
                  ErrorKind::InvalidInput, "dynamic: expected true, false or 'local'");
}

TEST(CompressedTensors, ConfigFieldForField) {
  CompressedTensorsGroup g0;
  g0.scheme = QuantScheme::make(4, true, QuantStrategy::Group, 128);
  CompressedTensorsGroup g1;
  g1.scheme = QuantScheme::make(8, false, QuantStrategy::Channel);
  g1.targets = {"re:.*down_proj"};
  CompressedTensorsGroup g2;
  g2.scheme = QuantScheme::make(4, false, QuantStrategy::Group, 64);
  g2.actorder_group = true;
  g2.targets = {"model.layers.0.self_attn.q_proj"};
  const json got = compressed_tensors_config({g0, g1, g2}, {"lm_head"});
  const json want = json::parse(R"({
    "config_groups": {
      "group_0": {"targets": ["Linear"], "format": "pack-quantized", "input_activations": null, "output_activations": null,
        "weights": {"num_bits": 4, "type": "int", "symmetric": true, "group_size": 128, "strategy": "group",
                    "block_structure": null, "dynamic": false, "actorder": null, "scale_dtype": null, "zp_dtype": null,
                    "observer": "memoryless_minmax", "observer_kwargs": {}}},
      "group_1": {"targets": ["re:.*down_proj"], "format": "pack-quantized", "input_activations": null, "output_activations": null,
        "weights": {"num_bits": 8, "type": "int", "symmetric": false, "group_size": null, "strategy": "channel",
                    "block_structure": null, "dynamic": false, "actorder": null, "scale_dtype": null, "zp_dtype": "torch.int8",
                    "observer": "memoryless_minmax", "observer_kwargs": {}}},
      "group_2": {"targets": ["model.layers.0.self_attn.q_proj"], "format": "pack-quantized", "input_activations": null,
        "output_activations": null,
        "weights": {"num_bits": 4, "type": "int", "symmetric": false, "group_size": 64, "strategy": "group",
                    "block_structure": null, "dynamic": false, "actorder": "group", "scale_dtype": null, "zp_dtype": "torch.int8",
                    "observer": "memoryless_minmax", "observer_kwargs": {}}}
    },
    "format": "pack-quantized",
    "global_compression_ratio": null,
    "ignore": ["lm_head"],
    "kv_cache_scheme": null,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
    "sparsity_config": {},
    "transform_config": {},
    "version": "0.18.0"
  })");
  EXPECT_EQ(got, want) << got.dump(2);
  // Keys come out sorted, as json.dump(sort_keys=True) writes them.
  EXPECT_EQ(got.dump().substr(0, 17), "{\"config_groups\":");
  // The args we write parse back to the same scheme.
  bool ao = false;
  const auto s = compressed_tensors_scheme_from_args(got["config_groups"]["group_2"]["weights"], &ao);
  EXPECT_EQ(s.bits, 4);
  EXPECT_EQ(s.group_size, 64);
  EXPECT_FALSE(s.symmetric);
  EXPECT_TRUE(ao);
  EXPECT_QF_ERROR(compressed_tensors_config({}, {}), ErrorKind::InvalidInput, "no quantization groups");
  CompressedTensorsGroup bad;
  bad.scheme = QuantScheme::make(4, true, QuantStrategy::Channel);
  bad.actorder_group = true;
  EXPECT_QF_ERROR(compressed_tensors_config({bad}, {}), ErrorKind::InvalidInput, "actorder group requires");
}

// ---- manifest ---------------------------------------------------------------

TEST(Manifest, ListsEveryFileSortedWithSizesAndDigests) {
  test::TempDir d;
  test::write_file(d / "config.json", "{}\n");
  test::write_file(d / "b" / "nested.bin", std::string(100000, 'x'));
  test::write_file(d / "a.txt", "abc");
  test::write_file(d / "B.txt", "");
  write_manifest(d.path());
  const json m = json::parse(read_text_file(d / kManifestFileName));
  EXPECT_EQ(m["format"], "quantforge-manifest");
  EXPECT_EQ(m["version"], 1);
  const json& f = m["files"];
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f[0]["path"], "B.txt");  // bytewise order: uppercase first
  EXPECT_EQ(f[0]["bytes"], 0);
  EXPECT_EQ(f[0]["sha256"], "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(f[1]["path"], "a.txt");
  EXPECT_EQ(f[1]["sha256"], "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(f[2]["path"], "b/nested.bin");
  EXPECT_EQ(f[2]["bytes"], 100000);
  EXPECT_EQ(f[2]["sha256"], sha256_hex(std::string(100000, 'x')));
  EXPECT_EQ(f[3]["path"], "config.json");
  EXPECT_TRUE(verify_manifest(d.path()).empty());
  // Rewriting does not list the manifest itself and gives the same bytes.
  const std::string first = read_text_file(d / kManifestFileName);
  write_manifest(d.path());
  EXPECT_EQ(read_text_file(d / kManifestFileName), first);
}

TEST(Manifest, VerifyReportsChangedMissingAndExtraFiles) {
  test::TempDir d;
  test::write_file(d / "model.safetensors", "weights");
  test::write_file(d / "config.json", "{}");
  test::write_file(d / "tokenizer.json", "tok");
  write_manifest(d.path());
  test::write_file(d / "model.safetensors", "weightz");  // same size, other bytes
  std::filesystem::remove(d / "config.json");
  test::write_file(d / "extra.bin", "x");
  test::write_file(d / "tokenizer.json", "tok2");
  const auto p = verify_manifest(d.path());
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0], "config.json: missing");
  EXPECT_EQ(p[1], "extra.bin: not in the manifest");
  EXPECT_EQ(p[2], "model.safetensors: sha256 differs");
  EXPECT_EQ(p[3], "tokenizer.json: size 4 differs from 3");
  test::TempDir empty;
  EXPECT_QF_ERROR(verify_manifest(empty.path()), ErrorKind::NotFound, "no manifest");
  EXPECT_QF_ERROR(write_manifest(d / "nope"), ErrorKind::NotFound, "no such folder");
}

// An exported compressed-tensors folder end to end: tensors, config, manifest.
TEST(Manifest, CoversAnExportedFolder) {
  test::TempDir d;
  const auto q = random_qt(QuantScheme::make(4, true, QuantStrategy::Group, 16), 8, 32, false, 3);
  {
    SafetensorsWriter w(d.path(), "model", 200);  // small shards: an index is written too
    add_compressed_tensors_linear(w, "model.layers.0.mlp.up_proj", q);
    add_compressed_tensors_linear(w, "model.layers.1.mlp.up_proj", q);
    w.finish();
  }
  CompressedTensorsGroup g;
  g.scheme = q.scheme;
  write_file_atomic(d / "config.json", json{{"quantization_config", compressed_tensors_config({g}, {"lm_head"})}}.dump(2));
  write_manifest(d.path());
  const json m = json::parse(read_text_file(d / kManifestFileName));
  std::vector<std::string> paths;
  for (const auto& f : m["files"]) paths.push_back(f["path"]);
  ASSERT_GE(paths.size(), 4u);
  EXPECT_EQ(paths.front(), "config.json");
  EXPECT_EQ(paths.back(), "model.safetensors.index.json");
  EXPECT_TRUE(verify_manifest(d.path()).empty());
  const auto ck = Checkpoint::open(d.path());
  expect_same(q, read_compressed_tensors_linear(ck, "model.layers.1.mlp.up_proj", compressed_tensors_weights_args(q.scheme, false)), "sharded");
}

}  // namespace
}  // namespace qf
