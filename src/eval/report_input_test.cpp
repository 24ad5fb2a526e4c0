#include "eval/report_input.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include "test_util.h"

namespace qf::eval {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// An eval --json report of `model` against `baseline`, as eval writes it (trimmed).
json eval_json(const std::string& model, const std::string& baseline, int64_t tokens = 1022) {
  return {{"model", model},
          {"text", "tests/data/text/evaluation.txt"},
          {"mode", "chunks"},
          {"ctx", 512},
          {"tokens_scored", tokens},
          {"ppl", 12.5},
          {"valid", true},
          {"problems", json::array()},
          {"baseline", {{"model", baseline}, {"ppl", 12.0}}},
          {"kld", {{"mean", 0.0125}, {"p99", 0.1}, {"max", 0.4}}},
          {"top1_agreement", 0.93}};
}

json quantize_report(const json& evaluation) {
  return {{"method", "gptq"},
          {"linears", {{{"name", "model.layers.0.mlp.up_proj"}, {"weights", "int4 group 128"}}}},
          {"evaluation", evaluation}};
}

ReportRow parse_eval(const json& j) { return parse_report_input(j.dump(), "e.json", "e.json", ReportInputKind::EvalJson); }
ReportRow parse_quantize(const json& j) {
  return parse_report_input(j.dump(), "q/quantization_report.json", "runs/q", ReportInputKind::QuantizeReport);
}

TEST(ReportInput, ReadsAnEvalJson) {
  const ReportRow r = parse_eval(eval_json("out/m.gguf", "ref"));
  EXPECT_EQ(r.name, "m.gguf");
  EXPECT_EQ(r.model, "out/m.gguf");
  EXPECT_DOUBLE_EQ(r.ppl, 12.5);
  EXPECT_DOUBLE_EQ(r.kld, 0.0125);
  ASSERT_TRUE(r.top1);
  EXPECT_DOUBLE_EQ(*r.top1, 0.93);
  EXPECT_EQ(r.baseline_model, "ref");
  EXPECT_DOUBLE_EQ(r.baseline_ppl, 12.0);
  EXPECT_EQ(r.tokens, 1022);
}

TEST(ReportInput, ReadsAQuantizeReport) {
  const ReportRow r = parse_quantize(quantize_report(eval_json("runs/q", "ref")));
  EXPECT_EQ(r.name, "q");
  EXPECT_EQ(r.model, "runs/q");  // the output folder is what is sized
  EXPECT_EQ(r.label, "gptq int4 group 128");
  EXPECT_DOUBLE_EQ(r.ppl, 12.5);
}

TEST(ReportInput, RefusesWhatIsNotJson) {
  EXPECT_QF_ERROR(parse_report_input("ppl=3", "e.json", "e.json", ReportInputKind::EvalJson), ErrorKind::InvalidInput,
                  "e.json: not an eval JSON file");
  EXPECT_QF_ERROR(parse_report_input("", "e.json", "e.json", ReportInputKind::EvalJson), ErrorKind::InvalidInput,
                  "not valid JSON");
  EXPECT_QF_ERROR(parse_report_input("[1, 2]", "e.json", "e.json", ReportInputKind::EvalJson),
                  ErrorKind::InvalidInput, "not an object");
  EXPECT_QF_ERROR(parse_report_input("{\"a\": 1}", "q.json", "q", ReportInputKind::QuantizeReport),
                  ErrorKind::InvalidInput, "no evaluation");
}

TEST(ReportInput, RefusesNonFiniteNumbers) {
  // What Python's json.dump writes for a float NaN or infinity: not JSON.
  std::string text = eval_json("m", "ref").dump();
  const std::string nan = std::string(text).replace(text.find("12.5"), 4, "NaN");
  EXPECT_QF_ERROR(parse_report_input(nan, "e.json", "e.json", ReportInputKind::EvalJson), ErrorKind::InvalidInput,
                  "NaN and Infinity are not JSON numbers");
  const std::string inf = std::string(text).replace(text.find("12.5"), 4, "Infinity");
  EXPECT_QF_ERROR(parse_report_input(inf, "e.json", "e.json", ReportInputKind::EvalJson), ErrorKind::InvalidInput,
                  "not valid JSON");
  const std::string huge = std::string(text).replace(text.find("12.5"), 4, "1e999");
  EXPECT_QF_ERROR(parse_report_input(huge, "e.json", "e.json", ReportInputKind::EvalJson), ErrorKind::InvalidInput,
                  "not valid JSON");
  // nlohmann writes NaN as null: a missing measurement, not a number.
  json j = eval_json("m", "ref");
  j["ppl"] = nullptr;
  EXPECT_QF_ERROR(parse_eval(j), ErrorKind::InvalidInput, "not an eval JSON file");
  j = eval_json("m", "ref");
  j["kld"]["mean"] = nullptr;
  EXPECT_QF_ERROR(parse_eval(j), ErrorKind::InvalidInput, "no \"kld.mean\"");
}

TEST(ReportInput, RefusesWrongTypes) {
  const auto refused = [](const std::string& key, const json& value, const std::string& fragment) {
    json j = eval_json("m", "ref");
    json::json_pointer ptr(key);
    j[ptr] = value;
    EXPECT_QF_ERROR(parse_eval(j), ErrorKind::InvalidInput, fragment);
  };
  refused("/ppl", "high", "\"ppl\" must be a finite positive number, got \"high\"");
  refused("/ppl", true, "\"ppl\" must be a finite positive number");
  refused("/ppl", 0, "\"ppl\" must be a finite positive number");
  refused("/ppl", -3.5, "\"ppl\" must be a finite positive number");
  refused("/model", 7, "\"model\" must be a non-empty string");
  refused("/model", "", "\"model\" must be a non-empty string");
  refused("/text", json::array(), "\"text\" must be a non-empty string");
  refused("/valid", "yes", "\"valid\" must be true or false");
  refused("/valid", 1, "\"valid\" must be true or false");
  refused("/tokens_scored", 12.5, "\"tokens_scored\" must be a positive whole number");
  refused("/tokens_scored", 0, "\"tokens_scored\" must be a positive whole number");
  refused("/tokens_scored", -4, "\"tokens_scored\" must be a positive whole number");
  refused("/tokens_scored", "1022", "\"tokens_scored\" must be a positive whole number");
  refused("/baseline", "ref", "\"baseline\" must be an object");
  refused("/baseline/model", 1, "\"baseline.model\" must be a non-empty string");
  refused("/baseline/ppl", "12", "\"baseline.ppl\" must be a finite positive number");
  refused("/kld", 0.5, "\"kld\" must be an object");
  refused("/kld/mean", -0.5, "\"kld.mean\" must be a finite number >= 0");
  refused("/kld/mean", "small", "\"kld.mean\" must be a finite number >= 0");
  refused("/top1_agreement", 1.5, "\"top1_agreement\" must be a fraction between 0 and 1");
  refused("/top1_agreement", "all", "\"top1_agreement\" must be a fraction between 0 and 1");

  json q = quantize_report(eval_json("q", "ref"));
  q["method"] = 3;
  EXPECT_QF_ERROR(parse_quantize(q), ErrorKind::InvalidInput, "\"method\" must be a non-empty string");
  q = quantize_report(eval_json("q", "ref"));
  q["linears"] = "all";
  EXPECT_QF_ERROR(parse_quantize(q), ErrorKind::InvalidInput, "\"linears\" must be a list");
  q["linears"] = json::array({7});
  EXPECT_QF_ERROR(parse_quantize(q), ErrorKind::InvalidInput, "\"linears\" must hold objects");
  q["linears"] = json::array({{{"weights", 4}}});
  EXPECT_QF_ERROR(parse_quantize(q), ErrorKind::InvalidInput, "\"linears[0].weights\" must be a non-empty string");
  q = quantize_report(eval_json("q", "ref"));
  q["evaluation"]["ppl"] = "high";
  EXPECT_QF_ERROR(parse_quantize(q), ErrorKind::InvalidInput, "\"evaluation.ppl\" must be a finite positive number");
  q["evaluation"] = "none";
  EXPECT_QF_ERROR(parse_quantize(q), ErrorKind::InvalidInput, "\"evaluation\" must be an object");
}

TEST(ReportInput, NeedsAValidEvaluationWithABaseline) {
  json j = eval_json("m", "ref");
  j["valid"] = false;
  j["problems"] = {"perplexity is not finite"};
  EXPECT_QF_ERROR(parse_eval(j), ErrorKind::InvalidInput, "not valid (perplexity is not finite)");
  j["problems"] = {1};
  EXPECT_QF_ERROR(parse_eval(j), ErrorKind::InvalidInput, "\"problems\" must be a list of strings");
  for (const char* key : {"baseline", "kld", "top1_agreement"}) {
    j = eval_json("m", "ref");
    j.erase(key);
    EXPECT_QF_ERROR(parse_eval(j), ErrorKind::InvalidInput, "no baseline comparison");
  }
  j = eval_json("m", "ref");
  j.erase("valid");
  EXPECT_QF_ERROR(parse_eval(j), ErrorKind::InvalidInput, "no \"valid\"");
}

TEST(ReportInput, MessagesStayOnOneLine) {
  json j = eval_json("m", "ref");
  j["ppl"] = "a\nb\rc";
  try {
    parse_eval(j);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find_first_of("\n\r"), std::string::npos) << e.what();
  }
  try {  // the parser quotes what it last read, raw
    parse_report_input("{\"ppl\":\n\n x", "e.json", "e.json", ReportInputKind::EvalJson);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find_first_of("\n\r"), std::string::npos) << e.what();
  }
}

// ---- reading files ------------------------------------------------------------

struct Runs {
  test::TempDir d;
  fs::path ref, gguf, quant;
  Runs() {
    ref = d / "ref";
    test::write_file(ref / "model.safetensors", std::string(300, 'r'));
    gguf = d / "m.gguf";
    test::write_file(gguf, std::string(100, 'g'));
    quant = d / "q";
    test::write_file(quant / "model.safetensors", std::string(200, 'q'));
    write_quant(eval_json(quant.string(), ref.string()));
  }
  void write_quant(const json& ev) const {
    test::write_file(quant / "quantization_report.json", quantize_report(ev).dump());
  }
  fs::path eval_file(const std::string& name, int64_t tokens = 1022) const {
    test::write_file(d / name, eval_json(gguf.string(), ref.string(), tokens).dump());
    return d / name;
  }
};

TEST(ReportInputs, LoadsSizesAndSorts) {
  Runs r;
  const ReportInputs in = load_report_inputs({r.quant.string(), r.eval_file("g.json").string()});
  ASSERT_EQ(in.outputs.size(), 2u);
  EXPECT_EQ(in.outputs[0].name, "m.gguf");
  EXPECT_EQ(in.outputs[0].bytes, 100u);
  EXPECT_EQ(in.outputs[1].name, "q");
  EXPECT_EQ(in.outputs[1].bytes, 200u);
  EXPECT_EQ(in.reference.name, "ref (reference)");
  EXPECT_EQ(in.reference.bytes, 300u);
  EXPECT_DOUBLE_EQ(in.reference.ppl, 12.0);
  const nlohmann::ordered_json j = report_rows_json(in);
  EXPECT_EQ(j["outputs"][1]["label"], "gptq int4 group 128");
  EXPECT_EQ(j["reference"]["kld"], 0.0);
  EXPECT_EQ(j["outputs"][0]["series"], "");
}

TEST(ReportInputs, AGgufWithItsSizeBudgetPlanIsAMix) {
  Runs r;
  test::write_file(r.d / "m.mix.json", "{}");
  const ReportInputs in = load_report_inputs({r.quant.string(), r.eval_file("g.json").string()});
  ASSERT_EQ(in.outputs.size(), 2u);
  EXPECT_EQ(in.outputs[0].series, "size-budget mix");
  EXPECT_EQ(in.outputs[1].series, "");  // a quantize output folder
  EXPECT_EQ(report_rows_json(in)["outputs"][0]["series"], "size-budget mix");
}

TEST(ReportInputs, MissingPathIsNotFound) {
  Runs r;
  EXPECT_QF_ERROR(load_report_inputs({(r.d / "nope.json").string()}), ErrorKind::NotFound, "nope.json: no such file");
  EXPECT_QF_ERROR(load_report_inputs({}), ErrorKind::Usage, "no inputs");
  // the model an eval JSON names is sized, so it must exist too
  fs::remove(r.gguf);
  EXPECT_QF_ERROR(load_report_inputs({r.eval_file("g.json").string()}), ErrorKind::NotFound,
                  "m.gguf: no such model file or folder");
}

TEST(ReportInputs, RefusesDifferentTokenCounts) {
  Runs r;
  const fs::path a = r.eval_file("a.json", 1022), b = r.eval_file("b.json", 2044);
  EXPECT_QF_ERROR(load_report_inputs({a.string(), b.string()}), ErrorKind::InvalidInput,
                  "not comparable (" + a.string() + " 1022, " + b.string() + " 2044)");
  const fs::path c = r.eval_file("c.json", 1022);
  EXPECT_NO_THROW(load_report_inputs({a.string(), c.string(), r.quant.string()}));
}

TEST(ReportInputs, RefusesDifferentBaselines) {
  Runs r;
  json ev = eval_json(r.quant.string(), (r.d / "other").string());
  r.write_quant(ev);
  EXPECT_QF_ERROR(load_report_inputs({r.quant.string(), r.eval_file("g.json").string()}), ErrorKind::InvalidInput,
                  "different baselines or texts");
}

TEST(ReportInputs, QuantizeReportNamedDirectly) {
  Runs r;
  const ReportInputs in = load_report_inputs({(r.quant / "quantization_report.json").string()});
  EXPECT_EQ(in.outputs.at(0).name, "q");
  EXPECT_EQ(in.outputs.at(0).bytes, 200u);
}

// ---- the output folder --------------------------------------------------------

TEST(ReportOutput, RefusesInputsAndExistingFiles) {
  Runs r;
  const fs::path g = r.eval_file("g.json");
  const ReportInputs in = load_report_inputs({r.quant.string(), g.string()});
  // into a quantize output (a checkpoint), or a folder inside one, or a model folder
  EXPECT_QF_ERROR(check_report_output(r.quant, in.read, true, "-o"), ErrorKind::Io, "would overwrite an input");
  EXPECT_QF_ERROR(check_report_output(r.quant / "charts", in.read, true, "-o"), ErrorKind::Io,
                  "lies inside an input of this run");
  EXPECT_QF_ERROR(check_report_output(r.ref / "a" / "b", in.read, true, "-o"), ErrorKind::Io, "lies inside an input");
  // through a symbolic link into the checkpoint
  fs::create_directory_symlink(r.quant, r.d / "link");
  EXPECT_QF_ERROR(check_report_output(r.d / "link" / "x", in.read, true, "-o"), ErrorKind::Io, "lies inside an input");
  // an eval JSON named report.json in the output folder would be replaced by the report's own
  const fs::path out = r.d / "out";
  test::write_file(out / "report.json", eval_json(r.gguf.string(), r.ref.string()).dump());
  const ReportInputs in2 = load_report_inputs({(out / "report.json").string()});
  EXPECT_QF_ERROR(check_report_output(out, in2.read, true, "-o"), ErrorKind::Io,
                  "-o would overwrite an input of this run");
  // the output is an input file itself
  EXPECT_QF_ERROR(check_report_output(g, in.read, true, "-o"), ErrorKind::Io, "would overwrite an input");
  // an existing report needs force
  test::write_file(r.d / "old" / "chart.png", "png");
  EXPECT_QF_ERROR(check_report_output(r.d / "old", in.read, false, "-o"), ErrorKind::Io,
                  "chart.png: -o already exists; pass --force");
  EXPECT_NO_THROW(check_report_output(r.d / "old", in.read, true, "-o"));
  EXPECT_NO_THROW(check_report_output(r.d / "new" / "deeper", in.read, false, "-o"));
  test::write_file(r.d / "plain", "x");
  EXPECT_QF_ERROR(check_report_output(r.d / "plain", in.read, true, "-o"), ErrorKind::Io, "is not a folder");
  EXPECT_QF_ERROR(check_report_output("", in.read, true, "-o"), ErrorKind::Usage, "-o is empty");
  // a folder beside the inputs is fine
  EXPECT_NO_THROW(check_report_output(r.d / "charts", in.read, false, "-o"));
}

}  // namespace
}  // namespace qf::eval
