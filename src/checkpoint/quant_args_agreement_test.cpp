// A recipe's YAML and a checkpoint's JSON go through one resolver
// (quantizers/quant_args.h): the same QuantizationArgs give the same scheme,
// or the same error, whichever side reads them.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "checkpoint/compressed_tensors.h"
#include "core/error.h"
#include "recipe/recipe.h"

namespace qf {
namespace {

using json = nlohmann::json;

struct Outcome {
  bool ok = false;
  QuantScheme scheme;
  bool actorder_group = false;
  ErrorKind kind = ErrorKind::Internal;
  std::string message;  // the resolver's words, from the key on
};

// The text after `marker` (the reader's own prefix), or the whole message.
std::string after(const std::string& s, const std::string& marker) {
  const size_t at = s.find(marker);
  return at == std::string::npos ? s : s.substr(at + marker.size());
}

Outcome from_json(const json& args) {
  Outcome o;
  try {
    o.scheme = compressed_tensors_scheme_from_args(args, &o.actorder_group);
    o.ok = true;
  } catch (const Error& e) {
    o.kind = e.kind();
    o.message = after(e.what(), "weights args: ");
  }
  return o;
}

Outcome from_yaml(const json& args) {
  const std::string text =
      "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n      config_groups:\n        g:\n"
      "          targets: [Linear]\n          weights: " +
      args.dump() + "\n";
  Outcome o;
  try {
    const Recipe r = parse_recipe_text(text, "r.yaml");
    const auto& g = r.modifiers.at(0).groups.at(0);
    o.scheme = g.weights;
    o.actorder_group = g.act_order() == GptqOptions::ActOrder::Group;
    o.ok = true;
  } catch (const Error& e) {
    o.kind = e.kind();
    std::string m = after(e.what(), ".weights");
    if (m.rfind(": ", 0) == 0 || m.rfind(".", 0) == 0) m = m.substr(m[0] == '.' ? 1 : 2);
    o.message = m;
  }
  return o;
}

TEST(QuantArgsAgreement, RecipeAndCheckpointResolveAlike) {
  const std::vector<json> cases = {
      {{"num_bits", 4}, {"group_size", 128}},
      {{"num_bits", 4}, {"group_size", 128}, {"symmetric", false}},
      {{"num_bits", 8}, {"group_size", -1}},
      {{"num_bits", 8}},
      {{"num_bits", 3}, {"strategy", "channel"}},
      {{"num_bits", 4}, {"strategy", "Group"}, {"group_size", 64}},
      {{"num_bits", 4}, {"group_size", 32}, {"actorder", "dynamic"}},
      {{"num_bits", 4}, {"group_size", 32}, {"actorder", true}},
      {{"num_bits", 4}, {"group_size", 32}, {"actorder", "static"}},
      {{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}},
      {{"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}},
      {{"num_bits", 4}, {"type", "float"}, {"strategy", "tensor_group"}, {"group_size", 16}},
      {{"num_bits", 4}, {"group_size", 128}, {"scale_dtype", "torch.bfloat16"}},
      {{"num_bits", 4}, {"group_size", 128}, {"zp_dtype", "torch.int8"}, {"symmetric", false}},
      // refused, by both
      {{"num_bits", 1}},
      {{"num_bits", 9}},
      {{"num_bits", 6}, {"type", "float"}},
      {{"num_bits", 8}, {"type", "mx"}},
      {{"num_bits", 4}, {"strategy", "group"}},
      {{"num_bits", 4}, {"group_size", 0}},
      {{"num_bits", 4}, {"group_size", 128}, {"strategy", "channel"}},
      {{"num_bits", 4}, {"strategy", "token"}},
      {{"num_bits", 4}, {"strategy", "tensr"}},
      {{"num_bits", 8}, {"strategy", "block"}},
      {{"num_bits", 4}, {"type", "float"}, {"group_size", 32}},
      {{"num_bits", 4}, {"type", "float"}, {"strategy", "tensor_group"}, {"group_size", 32}},
      {{"num_bits", 8}, {"type", "float"}, {"symmetric", false}},
      {{"num_bits", 4}, {"group_size", 128}, {"dynamic", true}},
      {{"num_bits", 4}, {"group_size", 128}, {"dynamic", "local"}},
      {{"num_bits", 4}, {"strategy", "channel"}, {"actorder", "group"}},
      {{"num_bits", 8}, {"type", "float"}, {"group_size", 128}, {"actorder", "group"}},
      {{"num_bits", 4}, {"group_size", 128}, {"scale_dtype", "torch.float8_e4m3fn"}},
      {{"num_bits", 4}, {"group_size", 128}, {"scale_dtype", "float64"}},
      {{"num_bits", 4}, {"group_size", 128}, {"zp_dtype", "torch.float8_e4m3fn"}},
  };
  int refused = 0;
  for (const json& c : cases) {
    const Outcome j = from_json(c), y = from_yaml(c);
    SCOPED_TRACE(c.dump());
    ASSERT_EQ(j.ok, y.ok) << "json: " << j.message << "\nyaml: " << y.message;
    if (j.ok) {
      EXPECT_EQ(j.scheme.describe(), y.scheme.describe());
      EXPECT_EQ(j.scheme.type, y.scheme.type);
      EXPECT_EQ(j.scheme.group_size, y.scheme.group_size);
      EXPECT_EQ(j.actorder_group, y.actorder_group);
    } else {
      ++refused;
      EXPECT_EQ(j.kind, y.kind);
      EXPECT_EQ(j.message, y.message);
      EXPECT_FALSE(j.message.empty());
    }
  }
  EXPECT_EQ(refused, 20);
}

}  // namespace
}  // namespace qf
