// The vision side quantized on request (calibration/vision_plan.h), part of
// the export stage: each planned vision Linear rounded to nearest from its
// stored weight and written through the checkpoint format, with one report
// entry each.
#include "calibration/quantize_run.h"
#include "calibration/vision_plan.h"
#include "checkpoint/checkpoint_format.h"

namespace qf {

void export_vision_linears(QuantizeRun& r, const Checkpoint& ck, std::set<std::string>& quantized) {
  if (r.vision.empty()) return;
  const CheckpointFormat& format = *r.plan.format;
  r.vision_reports = nlohmann::ordered_json::array();
  int64_t n = 0, fallback = 0;
  for (const VisionLinear& v : r.vision) {
    const std::string name = v.module + ".weight";
    const Tensor t = ck.tensor(name);
    const std::vector<float> w = t.to_f32_vector();
    const QuantizedTensor q = round_to_nearest(w.data(), v.rows, v.cols, v.plan);
    std::optional<ActQuantParams> act;
    if (v.plan.act) act = ActQuantParams{*v.plan.act};  // dynamic: scales are computed per token at run time
    format.add_linear(*r.writer, v.module, q, act ? &*act : nullptr);
    r.written.insert(name);
    quantized.insert(v.module);
    // The weights' relative squared error, as the decoder Linears' report
    // gives it without a Hessian.
    const std::vector<float> wq = q.dequantize();
    double num = 0, den = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      num += (w[i] - wq[i]) * static_cast<double>(w[i] - wq[i]);
      den += static_cast<double>(w[i]) * w[i];
    }
    r.vision_reports.push_back({{"name", ck.naming().module_to_stored(v.module)},
                                {"part", v.part},
                                {"shape", {v.rows, v.cols}},
                                {"weights", q.scheme.describe()},
                                {"activations", act ? nlohmann::ordered_json(act->scheme.describe()) : nlohmann::ordered_json()},
                                {"bits_per_weight", stored_bits_per_weight(q)},
                                {"error", den > 0 ? num / den : 0.0}});
    if (!v.note.empty()) r.vision_reports.back()["note"] = v.note;
    ++n;
    fallback += v.note.empty() ? 0 : 1;
  }
  r.log("vision: " + std::to_string(n) + " Linears quantized by round to nearest" +
        (fallback ? " (" + std::to_string(fallback) + " per output channel)" : ""));
}

}  // namespace qf
