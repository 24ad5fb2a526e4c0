#include "checkpoint/checkpoint_format.h"

#include "core/did_you_mean.h"
#include "core/error.h"

namespace qf {

// Each format's one instance, defined in its own file.
const CheckpointFormat& compressed_tensors_checkpoint_format();
const CheckpointFormat& gptq_checkpoint_format();
const CheckpointFormat& awq_checkpoint_format();
const CheckpointFormat& modelopt_checkpoint_format();
const CheckpointFormat& bitsandbytes_checkpoint_format();

void require_integer_weight_only(const LinearCheck& c, const std::string& format) {
  if (c.act)
    throw unsupported(c.where, "the " + format + " format holds weight-only schemes; export compressed-tensors for " +
                                   c.act->describe() + " activations");
  if (!c.weights->is_int())
    throw unsupported(c.where, "the " + format + " format holds integer weights, not " + c.weights->describe());
}

const std::vector<const CheckpointFormat*>& checkpoint_formats() {
  // The first is the default (a recipe without export.format).
  static const std::vector<const CheckpointFormat*> all = {&compressed_tensors_checkpoint_format(),
                                                           &gptq_checkpoint_format(), &awq_checkpoint_format(),
                                                           &modelopt_checkpoint_format(),
                                                           &bitsandbytes_checkpoint_format()};
  return all;
}

std::string checkpoint_format_names() {
  std::string s;
  for (const CheckpointFormat* f : checkpoint_formats()) s += (s.empty() ? "" : ", ") + std::string(f->name());
  return s;
}

const CheckpointFormat* find_checkpoint_format(const std::string& name) {
  for (const CheckpointFormat* f : checkpoint_formats())
    if (name == f->name()) return f;
  return nullptr;
}

const CheckpointFormat& open_checkpoint_format(const std::filesystem::path& dir, const nlohmann::json& qcfg,
                                               const std::string& config_file, OpenedConfig* opened) {
  const std::string method = qcfg.value("quant_method", "");
  const CheckpointFormat* format = find_checkpoint_format(method);
  if (!format)
    throw unsupported(config_file, "quant_method '" + method + "' is not supported by the runtime (" +
                                       checkpoint_format_names() + ")");
  *opened = format->open(dir, qcfg, config_file);
  return *format;
}

const CheckpointFormat& checkpoint_format(const std::string& name, const std::string& where) {
  if (name.empty()) return *checkpoint_formats().front();
  if (const CheckpointFormat* f = find_checkpoint_format(name)) return *f;
  std::vector<std::string> names;
  for (const CheckpointFormat* f : checkpoint_formats()) names.push_back(f->name());
  const std::string c = closest_word(name, names);
  throw invalid_input(where, "export.format: unknown format '" + name + "' (" +
                                 (c.empty() ? checkpoint_format_names() : "did you mean '" + c + "'?") + ")");
}

}  // namespace qf
