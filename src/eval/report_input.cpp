#include "eval/report_input.h"

#include <algorithm>
#include <optional>
#include <cmath>
#include <map>
#include <set>
#include <system_error>

#include "core/error.h"
#include "core/io.h"
#include "formats/hf/resolve.h"

namespace qf::eval {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kQuantizeReportFile = "quantization_report.json";

// A value quoted in a message: its JSON text, shortened, on one line.
std::string shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return printable_text(s);
}

// Reads the members of one JSON object, naming each by its full key
// ("evaluation.kld.mean") in errors about the file `where`.
class Fields {
 public:
  Fields(const json& obj, std::string where, std::string prefix)
      : obj_(obj), where_(std::move(where)), prefix_(std::move(prefix)) {}

  std::string key(const std::string& k) const { return "\"" + prefix_ + k + "\""; }
  const std::string& where() const { return where_; }

  // The member, or nullptr when it is absent or null.
  const json* find(const std::string& k) const {
    const auto it = obj_.find(k);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  const json& need(const std::string& k, const std::string& why = "") const {
    const json* v = find(k);
    if (!v) throw invalid_input(where_, "no " + key(k) + (why.empty() ? "" : " (" + why + ")"));
    return *v;
  }
  Error wrong(const std::string& k, const std::string& expected) const {
    return invalid_input(where_, key(k) + " must be " + expected + ", got " + shown(*find(k)));
  }

  double number(const std::string& k, double min, double max, const std::string& expected) const {
    const json& v = need(k);
    // JSON has no NaN or infinity; a number too large for a double is refused by the parser.
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < min || v.get<double>() > max)
      throw wrong(k, expected);
    return v.get<double>();
  }
  int64_t positive_integer(const std::string& k) const {
    const json& v = need(k);
    if (v.is_number_unsigned() && v.get<uint64_t>() > 0 && v.get<uint64_t>() <= uint64_t(INT64_MAX))
      return static_cast<int64_t>(v.get<uint64_t>());
    if (v.is_number_integer() && v.get<int64_t>() > 0) return v.get<int64_t>();
    throw wrong(k, "a positive whole number");
  }
  std::string text(const std::string& k) const {
    const json& v = need(k);
    if (!v.is_string() || v.get_ref<const std::string&>().empty()) throw wrong(k, "a non-empty string");
    return v.get<std::string>();
  }
  bool flag(const std::string& k) const {
    const json& v = need(k);
    if (!v.is_boolean()) throw wrong(k, "true or false");
    return v.get<bool>();
  }
  Fields object(const std::string& k, const std::string& why = "") const {
    const json& v = need(k, why);
    if (!v.is_object()) throw wrong(k, "an object");
    return Fields(v, where_, prefix_ + k + ".");
  }

 private:
  const json& obj_;
  std::string where_, prefix_;
};

// The last component of a model path as recorded ("runs/q4/" -> "q4").
std::string base_name(const std::string& recorded) {
  std::string path = fs::path(recorded).lexically_normal().string();
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const std::string name = fs::path(path).filename().string();
  return name.empty() ? path : name;
}

// The problems an invalid evaluation lists, joined; the list itself must be strings.
std::string problems_text(const Fields& ev) {
  const json* p = ev.find("problems");
  if (!p) return "no problems listed";
  if (!p->is_array()) throw ev.wrong("problems", "a list of strings");
  std::string s;
  for (const json& x : *p) {
    if (!x.is_string()) throw ev.wrong("problems", "a list of strings");
    s += (s.empty() ? "" : "; ") + printable_text(x.get<std::string>());
  }
  return s.empty() ? "no problems listed" : s;
}

// The evaluation part, common to both kinds: a valid measurement compared
// with a baseline.
void read_evaluation(const Fields& ev, ReportRow& row) {
  if (!ev.flag("valid"))
    throw invalid_input(ev.where(), "the evaluation is not valid (" + problems_text(ev) + ")");
  // Each measurement is bounded by what it can be: a perplexity is at least
  // exp(0) = 1 in exact arithmetic (0 allows for rounding), a KL divergence
  // is clamped at 0, an agreement is a fraction.
  row.ppl = ev.number("ppl", 0, HUGE_VAL, "a finite positive number");
  if (row.ppl <= 0) throw ev.wrong("ppl", "a finite positive number");
  row.text = ev.text("text");
  row.tokens = ev.positive_integer("tokens_scored");
  const std::string no_baseline = "the evaluation has no baseline comparison; evaluate with --baseline";
  const Fields base = ev.object("baseline", no_baseline);
  row.baseline_model = base.text("model");
  row.baseline_ppl = base.number("ppl", 0, HUGE_VAL, "a finite positive number");
  if (row.baseline_ppl <= 0) throw base.wrong("ppl", "a finite positive number");
  row.kld = ev.object("kld", no_baseline).number("mean", 0, HUGE_VAL, "a finite number >= 0");
  ev.need("top1_agreement", no_baseline);
  row.top1 = ev.number("top1_agreement", 0, 1, "a fraction between 0 and 1");
}

json parse_json(std::string_view text, const std::string& where, ReportInputKind kind) {
  const std::string what =
      kind == ReportInputKind::EvalJson ? "an eval JSON file (quantforge eval --baseline REF --json FILE)"
                                        : "a quantization report";
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e999
    const bool nan = text.find("NaN") != std::string_view::npos || text.find("Infinity") != std::string_view::npos;
    throw invalid_input(where, "not " + what + ": not valid JSON" +
                                   (nan ? " (NaN and Infinity are not JSON numbers)" : "") + ": " +
                                   printable_text(e.what()));
  }
  if (!j.is_object()) throw invalid_input(where, "not " + what + ": the JSON is not an object");
  return j;
}

// The file or folder a recorded model path names: the path itself, or the
// folder of a Hugging Face cache id.
fs::path locate_model(const std::string& model, const std::string& needed_by) {
  if (is_file(model) || is_folder(model)) return model;
  const fs::path p = model_input_path(model);
  if (p.empty() || (!is_file(p) && !is_folder(p)))
    throw not_found(printable_text(model), "no such model file or folder (" + needed_by + " needs its size)");
  return p;
}

// A model file's size, or the total of a model folder's weight files.
uint64_t model_bytes(const fs::path& p) {
  std::error_code ec;
  if (is_file(p)) {
    const uintmax_t n = fs::file_size(p, ec);
    if (ec) throw io_error(p.string(), "cannot read its size: " + ec.message());
    return n;
  }
  uint64_t total = 0;
  fs::directory_iterator it(p, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.ends_with(".safetensors") && !name.ends_with(".gguf") && !name.ends_with(".bin")) continue;
    std::error_code fe;
    if (!fs::is_regular_file(it->path(), fe)) continue;  // follows links, as in a cache snapshot
    const uintmax_t n = fs::file_size(it->path(), fe);
    if (fe) throw io_error(it->path().string(), "cannot read its size: " + fe.message());
    total += n;
  }
  if (ec) throw io_error(p.string(), "cannot list the folder: " + ec.message());
  if (total == 0) throw invalid_input(p.string(), "no weight files (.safetensors, .gguf, .bin) to size");
  return total;
}

// The row of one path the user named, and the files it read.
ReportRow load_one(const std::string& path, std::vector<fs::path>& read) {
  if (!path_exists(path)) throw not_found(printable_text(path), "no such file or folder");
  std::string source = path;
  fs::path file = path;
  ReportInputKind kind = ReportInputKind::EvalJson;
  if (is_folder(path)) {
    file = fs::path(path) / kQuantizeReportFile;
    if (!path_exists(file))
      throw invalid_input(path, std::string("no ") + kQuantizeReportFile +
                                    " (expected a quantize output folder or an eval JSON file)");
    kind = ReportInputKind::QuantizeReport;
  } else if (fs::path(path).filename() == kQuantizeReportFile) {
    source = fs::path(path).parent_path().string();  // the report of a quantize output, named directly
    if (source.empty()) source = ".";
    kind = ReportInputKind::QuantizeReport;
  }
  read.push_back(path);
  read.push_back(file);
  ReportRow row = parse_report_input(read_text_file(file), file.string(), source, kind);
  const fs::path model = locate_model(row.model, file.string());
  read.push_back(model);
  row.bytes = model_bytes(model);
  if (model.extension() == ".gguf" && is_file(fs::path(model).replace_extension(".mix.json"))) row.series = "size-budget mix";
  return row;
}

}  // namespace

ReportRow parse_report_input(std::string_view json_text, const std::string& where, const std::string& source,
                             ReportInputKind kind) {
  const json j = parse_json(json_text, where, kind);
  const Fields top(j, where, "");
  ReportRow row;
  if (kind == ReportInputKind::EvalJson) {
    if (!top.find("ppl") || !top.find("model"))
      throw invalid_input(where, "not an eval JSON file: no \"ppl\" and \"model\" (quantforge eval --json writes them)");
    row.model = top.text("model");
    row.name = base_name(row.model);
    row.label = row.name;
    read_evaluation(top, row);
    return row;
  }
  const json* ev = top.find("evaluation");
  if (!ev) throw invalid_input(where, "the report has no evaluation (quantize with --eval TEXT)");
  if (!ev->is_object()) throw top.wrong("evaluation", "an object");
  const std::string method = top.text("method");
  const json& linears = top.need("linears");
  if (!linears.is_array()) throw top.wrong("linears", "a list");
  std::string scheme;
  if (!linears.empty()) {
    if (!linears[0].is_object()) throw invalid_input(where, "\"linears\" must hold objects, got " + shown(linears[0]));
    scheme = Fields(linears[0], where, "linears[0].").text("weights");
  }
  row.model = source;
  std::error_code ec;
  const fs::path absolute = fs::absolute(source, ec);  // "." is named after the folder it is
  row.name = base_name(ec ? source : absolute.string());
  row.label = scheme.empty() ? method : method + " " + scheme;
  read_evaluation(Fields(*ev, where, "evaluation."), row);
  return row;
}

namespace {

// A `kv-sweep --json` file: one row per format, each a valid measurement
// against the same model with an f16 cache; nullopt for any other JSON.
std::optional<ReportInputs> load_kv_sweep(const std::string& path) {
  if (!path_exists(path) || is_folder(path)) return std::nullopt;
  const std::string text = read_text_file(path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception&) {
    return std::nullopt;  // parse_report_input says what is wrong with it
  }
  if (!j.is_object() || !j.contains("kv_sweep")) return std::nullopt;
  const Fields top(j, path, "");
  if (!top.flag("kv_sweep")) return std::nullopt;
  ReportInputs in;
  in.unit = "kv_cache";
  in.read.push_back(path);
  const std::string model = top.text("model"), txt = top.text("text");
  const int64_t tokens = top.positive_integer("tokens_scored");
  const Fields base = top.object("baseline");
  const double base_ppl = base.number("ppl", 0, HUGE_VAL, "a finite positive number");
  const json& rows = top.need("rows");
  if (!rows.is_array() || rows.empty()) throw top.wrong("rows", "a non-empty list");
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string pre = "rows[" + std::to_string(i) + "].";
    if (!rows[i].is_object()) throw invalid_input(path, "\"" + pre.substr(0, pre.size() - 1) + "\" must be an object");
    const Fields r(rows[i], path, pre);
    ReportRow row;
    row.name = r.text("kv_dtype");
    if (!r.flag("valid")) throw invalid_input(path, row.name + ": the measurement is not valid");
    const std::string vllm = r.find("vllm") && r.find("vllm")->is_string() ? r.find("vllm")->get<std::string>() : "";
    const std::string lcpp = r.find("llama_cpp") && r.find("llama_cpp")->is_string() ? r.find("llama_cpp")->get<std::string>() : "";
    row.label = !vllm.empty() ? "vLLM " + vllm : !lcpp.empty() ? "llama.cpp " + lcpp : "";
    row.model = model;
    row.bytes = static_cast<uint64_t>(r.positive_integer("kv_bytes_per_token"));
    row.ppl = r.number("ppl", 0, HUGE_VAL, "a finite positive number");
    row.kld = r.object("kld").number("mean", 0, HUGE_VAL, "a finite number >= 0");
    row.top1 = r.number("top1_agreement", 0, 1, "a fraction between 0 and 1");
    row.baseline_model = model + " (f16 cache)";
    row.baseline_ppl = base_ppl;
    row.text = txt;
    row.tokens = tokens;
    in.outputs.push_back(row);
  }
  ReportRow& ref = in.reference;
  ref.name = "f16 cache (reference)";
  ref.label = "reference";
  ref.model = model;
  ref.ppl = base_ppl;
  ref.kld = 0;
  ref.top1 = 1.0;
  ref.baseline_model = model + " (f16 cache)";
  ref.baseline_ppl = base_ppl;
  ref.text = txt;
  ref.tokens = tokens;
  ref.bytes = static_cast<uint64_t>(top.positive_integer("f16_bytes_per_token"));
  std::stable_sort(in.outputs.begin(), in.outputs.end(),
                   [](const ReportRow& a, const ReportRow& b) { return a.bytes < b.bytes; });
  return in;
}

}  // namespace

ReportInputs load_report_inputs(const std::vector<std::string>& paths) {
  if (paths.empty()) throw Error(ErrorKind::Usage, "report: no inputs; give quantize output folders or eval JSON files");
  for (const std::string& p : paths)
    if (std::optional<ReportInputs> kv = load_kv_sweep(p)) {
      if (paths.size() != 1)
        throw Error(ErrorKind::Usage, "report: a kv-sweep JSON (" + printable_text(p) + ") is charted on its own");
      return *kv;
    }
  ReportInputs in;
  std::vector<std::string> sources;
  for (const std::string& p : paths) {
    in.outputs.push_back(load_one(p, in.read));
    sources.push_back(printable_text(p));
  }
  // One baseline on one text: the chart compares every output with it.
  std::set<std::pair<std::string, std::string>> bases;
  for (const ReportRow& r : in.outputs) bases.insert({r.baseline_model, r.text});
  if (bases.size() != 1) {
    std::string list;
    for (const auto& [model, text] : bases) list += (list.empty() ? "" : ", ") + printable_text(model) + " on " + printable_text(text);
    throw invalid_input("report", "the inputs were evaluated against different baselines or texts: " + list);
  }
  // Perplexities over different tokens (another --ctx, --max-chunks or mode)
  // are not comparable, even on the same text.
  std::set<int64_t> counts;
  for (const ReportRow& r : in.outputs) counts.insert(r.tokens);
  if (counts.size() != 1) {
    std::string list;
    for (size_t i = 0; i < in.outputs.size(); ++i)
      list += (i ? ", " : "") + sources[i] + " " + std::to_string(in.outputs[i].tokens);
    throw invalid_input("report", "the inputs scored different numbers of tokens, so their perplexities are not comparable (" +
                                      list + "); evaluate them all with the same --ctx, --max-chunks and mode");
  }
  const ReportRow& first = in.outputs.front();
  ReportRow& ref = in.reference;
  ref.model = first.baseline_model;
  ref.name = base_name(ref.model) + " (reference)";
  ref.label = "reference";
  ref.ppl = first.baseline_ppl;
  ref.kld = 0;
  ref.top1 = 1.0;
  ref.baseline_model = first.baseline_model;
  ref.baseline_ppl = first.baseline_ppl;
  ref.text = first.text;
  ref.tokens = first.tokens;
  const fs::path base_path = locate_model(ref.model, "the reference");
  in.read.push_back(base_path);
  ref.bytes = model_bytes(base_path);
  std::stable_sort(in.outputs.begin(), in.outputs.end(),
                   [](const ReportRow& a, const ReportRow& b) { return a.bytes < b.bytes; });
  return in;
}

const std::vector<std::string>& report_output_files() {
  static const std::vector<std::string> names = {"chart.png", "index.html", "report.json"};
  return names;
}

namespace {

// The input folder that `out` is, or lies in, or nullptr.
const fs::path* enclosing_input(const fs::path& out, const std::vector<fs::path>& inputs) {
  for (const fs::path& in : inputs)
    if (!in.empty() && is_folder(in) && is_within(out, in)) return &in;
  return nullptr;
}

}  // namespace

void check_report_output(const fs::path& out, const std::vector<fs::path>& inputs, bool force,
                         const std::string& flag) {
  if (out.empty()) throw Error(ErrorKind::Usage, flag + " is empty; give a folder for the report");
  for (const fs::path& in : inputs)
    if (!in.empty() && same_entry(in, out))
      throw io_error(out.string(), flag + " would overwrite an input of this run (" + in.string() +
                                       "); write the report elsewhere");
  if (const fs::path* in = enclosing_input(out, inputs))
    throw io_error(out.string(), flag + " lies inside an input of this run (" + in->string() +
                                     "); write the report elsewhere");
  if (!path_exists(out)) return;  // made when the report is written
  if (!is_folder(out)) throw io_error(out.string(), flag + " is not a folder; give a folder for the report");
  for (const std::string& name : report_output_files()) check_output_file(out / name, inputs, force, false, flag);
}

namespace {

nlohmann::ordered_json row_json(const ReportRow& r, bool reference) {
  nlohmann::ordered_json j = {{"name", r.name}};
  if (reference) j["label"] = r.label;
  j["bytes"] = r.bytes;
  j["ppl"] = r.ppl;
  j["kld"] = r.kld;
  j["top1"] = r.top1 ? nlohmann::ordered_json(*r.top1) : nlohmann::ordered_json();
  if (reference) return j;
  j["baseline_model"] = r.baseline_model;
  j["baseline_ppl"] = r.baseline_ppl;
  j["text"] = r.text;
  j["tokens"] = r.tokens;
  j["label"] = r.label;
  j["series"] = r.series;
  return j;
}

}  // namespace

nlohmann::ordered_json report_rows_json(const ReportInputs& in) {
  nlohmann::ordered_json outputs = nlohmann::ordered_json::array();
  for (const ReportRow& r : in.outputs) outputs.push_back(row_json(r, false));
  return {{"unit", in.unit}, {"reference", row_json(in.reference, true)}, {"outputs", outputs}};
}

}  // namespace qf::eval
