// Shared by the commands that check their outputs against their inputs.
#include "commands.h"
#include "core/error.h"
#include "formats/hf/resolve.h"

namespace qf::cli {

std::filesystem::path model_input(const std::string& model) {
  if (model.empty()) return {};
  std::error_code ec;
  if (std::filesystem::is_regular_file(model, ec)) return model;
  try {
    return resolve_model(model).dir;
  } catch (const Error&) {
    return {};
  }
}

}  // namespace qf::cli
