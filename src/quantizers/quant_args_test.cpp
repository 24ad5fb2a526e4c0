#include "quantizers/quant_args.h"

#include <gtest/gtest.h>

namespace qf {
namespace {

QuantArgsProblem weight_problem(const QuantArgs& a) {
  try {
    resolve_weight_args(a);
  } catch (const QuantArgsProblem& p) {
    return p;
  }
  ADD_FAILURE() << "no problem reported";
  return {QuantArg::None, "", ErrorKind::Internal};
}

TEST(QuantArgs, DefaultsAreCompressedTensors) {
  // No keys: int8, symmetric, one scale for the tensor.
  const ResolvedWeights r = resolve_weight_args({});
  EXPECT_EQ(r.scheme.describe(), QuantScheme::make(8, true, QuantStrategy::Tensor, 0).describe());
  EXPECT_FALSE(r.actorder);
  EXPECT_FALSE(r.scale_dtype_given);
  // group_size decides the strategy when none is named.
  QuantArgs a;
  a.num_bits = 4;
  a.group_size = 64;
  EXPECT_EQ(resolve_weight_args(a).scheme.strategy, QuantStrategy::Group);
  a.group_size = -1;
  EXPECT_EQ(resolve_weight_args(a).scheme.strategy, QuantStrategy::Channel);
  // NVFP4 fixes its block-scale dtype.
  QuantArgs f;
  f.type = "FLOAT";
  f.num_bits = 4;
  f.strategy = "tensor_group";
  f.group_size = 16;
  const ResolvedWeights n = resolve_weight_args(f);
  EXPECT_TRUE(n.scheme.is_nvfp4());
  EXPECT_TRUE(n.scale_dtype_given);
  EXPECT_EQ(n.scheme.scale_dtype, DType::F8_E4M3);
}

TEST(QuantArgs, ActOrderNamesAreCanonical) {
  EXPECT_EQ(canonical_actorder("Static"), "weight");
  EXPECT_EQ(canonical_actorder("weight"), "weight");
  EXPECT_EQ(canonical_actorder("DYNAMIC"), "group");
  EXPECT_EQ(canonical_actorder("group"), "group");
  EXPECT_FALSE(canonical_actorder("true"));  // booleans are the readers' to map
  QuantArgs a;
  a.num_bits = 4;
  a.group_size = 128;
  a.actorder = "";
  EXPECT_EQ(resolve_weight_args(a).actorder, std::optional<std::string>(""));
  a.actorder = "dynamic";
  EXPECT_EQ(resolve_weight_args(a).actorder, std::optional<std::string>("group"));
}

TEST(QuantArgs, ProblemsNameTheirKey) {
  QuantArgs a;
  a.num_bits = 12;
  QuantArgsProblem p = weight_problem(a);
  EXPECT_EQ(p.arg, QuantArg::NumBits);
  EXPECT_EQ(p.kind, ErrorKind::InvalidInput);
  EXPECT_STREQ(quant_arg_key(p.arg), "num_bits");

  a = {};
  a.strategy = "block";
  p = weight_problem(a);
  EXPECT_EQ(p.arg, QuantArg::Strategy);
  EXPECT_EQ(p.kind, ErrorKind::Unsupported);

  a = {};
  a.type = "float";
  a.symmetric = false;
  p = weight_problem(a);
  EXPECT_EQ(p.arg, QuantArg::None);
  EXPECT_EQ(p.kind, ErrorKind::Unsupported);

  a = {};
  a.dynamic = "sometimes";
  EXPECT_EQ(weight_problem(a).arg, QuantArg::Dynamic);
}

TEST(QuantArgs, Activations) {
  QuantArgs a;
  a.strategy = "token";
  a.dynamic = "true";
  EXPECT_EQ(resolve_activation_args(a, false).describe(), ActivationScheme::int8_token().describe());
  a.type = "float";
  EXPECT_EQ(resolve_activation_args(a, false).describe(), ActivationScheme::fp8_token().describe());
  // The KV cache takes FP8 per-tensor static scales only.
  EXPECT_THROW(resolve_activation_args(a, true), QuantArgsProblem);
  a.strategy = "tensor";
  a.dynamic = "false";
  EXPECT_EQ(resolve_activation_args(a, true).describe(), ActivationScheme::fp8_tensor_static().describe());
  // NVFP4 activations: tensor_group 16, dynamic local.
  QuantArgs n;
  n.type = "float";
  n.num_bits = 4;
  n.strategy = "tensor_group";
  n.group_size = 16;
  n.dynamic = "local";
  EXPECT_TRUE(resolve_activation_args(n, false).is_nvfp4());
  n.dynamic = "true";
  EXPECT_THROW(resolve_activation_args(n, false), QuantArgsProblem);
  QuantArgs w;
  w.actorder = "group";
  try {
    resolve_activation_args(w, false);
    ADD_FAILURE() << "act-order on activations accepted";
  } catch (const QuantArgsProblem& p) {
    EXPECT_EQ(p.arg, QuantArg::ActOrder);
  }
}

}  // namespace
}  // namespace qf
