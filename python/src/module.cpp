// The `quantforge._quantforge` extension: the C++ library's commands and the
// runtime as Python calls. python/quantforge/__init__.py re-exports it with
// the progress bars; __init__.pyi documents the API.
//
// Long calls release the GIL. Progress goes through Python bar objects (tqdm
// or a plain fallback, quantforge/_progress.py), and each bar update checks
// for a pending signal, so Ctrl-C raises KeyboardInterrupt there: the C++
// stack unwinds and removes what it had staged, and nothing appears under
// the output name.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibration/activation_store.h"
#include "calibration/imatrix_collect.h"
#include "calibration/quantize_model.h"
#include "checkpoint/lora_merge.h"
#include "convert/gguf_lora.h"
#include "formats/hf/model_tensors.h"
#include "convert/hf_to_gguf.h"
#include "core/error.h"
#include "core/io.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "device/device.h"
#include "eval/bench.h"
#include "eval/eval_run.h"
#include "eval/gate_bounds.h"
#include "eval/kv_sweep.h"
#include "core/text_input.h"
#include "formats/gguf/gguf.h"
#include "formats/hf/resolve.h"
#include "formats/safetensors.h"
#include "formats/tokenizer/tokenizer.h"
#include "mixed/gguf_search.h"
#include "inspect/gguf_inspect.h"
#include "inspect/hf_inspect.h"
#include "quantizers/kquants.h"
#include "runtime/generate.h"
#include "runtime/model.h"
#include "to_python.h"

namespace py = pybind11;
namespace fs = std::filesystem;

namespace qf::python {

void register_report_bindings(py::module_& m);  // report_binding.cpp

namespace {

// ---- errors -----------------------------------------------------------------

// quantforge.Error and one subclass per ErrorKind, created at import.
std::map<ErrorKind, py::handle> g_error_types;

// ---- threads and progress ---------------------------------------------------

ThreadPool& pool_for(std::optional<int> threads, std::unique_ptr<ThreadPool>& holder) {
  if (!threads || *threads == 0) return ThreadPool::global();
  if (*threads < 1 || *threads > ThreadPool::max_threads())
    throw Error(ErrorKind::Usage, "threads must be 1.." + std::to_string(ThreadPool::max_threads()) + ", got " +
                                      std::to_string(*threads));
  holder = std::make_unique<ThreadPool>(*threads);
  return *holder;
}

// A bar of quantforge._progress (tqdm's or the fallback's); every update also
// lets Python run its signal handlers, so Ctrl-C stops the work here.
class PyBar final : public ProgressBar {
 public:
  explicit PyBar(py::object bar) : bar_(std::move(bar)) {}
  ~PyBar() override {
    py::gil_scoped_acquire gil;
    bar_ = py::object();
  }
  void update(uint64_t done) override {
    py::gil_scoped_acquire gil;
    bar_.attr("update_to")(done);
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
  void close() noexcept override {
    py::gil_scoped_acquire gil;
    try {
      bar_.attr("close")();
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("quantforge progress bar close");
    }
  }

 private:
  py::object bar_;
};

// A bar that draws nothing: progress=False, or a bar made where no call of
// this module asked for one.
class SilentBar final : public ProgressBar {
 public:
  void update(uint64_t) override {}
  void close() noexcept override {}
};

// Whether the module call running on this thread wants bars. Progress's quiet
// flag and bar factory are process-wide, and calls on several Python threads
// overlap: one call switching them would silence, or draw into, another's
// bars (and restore the wrong state when the calls end out of order). So the
// module installs one factory, once, that asks the creating thread instead.
thread_local bool t_show_progress = false;

std::unique_ptr<ProgressBar> make_bar(const std::string& label, uint64_t total, const std::string& unit) {
  if (!t_show_progress) return std::make_unique<SilentBar>();
  py::gil_scoped_acquire gil;
  py::object make = py::module_::import("quantforge._progress").attr("make_bar");
  return std::make_unique<PyBar>(make(label, total, unit));
}

// For the duration of one call on this thread: bars through
// quantforge._progress, or none. Nests (a bar's callback may call the module).
class ProgressScope {
 public:
  explicit ProgressScope(bool show) : outer_(t_show_progress) {
    static std::once_flag installed;
    std::call_once(installed, [] { Progress::set_bar_factory(&make_bar); });
    t_show_progress = show;
  }
  ~ProgressScope() { t_show_progress = outer_; }
  ProgressScope(const ProgressScope&) = delete;
  ProgressScope& operator=(const ProgressScope&) = delete;

 private:
  bool outer_;
};

// Lets Python handle pending signals between steps that have no bar.
void check_signals() {
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

// A (done, total) callback that draws one bar, made on the first call.
// A LazyProgress that also lets Ctrl-C stop the work.
struct LazyBar {
  LazyBar(std::string label, std::string unit) : bar(std::move(label), std::move(unit)) {}
  LazyProgress bar;
  void operator()(int64_t done, int64_t total) {
    bar(done, total);
    check_signals();
  }
  void finish() { bar.finish(); }
};

// A path argument (str, bytes or os.PathLike) as the bytes the file system
// sees: os.fsencode, so bytes pass through unchanged and a str holding
// undecodable bytes (surrogateescape, as os.listdir returns them) maps back
// to them. A str that has no such bytes is a UsageError naming the argument;
// any other type is os.fsencode's TypeError.
std::string path_arg(const py::object& o, const char* name) {
  py::object encoded;
  try {
    encoded = py::module_::import("os").attr("fsencode")(o);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_UnicodeError)) throw;
    throw Error(ErrorKind::Usage, std::string(name) + ": not a valid file name: " + py::str(e.value()).cast<std::string>());
  }
  return encoded.cast<std::string>();
}
std::optional<std::string> opt_path(const py::object& o, const char* name) {
  if (o.is_none()) return std::nullopt;
  return path_arg(o, name);
}

// ---- commands -----------------------------------------------------------------

py::object cmd_inspect(const py::object& model, const std::string& revision) {
  const std::string m = path_arg(model, "model");
  nlohmann::json info;
  {
    py::gil_scoped_release nogil;
    const fs::path p(m);
    info = fs::is_regular_file(p) && p.extension() == ".gguf" ? inspect_gguf(p) : inspect_model(m, revision);
  }
  return to_python(info);
}

// `lora`: None, one adapter ("DIR", "DIR:SCALE", a path) or a list of them,
// or of (path, scale) pairs; applied in order.
std::vector<LoraSpec> lora_specs(const py::object& lora, const std::string& arg = "lora") {
  std::vector<LoraSpec> out;
  if (lora.is_none()) return out;
  auto one = [&](const py::handle& h) {
    if (py::isinstance<py::tuple>(h)) {
      const py::tuple t = py::reinterpret_borrow<py::tuple>(h);
      if (t.size() != 2) throw Error(ErrorKind::Usage, arg + ": a pair is (path, scale)");
      LoraSpec s{path_arg(py::reinterpret_borrow<py::object>(t[0]), arg.c_str()), t[1].cast<double>()};
      if (!std::isfinite(s.scale)) throw Error(ErrorKind::Usage, arg + ": the scale must be finite");
      out.push_back(s);
    } else {
      out.push_back(parse_lora_spec(path_arg(py::reinterpret_borrow<py::object>(h), arg.c_str()), arg));
    }
  };
  // A list holds adapters; a tuple is one (path, scale) pair.
  if (py::isinstance<py::list>(lora)) {
    for (const py::handle& h : lora) one(h);
  } else {
    one(lora);
  }
  return out;
}

rt::LoraLoad lora_load(const py::object& lora, const std::string& mode, const std::string& arg = "lora") {
  return rt::LoraLoad{lora_specs(lora, arg), rt::parse_lora_mode(mode, arg + "_mode")};
}

py::object cmd_merge(const py::object& model, const py::object& out, const py::object& lora) {
  const std::string m = path_arg(model, "model"), o = path_arg(out, "out");
  const std::vector<LoraSpec> specs = lora_specs(lora);
  nlohmann::ordered_json j;
  {
    py::gil_scoped_release nogil;
    const ResolvedModel rm = resolve_model(m);
    const MergeResult r = write_merged_model(rm.dir, specs, o);
    j = {{"path", r.path.string()}, {"tensors", r.tensors}, {"merged", r.merged}, {"bytes", r.bytes},
         {"lora", lora_provenance(specs)}};
  }
  return to_python(j);
}

py::object cmd_convert_lora(const py::object& adapter, const py::object& base, const py::object& out,
                            const std::string& type, bool force) {
  const std::string a = path_arg(adapter, "adapter"), b = path_arg(base, "base"), o = path_arg(out, "out");
  const DType dt = parse_gguf_lora_type(type, "type");
  nlohmann::ordered_json j;
  {
    py::gil_scoped_release nogil;
    const LoraSpec spec = parse_lora_spec(a, "adapter");
    const ResolvedModel rm = resolve_model(b);
    check_output_file(o, {spec.path, rm.dir}, force, false, "out");
    const GgufLoraResult r = write_gguf_lora(spec, rm.dir, o, dt);
    j = {{"path", r.path.string()}, {"alpha", r.alpha}, {"tensors", r.tensors}, {"rescaled", r.rescaled}, {"bytes", r.bytes}};
  }
  return to_python(j);
}

py::object cmd_evaluate(const py::object& model, const py::object& text, const py::object& baseline, int64_t ctx,
                    const std::string& mode, int64_t max_chunks, const std::string& kv_dtype, bool bos_per_line,
                    bool keep_tail, std::optional<double> max_ppl_delta, std::optional<double> max_ppl_ratio,
                    std::optional<double> max_kld, std::optional<int> threads, bool progress, const std::string& device,
                    const std::string& kv_k_dtype, const std::string& kv_v_dtype, const std::string& kv_rotation,
                    const std::string& baseline_kv_dtype, const py::object& lora, const std::string& lora_mode,
                    const py::object& baseline_lora, const std::string& baseline_lora_mode) {
  eval::EvalRequest req;
  req.lora = lora_load(lora, lora_mode);
  req.baseline_lora = lora_load(baseline_lora, baseline_lora_mode, "baseline_lora");
  // A NaN or infinite bound compares false against every measurement: it
  // would pass every model instead of gating it.
  req.gate = eval::Gate{max_ppl_delta, max_ppl_ratio, max_kld};
  eval::check_gate_bounds(req.gate);
  req.device = device;
  device::resolve(device, "evaluate device");
  if (threads) device::set_host_threads(*threads);
  req.model = path_arg(model, "model");
  req.text = path_arg(text, "text");
  req.baseline = opt_path(baseline, "baseline").value_or("");
  req.kv = kv_dtype, req.kv_k = kv_k_dtype, req.kv_v = kv_v_dtype, req.kv_rotation = kv_rotation;
  req.baseline_kv = baseline_kv_dtype;
  req.kv_format();  // a bad name is a usage error before any work
  req.ppl.mode = eval::parse_ppl_mode(mode);
  if (ctx != 0 && ctx < 2) throw Error(ErrorKind::Usage, "ctx must be at least 2, got " + std::to_string(ctx));
  if (max_chunks < 0) throw Error(ErrorKind::Usage, "max_chunks must be >= 0, got " + std::to_string(max_chunks));
  req.ppl.ctx = ctx;
  req.ppl.max_spans = max_chunks;
  req.ppl.bos_per_line = bos_per_line;
  req.ppl.keep_tail = keep_tail;
  nlohmann::ordered_json report;
  {
    ProgressScope scope(progress);
    py::gil_scoped_release nogil;
    std::unique_ptr<ThreadPool> holder;
    ThreadPool& pool = pool_for(threads, holder);
    LazyBar bar{"eval", "spans"};
    const eval::EvalRun run = eval::run_eval(req, pool, std::ref(bar));
    bar.finish();
    report = run.report;
  }
  // A failed gate is reported in the result ("gate": {"passed": false}), as
  // `eval --json` writes it; the caller decides what to do with it.
  return to_python(report);
}

py::object cmd_kv_sweep(const py::object& model, const py::object& text, int64_t ctx, const std::string& mode,
                        int64_t max_chunks, std::optional<double> max_kld, const std::vector<std::string>& types,
                        int64_t decode_tokens, std::optional<int> threads, bool progress) {
  const std::string m = path_arg(model, "model"), t = path_arg(text, "text");
  if (max_chunks < 1) throw Error(ErrorKind::Usage, "max_chunks must be >= 1, got " + std::to_string(max_chunks));
  if (decode_tokens < 0) throw Error(ErrorKind::Usage, "decode_tokens must be >= 0");
  eval::KvSweepOptions so;
  so.ppl.mode = eval::parse_ppl_mode(mode);
  so.ppl.max_spans = max_chunks;
  so.max_kld = max_kld;
  so.decode_tokens = decode_tokens;
  for (const std::string& name : types) so.formats.push_back(rt::parse_kv_format_name(name));
  nlohmann::ordered_json j;
  {
    ProgressScope scope(progress);
    py::gil_scoped_release nogil;
    std::unique_ptr<ThreadPool> holder;
    ThreadPool& pool = pool_for(threads, holder);
    const std::string body = read_text_input(t);
    std::unique_ptr<rt::Model> mdl = rt::load_model(m);
    std::unique_ptr<Tokenizer> tok = load_tokenizer(mdl->source());
    so.ppl.ctx = ctx > 0 ? ctx : (mdl->max_context() > 0 ? std::min<int64_t>(mdl->max_context(), 2048) : 2048);
    const std::vector<eval::Span> spans = eval::make_spans(*tok, body, so.ppl, mdl->max_context(), t);
    LazyBar bar{"kv-sweep", "formats"};
    const eval::KvSweepResult r = eval::kv_sweep(*mdl, spans, so, pool, std::ref(bar));
    bar.finish();
    j = eval::kv_sweep_report(m, t, so, r);
  }
  return to_python(j);
}

py::object cmd_bench(const py::object& model, int64_t prompt, int64_t gen, int64_t batch, const std::string& kv_dtype,
                 int reps, std::optional<int> threads, const std::string& device, const py::object& lora,
                 const std::string& lora_mode) {
  const rt::LoraLoad ll = lora_load(lora, lora_mode);
  const std::string m = path_arg(model, "model");
  const device::Kind kind = device::resolve(device, "bench device");
  if (threads) device::set_host_threads(*threads);
  if (prompt < 1 || gen < 0 || batch < 1 || reps < 1)
    throw Error(ErrorKind::Usage, "prompt >= 1, gen >= 0, batch >= 1 and reps >= 1 are required");
  nlohmann::ordered_json j;
  {
    py::gil_scoped_release nogil;
    std::unique_ptr<ThreadPool> holder;
    ThreadPool& pool = pool_for(threads, holder);
    std::unique_ptr<rt::Model> mdl = rt::load_model(m, kind, ll);
    eval::BenchOptions b;
    b.prompt = prompt, b.gen = gen, b.batch = batch, b.reps = reps, b.kv_dtype = rt::parse_kv_format(kv_dtype);
    b.device = kind;
    const eval::BenchResult r = eval::run_bench(*mdl, b, pool);
    j = eval::bench_report(m, *mdl, r);
  }
  return to_python(j);
}

py::object cmd_convert(const py::object& model, const py::object& out, const std::optional<std::string>& type,
                       const py::object& imatrix, bool force, bool allow_nonfinite, std::optional<int> threads, bool progress,
                       const std::optional<std::string>& output_tensor_type,
                       const std::optional<std::string>& token_embedding_type, std::optional<double> target_bpw,
                       const std::optional<std::string>& target_size, const py::object& calib,
                       const std::optional<std::string>& types, bool dry_run, const py::object& json_out,
                       const py::object& sensitivity, int64_t probe_spans, int64_t max_probes,
                       const py::object& lora) {
  const std::vector<LoraSpec> loras = lora_specs(lora);
  const std::string m = path_arg(model, "model"), o = path_arg(out, "out");
  const std::string im = opt_path(imatrix, "imatrix").value_or("");
  const std::string cal = opt_path(calib, "calib").value_or(""), js = opt_path(json_out, "json").value_or("");
  const std::string sens = opt_path(sensitivity, "sensitivity").value_or("");
  const bool budget = target_bpw || target_size;
  if (!budget && (!cal.empty() || types || dry_run || !js.empty() || !sens.empty()))
    throw Error(ErrorKind::Usage, "calib, types, sensitivity, dry_run and json apply to a size budget (target_bpw or target_size)");
  if (budget && (type || output_tensor_type || token_embedding_type))
    throw Error(ErrorKind::Usage, "type, output_tensor_type and token_embedding_type do not combine with a size budget (restrict types instead)");
  if (probe_spans < 1 || max_probes < 0) throw Error(ErrorKind::Usage, "probe_spans must be at least 1 and max_probes at least 0");
  nlohmann::ordered_json j;
  std::vector<std::string> notes;
  {
    ProgressScope scope(progress);
    py::gil_scoped_release nogil;
    std::unique_ptr<ThreadPool> holder;
    ThreadPool& pool = pool_for(threads, holder);
    GgufConvertOptions g;
    g.preset = type.value_or("Q4_K_M");
    g.imatrix = im;
    g.allow_nonfinite = allow_nonfinite;
    g.loras = loras;
    if (output_tensor_type) g.overrides.output = gguf_mix::parse_tensor_type(*output_tensor_type, "output_tensor_type");
    if (token_embedding_type)
      g.overrides.token_embd = gguf_mix::parse_tensor_type(*token_embedding_type, "token_embedding_type");
    g.note = [&notes](const std::string& s) { notes.push_back(s); };
    mixed::GgufMixOptions mo;
    if (budget) {
      mo.target_bpw = target_bpw;
      if (target_size) mo.target_bytes = parse_memory_size(*target_size, "target_size");
      if (types) mo.types = mixed::parse_gguf_menu(*types, "types");
    }
    const ResolvedModel rm = resolve_model(m);
    if (!dry_run) check_output_file(o, {rm.dir, im, cal, sens}, force, false, "out");
    std::filesystem::path plan_json = js;
    if (budget && plan_json.empty() && !dry_run) plan_json = std::filesystem::path(o).replace_extension(".mix.json");
    if (!plan_json.empty()) check_output_file(plan_json, {rm.dir, im, cal, sens, o}, force, false, "json");
    if (budget) {
      mo.imatrix = im;
      mo.calib_text = cal;
      mo.probe_spans = probe_spans;
      mo.max_probes = max_probes;
      mo.note = g.note;
      mo.loras = loras;
      const mixed::GgufMixPlan plan = mixed::plan_for_budget(rm.dir, mo, sens, pool);
      j["plan"] = mixed::gguf_mix_json(plan);
      if (!plan_json.empty()) write_output_file(plan_json, j["plan"].dump(2) + "\n");
      mixed::apply_plan(plan, g);
    }
    // A dry run returns the plan (and its notes) alone; Python objects are
    // made below, with the GIL held again.
    if (dry_run) {
      j["notes"] = notes;
    } else {
      const GgufConvertResult r = convert_hf_to_gguf(rm.dir, o, g, pool);
      nlohmann::ordered_json tt = nlohmann::ordered_json::object();
      for (const auto& [name, t] : r.types) tt[name] = ggml_type_info(t) ? ggml_type_info(t)->name : std::to_string(t);
      j["path"] = r.path.string();
      j["type"] = g.preset;
      j["input_bytes"] = r.input_bytes;
      j["output_bytes"] = r.output_bytes;
      j["parameters"] = r.parameters;
      j["bits_per_weight"] = r.parameters ? 8.0 * static_cast<double>(r.output_bytes) / static_cast<double>(r.parameters) : 0.0;
      j["seconds"] = r.seconds;
      j["tensor_types"] = tt;
      j["notes"] = notes;
      if (!plan_json.empty()) j["plan_path"] = plan_json.string();
    }
  }
  return to_python(j);
}

py::object cmd_imatrix(const py::object& model, const py::object& text, const py::object& out, int64_t ctx, int64_t chunks,
                   bool process_output, bool force, bool allow_nonfinite, std::optional<int> threads, bool progress,
                   const std::string& device, const py::object& lora, const std::string& lora_mode) {
  const std::string m = path_arg(model, "model"), t = path_arg(text, "text"), o = path_arg(out, "out");
  const rt::LoraLoad ll = lora_load(lora, lora_mode);
  const device::Kind kind = device::resolve(device, "imatrix device");
  if (threads) device::set_host_threads(*threads);
  if (ctx < 2) throw Error(ErrorKind::Usage, "ctx must be at least 2, got " + std::to_string(ctx));
  if (chunks < 0) throw Error(ErrorKind::Usage, "chunks must be >= 0, got " + std::to_string(chunks));
  nlohmann::ordered_json j;
  {
    ProgressScope scope(progress);
    py::gil_scoped_release nogil;
    std::unique_ptr<ThreadPool> holder;
    ThreadPool& pool = pool_for(threads, holder);
    ImatrixOptions io;
    io.ctx = ctx;
    io.max_chunks = chunks;
    io.process_output = process_output;
    io.device = kind;
    io.lora = ll;
    LazyBar bar{"imatrix", "chunks"};
    const Imatrix im = write_imatrix_from_text(m, t, o, "out", io, force, allow_nonfinite, pool, std::ref(bar));
    bar.finish();
    j = {{"path", o}, {"entries", im.entries.size()}, {"chunks", im.chunk_count}, {"chunk_size", im.chunk_size}};
  }
  return to_python(j);
}

py::object cmd_quantize(const py::object& model, const py::object& recipe_path, const py::object& out,
                    const py::object& calib, std::optional<int> threads, uint64_t max_memory, bool allow_nonfinite,
                    bool progress, const py::object& eval_text, int64_t eval_max_chunks,
                    const std::string& invocation, bool copy_calibration, bool resume, const std::string& device,
                    const py::object& lora) {
  if (eval_max_chunks < 0) throw Error(ErrorKind::Usage, "eval_max_chunks must be >= 0");
  QuantizeJob job;
  job.device = device::resolve(device, "quantize device");
  if (threads) device::set_host_threads(*threads);
  job.model = path_arg(model, "model");
  job.recipe = path_arg(recipe_path, "recipe");
  job.out = path_arg(out, "out");
  job.calib = path_arg(calib, "calib");
  const std::string text = path_arg(eval_text, "eval_text");
  job.max_memory_bytes = max_memory;
  job.allow_nonfinite = allow_nonfinite;
  job.invocation = invocation;
  job.copy_calibration = copy_calibration;
  job.resume = resume;
  job.loras = lora_specs(lora);
  std::vector<std::string> lines;
  QuantizeSummary s;
  double seconds = 0;
  {
    ProgressScope scope(progress);
    py::gil_scoped_release nogil;
    std::unique_ptr<ThreadPool> holder;
    ThreadPool& pool = pool_for(threads, holder);
    LazyBar bar{"quantize", "layers"};
    job.on_layer = std::ref(bar);
    LazyBar eval_bar{"eval", "spans"};
    job.eval_text = text;
    job.eval_max_chunks = eval_max_chunks;
    job.eval_progress = std::ref(eval_bar);
    s = quantize_model(job, pool, [&lines](const std::string& line) {
      lines.push_back(line);
      check_signals();
    });
    bar.finish();
    eval_bar.finish();
    seconds = s.seconds;
  }
  nlohmann::ordered_json j = {{"path", job.out.string()},
                              {"format", s.format},
                              {"method", s.method},
                              {"linears", s.linears},
                              {"layers", s.layers},
                              {"samples", s.samples},
                              {"tokens", s.tokens},
                              {"seconds", seconds},
                              {"mean_error", s.mean_error},
                              {"max_error", s.max_error},
                              {"output_bytes", s.output_bytes},
                              {"peak_rss_bytes", s.peak_rss_bytes},
                              {"spilled", s.spilled},
                              {"log", lines}};
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const QuantizedLayerRecord& r : s.per_layer)
    layers.push_back({{"layer", r.layer}, {"linears", r.linears}, {"seconds", r.seconds}, {"mean_error", r.mean_error},
                      {"max_error", r.max_error}});
  j["per_layer"] = layers;
  j["report"] = s.report;
  return to_python(j);
}

// ---- Model and Tokenizer ----------------------------------------------------

const char* numpy_dtype(DType d) {
  switch (d) {
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::F64: return "float64";
    case DType::I8: return "int8";
    case DType::U8: return "uint8";
    case DType::I16: return "int16";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::U16: return "uint16";
    case DType::U32: return "uint32";
    case DType::U64: return "uint64";
    case DType::BOOL: return "bool";
    case DType::BF16: return "uint16";  // NumPy has no bfloat16: the raw bits
    default: return nullptr;
  }
}

// A read-only NumPy array over `data`, kept alive by `owner`.
py::array readonly_view(const char* dtype, const std::vector<int64_t>& shape, const void* data,
                        std::shared_ptr<const void> owner) {
  auto* keep = new std::shared_ptr<const void>(std::move(owner));
  py::capsule base(keep, [](void* p) { delete static_cast<std::shared_ptr<const void>*>(p); });
  py::array a(py::dtype(dtype), std::vector<py::ssize_t>(shape.begin(), shape.end()), data, base);
  a.attr("flags").attr("writeable") = false;
  return a;
}

class PyTokenizer {
 public:
  explicit PyTokenizer(const py::object& model) {
    const std::string m = path_arg(model, "model");
    py::gil_scoped_release nogil;
    const fs::path p(m);
    source_ = fs::is_regular_file(p) ? p : resolve_model(m).dir;
    tok_ = load_tokenizer(source_);
  }
  std::vector<int32_t> encode(const std::string& text, bool add_bos) const { return tok_->encode(text, add_bos); }
  std::string decode(const std::vector<int32_t>& ids) const {
    const int64_t n = static_cast<int64_t>(tok_->vocab().tokens.size());
    for (int32_t id : ids)
      if (id < 0 || id >= n)
        throw invalid_input("decode", "token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                                          std::to_string(n - 1) + ")");
    return tok_->decode(ids);
  }
  int64_t vocab_size() const { return static_cast<int64_t>(tok_->vocab().tokens.size()); }
  const Tokenizer& get() const { return *tok_; }

 private:
  fs::path source_;
  std::unique_ptr<Tokenizer> tok_;
};

class PyModel {
 public:
  explicit PyModel(const py::object& model) : arg_(path_arg(model, "model")) {
    py::gil_scoped_release nogil;
    const fs::path p(arg_);
    if (fs::is_regular_file(p) && p.extension() == ".gguf") {
      gguf_ = std::make_shared<GgufFile>(GgufFile::open(p));
      source_ = p;
    } else {
      source_ = resolve_model(arg_).dir;
      checkpoint_ = std::make_shared<Checkpoint>(Checkpoint::open(source_));
      apply_hf_tensor_naming(load_model_config(source_), *checkpoint_);
    }
  }

  py::object config() {
    const rt::Model& m = runtime();
    if (!m.config().raw.is_null() && !m.config().raw.empty()) return to_python(m.config().raw);
    const ModelConfig& c = m.config();
    nlohmann::json j = {{"model_type", c.model_type},
                        {"hidden_size", c.hidden_size},
                        {"intermediate_size", c.intermediate_size},
                        {"num_hidden_layers", c.num_hidden_layers},
                        {"num_attention_heads", c.num_attention_heads},
                        {"num_key_value_heads", c.num_key_value_heads},
                        {"head_dim", c.head_dim},
                        {"vocab_size", c.vocab_size},
                        {"max_position_embeddings", c.max_position_embeddings}};
    if (c.is_moe()) {  // a GGUF mixture-of-experts model
      j["num_experts"] = c.num_experts;
      j["num_experts_per_tok"] = c.num_experts_per_tok;
      j["moe_intermediate_size"] = c.moe_intermediate_size;
      if (c.shared_expert_intermediate_size) j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
    }
    return to_python(j);
  }

  std::vector<std::string> tensor_names() const {
    if (checkpoint_) return checkpoint_->names();
    std::vector<std::string> n;
    for (const auto& t : gguf_->tensors()) n.push_back(t.name);
    return n;
  }

  // Zero-copy for f32/f16 (and bf16 as raw uint16 bits); dequantize=True gives
  // float32 copies of anything, quantized GGUF blocks included.
  py::array tensor(const std::string& name, bool dequantize) const {
    if (checkpoint_) {
      const Tensor t = checkpoint_->tensor(name);
      std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
      if (dequantize && t.dtype() != DType::F32) {
        auto owned = std::make_shared<std::vector<float>>(t.to_f32_vector());
        return readonly_view("float32", shape, owned->data(), owned);
      }
      const char* dt = numpy_dtype(t.dtype());
      if (!dt) throw unsupported(name, std::string("dtype ") + dtype_name(t.dtype()) + " has no NumPy view; pass dequantize=True");
      return readonly_view(dt, shape, t.data(), std::shared_ptr<const void>(checkpoint_, t.data()));
    }
    const GgufTensorInfo* info = gguf_->find_tensor(name);
    if (!info) throw not_found(gguf_->path().string(), "no tensor '" + name + "'");
    std::vector<int64_t> shape(info->dims.rbegin(), info->dims.rend());  // row-major: ggml's ne reversed
    const uint8_t* data = gguf_->tensor_data(*info);
    const int64_t row = static_cast<int64_t>(info->dims.empty() ? 1 : info->dims[0]);
    const int64_t rows = static_cast<int64_t>(info->numel()) / std::max<int64_t>(1, row);
    if (!dequantize) {
      if (info->type == ggml_type::F32 || info->type == ggml_type::F16)
        return readonly_view(info->type == ggml_type::F32 ? "float32" : "float16", shape, data,
                             std::shared_ptr<const void>(gguf_, data));
      const char* tn = ggml_type_info(info->type) ? ggml_type_info(info->type)->name : "quantized";
      throw unsupported(name, std::string("a ") + tn + " tensor is quantized; pass dequantize=True for float32 values");
    }
    auto owned = std::make_shared<std::vector<float>>(static_cast<size_t>(info->numel()));
    const size_t rs = kquants::row_size(info->type, row);
    for (int64_t r = 0; r < rows; ++r)
      kquants::dequantize_row(info->type, data + static_cast<size_t>(r) * rs, owned->data() + r * row, row);
    return readonly_view("float32", shape, owned->data(), owned);
  }

  // Logits of every position of one sequence: [len(ids), vocab] float32.
  py::array logits(const std::vector<int32_t>& ids, std::optional<int> threads) {
    if (ids.empty()) throw invalid_input("logits", "no token ids");
    const rt::Model& m = runtime();
    for (int32_t id : ids)
      if (id < 0 || id >= m.vocab_size())
        throw invalid_input("logits", "token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                                          std::to_string(m.vocab_size() - 1) + ")");
    const int64_t n = static_cast<int64_t>(ids.size());
    if (m.max_context() > 0 && n > m.max_context())
      throw invalid_input("logits", std::to_string(n) + " tokens exceed the model's context of " +
                                        std::to_string(m.max_context()));
    auto out = std::make_shared<std::vector<float>>();
    {
      py::gil_scoped_release nogil;
      std::unique_ptr<ThreadPool> holder;
      ThreadPool& pool = pool_for(threads, holder);
      rt::KvCache cache = m.make_cache(rt::KvDType::F16, n);
      const int32_t seq = cache.add_sequence();
      cache.reserve(seq, n);
      rt::Batch b;
      for (int64_t i = 0; i < n; ++i) b.add(ids[static_cast<size_t>(i)], seq, i, true);
      m.forward(b, cache, *out, pool);
    }
    py::array a = readonly_view("float32", {n, m.vocab_size()}, out->data(), out);
    return a;
  }

  py::dict generate(const std::string& prompt, int64_t n, float temperature, float top_p, uint64_t seed,
                    std::optional<int> threads) {
    if (n < 0) throw Error(ErrorKind::Usage, "n must be >= 0, got " + std::to_string(n));
    if (!(temperature >= 0)) throw Error(ErrorKind::Usage, "temperature must be >= 0");
    if (!(top_p > 0 && top_p <= 1)) throw Error(ErrorKind::Usage, "top_p must be in (0, 1]");
    const rt::Model& m = runtime();
    const Tokenizer& tok = tokenizer();
    rt::GenerateResult r;
    std::string text;
    {
      py::gil_scoped_release nogil;
      std::unique_ptr<ThreadPool> holder;
      ThreadPool& pool = pool_for(threads, holder);
      rt::GenerateOptions o;
      o.max_new_tokens = n;
      o.sampler.temperature = temperature;
      o.sampler.top_p = top_p;
      o.sampler.seed = seed;
      r = rt::generate(m, tok, prompt, o, pool, [&](const std::string& piece) {
        text += piece;
        check_signals();
      });
    }
    // The continuation alone: the decoded prompt + continuation less the
    // decoded prompt (decoding the new tokens alone would drop a leading space).
    std::vector<int32_t> ids = r.prompt;
    ids.insert(ids.end(), r.generated.begin(), r.generated.end());
    const std::string full = tok.decode(ids), head = tok.decode(r.prompt);
    const std::string completion = full.rfind(head, 0) == 0 ? full.substr(head.size()) : tok.decode(r.generated);
    py::dict d;
    d["text"] = py::bytes(text).attr("decode")("utf-8", "replace");  // prompt and continuation, as the CLI prints
    d["completion"] = py::bytes(completion).attr("decode")("utf-8", "replace");
    d["prompt_tokens"] = r.prompt;
    d["tokens"] = r.generated;
    d["stopped"] = r.stopped;
    d["prefill_seconds"] = r.prefill_seconds;
    d["decode_seconds"] = r.decode_seconds;
    return d;
  }

  std::string source() const { return source_.string(); }

 private:
  // The runtime and the tokenizer are loaded on first use, once: threads
  // that ask meanwhile wait for that load (with the GIL released, since the
  // loading thread may need it), then share the result. After loading both
  // are only read: rt::Model::forward is const and keeps its state in the
  // KvCache and scratch buffers of the calling thread, so calls on several
  // threads run at the same time.
  const rt::Model& runtime() {
    load(false);
    return *model_;
  }
  const Tokenizer& tokenizer() {
    load(true);
    return *tok_;
  }
  void load(bool with_tokenizer) {
    if (loaded_model_.load(std::memory_order_acquire) && (!with_tokenizer || loaded_tok_.load(std::memory_order_acquire)))
      return;
    // Reached again from the loading thread itself (a progress callback that
    // uses this model): waiting would never end.
    if (loader_.load() == std::this_thread::get_id())
      throw Error(ErrorKind::Usage, "Model: used from the thread that is still loading it");
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(load_mu_);
    struct Loader {
      std::atomic<std::thread::id>& id;
      explicit Loader(std::atomic<std::thread::id>& i) : id(i) { id = std::this_thread::get_id(); }
      ~Loader() { id = std::thread::id(); }
    } loader(loader_);
    if (!model_) {
      model_ = rt::load_model(arg_);
      loaded_model_.store(true, std::memory_order_release);
    }
    if (with_tokenizer && !tok_) {
      tok_ = load_tokenizer(model_->source());
      loaded_tok_.store(true, std::memory_order_release);
    }
  }

  std::string arg_;
  fs::path source_;
  std::shared_ptr<Checkpoint> checkpoint_;
  std::shared_ptr<GgufFile> gguf_;
  std::mutex load_mu_;
  std::atomic<std::thread::id> loader_{};
  std::atomic<bool> loaded_model_{false}, loaded_tok_{false};
  std::unique_ptr<rt::Model> model_;  // set once under load_mu_, then never replaced
  std::unique_ptr<Tokenizer> tok_;
};

}  // namespace
}  // namespace qf::python

PYBIND11_MODULE(_quantforge, m) {
  using namespace qf;
  using namespace qf::python;
  m.doc() = "quantforge: offline LLM quantization and model conversion (C++ library bindings)";
  m.attr("__version__") = QF_VERSION;

  // Exceptions: quantforge.Error, and one subclass per kind of error.
  static py::exception<Error> base(m, "Error");
  struct KindType {
    ErrorKind kind;
    const char* name;
    PyObject* extra_base;
  };
  const KindType kinds[] = {{ErrorKind::Internal, "InternalError", nullptr},
                            {ErrorKind::Usage, "UsageError", PyExc_ValueError},
                            {ErrorKind::InvalidInput, "InvalidInput", PyExc_ValueError},
                            {ErrorKind::Unsupported, "Unsupported", nullptr},
                            {ErrorKind::Io, "IoError", PyExc_OSError},
                            {ErrorKind::NotFound, "NotFound", nullptr},
                            {ErrorKind::GateFailed, "GateFailed", nullptr}};
  for (const KindType& k : kinds) {
    PyObject* bases = k.extra_base ? PyTuple_Pack(2, base.ptr(), k.extra_base) : PyTuple_Pack(1, base.ptr());
    const std::string full = std::string("quantforge.") + k.name;
    PyObject* t = PyErr_NewException(full.c_str(), bases, nullptr);
    Py_DECREF(bases);
    if (!t) throw py::error_already_set();
    m.add_object(k.name, py::handle(t));
    g_error_types[k.kind] = py::handle(t);
  }
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      auto it = g_error_types.find(e.kind());
      PyErr_SetString(it != g_error_types.end() ? it->second.ptr() : base.ptr(), e.what());
    } catch (const std::bad_alloc&) {
      PyErr_SetString(PyExc_MemoryError, "out of memory");
    }
  });

  m.def("inspect", &cmd_inspect, py::arg("model"), py::arg("revision") = "main");
  m.def("evaluate", &cmd_evaluate, py::arg("model"), py::arg("text"), py::arg("baseline") = py::none(),
        py::arg("ctx") = 0, py::arg("mode") = "chunks", py::arg("max_chunks") = 0, py::arg("kv_dtype") = "f16",
        py::arg("bos_per_line") = false, py::arg("keep_tail") = false, py::arg("max_ppl_delta") = py::none(),
        py::arg("max_ppl_ratio") = py::none(), py::arg("max_kld") = py::none(), py::arg("threads") = py::none(),
        py::arg("progress") = true, py::arg("device") = "cpu", py::arg("kv_k_dtype") = "", py::arg("kv_v_dtype") = "",
        py::arg("kv_rotation") = "none", py::arg("baseline_kv_dtype") = "f16", py::arg("lora") = py::none(),
        py::arg("lora_mode") = "auto", py::arg("baseline_lora") = py::none(), py::arg("baseline_lora_mode") = "auto");
  m.def("kv_sweep", &cmd_kv_sweep, py::arg("model"), py::arg("text"), py::arg("ctx") = 0, py::arg("mode") = "windows",
        py::arg("max_chunks") = 4, py::arg("max_kld") = py::none(), py::arg("types") = std::vector<std::string>{},
        py::arg("decode_tokens") = 32, py::arg("threads") = py::none(), py::arg("progress") = true);
  m.def("bench", &cmd_bench, py::arg("model"), py::arg("prompt") = 512, py::arg("gen") = 128, py::arg("batch") = 1,
        py::arg("kv_dtype") = "f16", py::arg("reps") = 1, py::arg("threads") = py::none(), py::arg("device") = "cpu",
        py::arg("lora") = py::none(), py::arg("lora_mode") = "auto");
  m.def("convert", &cmd_convert, py::arg("model"), py::arg("out"), py::arg("type") = py::none(),
        py::arg("imatrix") = py::none(), py::arg("force") = false, py::arg("allow_nonfinite") = false,
        py::arg("threads") = py::none(), py::arg("progress") = true, py::arg("output_tensor_type") = py::none(),
        py::arg("token_embedding_type") = py::none(), py::arg("target_bpw") = py::none(),
        py::arg("target_size") = py::none(), py::arg("calib") = py::none(), py::arg("types") = py::none(),
        py::arg("dry_run") = false, py::arg("json") = py::none(), py::arg("sensitivity") = py::none(),
        py::arg("probe_spans") = 4, py::arg("max_probes") = 64, py::arg("lora") = py::none());
  m.def("merge", &cmd_merge, py::arg("model"), py::arg("out"), py::arg("lora"));
  m.def("convert_lora", &cmd_convert_lora, py::arg("adapter"), py::arg("base"), py::arg("out"), py::arg("type") = "F16",
        py::arg("force") = false);
  m.def("imatrix", &cmd_imatrix, py::arg("model"), py::arg("text"), py::arg("out"), py::arg("ctx") = 512,
        py::arg("chunks") = 0, py::arg("process_output") = false, py::arg("force") = false,
        py::arg("allow_nonfinite") = false, py::arg("threads") = py::none(), py::arg("progress") = true,
        py::arg("device") = "cpu", py::arg("lora") = py::none(), py::arg("lora_mode") = "auto");
  m.def("_quantize", &cmd_quantize, py::arg("model"), py::arg("recipe_path"), py::arg("out"), py::arg("calib") = "",
        py::arg("threads") = py::none(), py::arg("max_memory") = 0, py::arg("allow_nonfinite") = false,
        py::arg("progress") = true, py::arg("eval_text") = "", py::arg("eval_max_chunks") = 0, py::arg("invocation") = "",
        py::arg("copy_calibration") = false, py::arg("resume") = false, py::arg("device") = "cpu",
        py::arg("lora") = py::none());
  m.def("_parse_memory_size", [](const std::string& s) { return parse_memory_size(s, "max_memory"); });

  py::class_<PyTokenizer>(m, "Tokenizer")
      .def(py::init<const py::object&>(), py::arg("model"))
      .def("encode", &PyTokenizer::encode, py::arg("text"), py::arg("add_bos") = true)
      .def("decode", &PyTokenizer::decode, py::arg("ids"))
      .def_property_readonly("vocab_size", &PyTokenizer::vocab_size);

  py::class_<PyModel>(m, "Model")
      .def(py::init<const py::object&>(), py::arg("model"))
      .def_property_readonly("config", &PyModel::config)
      .def_property_readonly("source", &PyModel::source)
      .def("tensor_names", &PyModel::tensor_names)
      .def("tensor", &PyModel::tensor, py::arg("name"), py::arg("dequantize") = false)
      .def("logits", &PyModel::logits, py::arg("token_ids"), py::arg("threads") = py::none())
      .def("generate", &PyModel::generate, py::arg("prompt"), py::arg("n") = 32, py::arg("temperature") = 0.0f,
           py::arg("top_p") = 1.0f, py::arg("seed") = 0, py::arg("threads") = py::none());

  register_report_bindings(m);
}
