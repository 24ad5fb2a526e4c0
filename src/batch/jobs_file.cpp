#include "batch/jobs_file.h"

#include <fnmatch.h>

#include <set>

#include "calibration/activation_store.h"
#include "core/error.h"
#include "core/io.h"
#include "formats/hf/resolve.h"
#include "quantizers/gguf_mix.h"
#include "recipe/recipe.h"
#include "recipe/yaml_reader.h"

namespace qf::batch {

namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kTopKeys = {"output", "reserve_disk", "models", "targets", "eval"};
const std::vector<std::string> kModelKeys = {"path", "hf", "glob", "revision", "name", "targets", "exclude", "calib", "eval"};
const std::vector<std::string> kTargetKeys = {"gguf", "recipe", "name", "imatrix", "calib", "eval"};
const std::vector<std::string> kEvalKeys = {"text", "chunks", "ctx", "max_ppl_ratio", "max_ppl_delta", "max_kld"};
const std::vector<std::string> kImatrixKeys = {"file", "text", "chunks", "ctx"};

bool valid_name(const std::string& s) {
  if (s.empty() || s == "." || s == ".." || s[0] == '.') return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
      return false;
  return true;
}

// Any character outside [A-Za-z0-9._-] becomes '-'.
std::string sanitized(const std::string& s) {
  std::string out;
  for (char c : s) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    out.push_back(keep ? c : '-');
  }
  while (!out.empty() && out[0] == '.') out.erase(0, 1);
  return out.empty() ? "model" : out;
}

// The output name of a Hugging Face repo id: ORG/NAME -> ORG--NAME (the
// cache's own spelling).
std::string repo_output_name(const std::string& id) {
  const size_t slash = id.find('/');
  return sanitized(slash == std::string::npos ? id : id.substr(0, slash) + "--" + id.substr(slash + 1));
}

class JobsParser : public YamlReader {
 public:
  JobsParser(const fs::path& file) : YamlReader(file.string(), 0), base_(file.parent_path()) {}

  JobsFile parse(const YAML::Node& root) {
    JobsFile f;
    if (!root.IsMap()) fail_at(YAML::Mark::null_mark(), "expected a mapping with models and targets");
    const Entries top = entries(root, "", &kTopKeys);
    if (top.has("output")) f.output = path_of(top.get("output"), "output");
    if (top.has("reserve_disk")) {
      const YAML::Node n = top.get("reserve_disk");
      const std::string s = as_string(n, "reserve_disk");
      try {
        f.reserve_disk = parse_memory_size(s, "reserve_disk");
      } catch (const Error& e) {
        fail(n, e.what());
      }
    }
    if (top.has("eval")) f.eval = eval_spec(top.get("eval"), "eval", true);
    const Entry* models = top.find("models");
    if (!models || !models->value.IsSequence() || models->value.size() == 0)
      fail(models ? models->value : root, "models: expected a non-empty list of models");
    const Entry* targets = top.find("targets");
    if (!targets || !targets->value.IsSequence() || targets->value.size() == 0)
      fail(targets ? targets->value : root, "targets: expected a non-empty list of targets");
    std::set<std::string> tnames;
    for (size_t i = 0; i < targets->value.size(); ++i) {
      const YAML::Node n = targets->value[i];
      TargetSpec t = target(n, "targets[" + std::to_string(i) + "]");
      if (!tnames.insert(t.name).second)
        fail(n, "targets[" + std::to_string(i) + "]: the name " + quote(t.name) +
                    " is used twice (give one of them `name:`)");
      f.targets.push_back(std::move(t));
    }
    std::set<std::string> mnames;
    for (size_t i = 0; i < models->value.size(); ++i) {
      const YAML::Node n = models->value[i];
      for (ModelSpec& m : model(n, "models[" + std::to_string(i) + "]", tnames)) {
        if (!mnames.insert(m.name).second)
          fail(n, "models[" + std::to_string(i) + "]: the model name " + quote(m.name) +
                      " is used twice (give one of them `name:`)");
        f.models.push_back(std::move(m));
      }
    }
    return f;
  }

 private:
  fs::path base_;

  fs::path path_of(const YAML::Node& n, const std::string& path) {
    const std::string s = as_string(n, path);
    if (s.empty()) fail(n, path + ": empty path");
    fs::path p(s);
    return p.is_relative() ? (base_ / p).lexically_normal() : p;
  }
  fs::path existing_file(const YAML::Node& n, const std::string& path) {
    fs::path p = path_of(n, path);
    std::error_code ec;
    const bool file = fs::is_regular_file(p, ec);
    // A name too long or a folder that cannot be searched is not "missing".
    if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory)
      fail(n, path + ": " + p.string() + ": " + ec.message(), ErrorKind::Io);
    if (!file) fail(n, path + ": no such file: " + p.string(), ErrorKind::NotFound);
    return p;
  }
  std::string name_of(const YAML::Node& n, const std::string& path) {
    const std::string s = as_string(n, path);
    if (!valid_name(s)) fail(n, path + ": " + quote(s) + " is not a valid name (letters, digits, '.', '_', '-'; not starting with '.')");
    return s;
  }

  EvalSpec eval_spec(const YAML::Node& n, const std::string& path, bool need_text) {
    const Entries e = entries(n, path, &kEvalKeys);
    EvalSpec s;
    if (e.has("text")) s.text = existing_file(e.get("text"), path + ".text");
    else if (need_text) fail(n, path + ": text: the evaluation text is required");
    if (e.has("chunks")) s.chunks = at_least(e.get("chunks"), path + ".chunks", 0);
    if (e.has("ctx")) s.ctx = at_least(e.get("ctx"), path + ".ctx", 2);
    auto bound = [&](const char* k, std::optional<double>& out) {
      if (!e.has(k)) return;
      const double v = as_double(e.get(k), path + "." + k);
      if (v < 0) fail(e.get(k), path + "." + k + ": must not be negative");
      out = v;
    };
    bound("max_ppl_ratio", s.max_ppl_ratio);
    bound("max_ppl_delta", s.max_ppl_delta);
    bound("max_kld", s.max_kld);
    return s;
  }
  int64_t at_least(const YAML::Node& n, const std::string& path, int64_t lo) {
    const int64_t v = as_int(n, path);
    if (v < lo) fail(n, path + ": must be at least " + std::to_string(lo));
    return v;
  }

  TargetSpec target(const YAML::Node& n, const std::string& path) {
    const Entries e = entries(n, path, &kTargetKeys);
    TargetSpec t;
    t.where = pos(mark(n));
    const bool gguf = e.has("gguf"), recipe = e.has("recipe");
    if (gguf == recipe) fail(n, path + ": give exactly one of `gguf: PRESET` and `recipe: FILE`");
    if (gguf) {
      t.kind = TargetSpec::Kind::Gguf;
      const YAML::Node p = e.get("gguf");
      try {
        t.preset = gguf_mix::parse_preset(as_string(p, path + ".gguf")).name;
      } catch (const Error& err) {
        fail(p, path + ".gguf: " + err.what());
      }
      t.name = t.preset;
      if (e.has("calib")) fail(e.get("calib"), path + ".calib: applies to recipe targets (GGUF targets take `imatrix:`)");
      if (e.has("imatrix")) {
        const YAML::Node m = e.get("imatrix");
        ImatrixSpec im;
        if (m.IsScalar()) {
          im.file = existing_file(m, path + ".imatrix");
        } else {
          const Entries ie = entries(m, path + ".imatrix", &kImatrixKeys);
          if (ie.has("file") == ie.has("text"))
            fail(m, path + ".imatrix: give either `file:` (an imatrix) or `text:` (to compute one)");
          if (ie.has("file")) im.file = existing_file(ie.get("file"), path + ".imatrix.file");
          if (ie.has("text")) im.text = existing_file(ie.get("text"), path + ".imatrix.text");
          if (ie.has("chunks")) im.chunks = at_least(ie.get("chunks"), path + ".imatrix.chunks", 0);
          if (ie.has("ctx")) im.ctx = at_least(ie.get("ctx"), path + ".imatrix.ctx", 2);
          if (!im.file.empty() && (ie.has("chunks") || ie.has("ctx")))
            fail(m, path + ".imatrix: chunks and ctx apply to `text:`");
        }
        t.imatrix = im;
      }
    } else {
      t.kind = TargetSpec::Kind::Recipe;
      const YAML::Node r = e.get("recipe");
      t.recipe = existing_file(r, path + ".recipe");
      parse_recipe_file(t.recipe);  // its own errors name its own lines
      t.name = sanitized(t.recipe.stem().string());
      if (e.has("calib")) t.calib = existing_file(e.get("calib"), path + ".calib");
      if (e.has("imatrix")) fail(e.get("imatrix"), path + ".imatrix: applies to GGUF targets");
    }
    if (e.has("name")) t.name = name_of(e.get("name"), path + ".name");
    if (e.has("eval")) {
      const YAML::Node v = e.get("eval");
      if (v.IsScalar() && (lower(v.Scalar()) == "false" || lower(v.Scalar()) == "off" || lower(v.Scalar()) == "no")) t.no_eval = true;
      else t.eval = eval_spec(v, path + ".eval", false);
    }
    return t;
  }

  std::vector<ModelSpec> model(const YAML::Node& n, const std::string& path, const std::set<std::string>& targets) {
    const Entries e = entries(n, path, &kModelKeys);
    ModelSpec m;
    m.where = pos(mark(n));
    const int forms = (e.has("path") ? 1 : 0) + (e.has("hf") ? 1 : 0) + (e.has("glob") ? 1 : 0);
    if (forms != 1) fail(n, path + ": give exactly one of `path:` (a folder), `hf:` (ORG/NAME) and `glob:` (ORG/NAME pattern)");
    m.revision = e.has("revision") ? as_string(e.get("revision"), path + ".revision") : "main";
    if (e.has("revision") && e.has("path")) fail(e.get("revision"), path + ".revision: applies to `hf:` and `glob:` models");
    auto names = [&](const char* k, std::vector<std::string>& out) {
      if (!e.has(k)) return;
      out = as_string_list(e.get(k), path + "." + k);
      for (const std::string& t : out)
        if (!targets.count(t)) {
          std::vector<std::string> all(targets.begin(), targets.end());
          const std::string c = closest_word(t, all);
          fail(e.get(k), path + "." + k + ": no target is named " + quote(t) +
                             (c.empty() ? " (targets: " + join(all) + ")" : " (did you mean " + quote(c) + "?)"));
        }
    };
    names("targets", m.only);
    names("exclude", m.exclude);
    if (!m.only.empty() && !m.exclude.empty()) fail(n, path + ": give `targets:` or `exclude:`, not both");
    if (e.has("calib")) m.calib = existing_file(e.get("calib"), path + ".calib");
    if (e.has("eval")) m.eval = eval_spec(e.get("eval"), path + ".eval", false);
    std::vector<ModelSpec> out;
    if (e.has("glob")) {
      if (e.has("name")) fail(e.get("name"), path + ".name: a glob names each model after its repo");
      const YAML::Node g = e.get("glob");
      const std::string pattern = as_string(g, path + ".glob");
      const fs::path cache = hf_hub_cache_dir();
      std::vector<std::string> ids;
      for (const std::string& id : cached_repo_ids())
        if (fnmatch(pattern.c_str(), id.c_str(), 0) == 0) ids.push_back(id);
      if (ids.empty()) fail(g, path + ".glob: " + quote(pattern) + " matches no model in the cache " + cache.string(), ErrorKind::NotFound);
      for (const std::string& id : ids) {
        ModelSpec x = m;
        x.arg = id;
        x.name = repo_output_name(id);
        check_resolves(x, g, path);
        out.push_back(std::move(x));
      }
      return out;
    }
    if (e.has("path")) {
      const YAML::Node p = e.get("path");
      m.arg = path_of(p, path + ".path").string();
      fs::path dir = fs::path(m.arg);
      m.name = sanitized(dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string());
      check_resolves(m, p, path);
      // A snapshot folder is named by its commit: use the repo's name.
      const ResolvedModel rm = resolve_model(m.arg, m.revision);
      if (!rm.repo_id.empty()) m.name = repo_output_name(rm.repo_id);
    } else {
      const YAML::Node h = e.get("hf");
      m.arg = as_string(h, path + ".hf");
      const size_t slash = m.arg.find('/');
      if (slash == std::string::npos || slash == 0 || slash + 1 == m.arg.size() || m.arg.find('/', slash + 1) != std::string::npos)
        fail(h, path + ".hf: expected ORG/NAME, got " + quote(m.arg));
      m.name = repo_output_name(m.arg);
      check_resolves(m, h, path);
    }
    if (e.has("name")) m.name = name_of(e.get("name"), path + ".name");
    out.push_back(std::move(m));
    return out;
  }

  void check_resolves(const ModelSpec& m, const YAML::Node& n, const std::string& path) {
    try {
      resolve_model(m.arg, m.revision);
    } catch (const Error& e) {
      fail(n, path + ": " + e.what(), e.kind());
    }
  }
};

}  // namespace

JobsFile parse_jobs_file(const fs::path& path) {
  if (!fs::exists(path)) throw not_found(path.string(), "no such jobs file");
  const std::string text = read_text_file(path);
  const YAML::Node root = load_yaml(text, path.string());
  JobsParser p(path);
  JobsFile f;
  try {
    f = p.parse(root);
  } catch (const YAML::Exception& e) {
    std::string where = path.string();
    if (!e.mark.is_null()) where += ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1);
    throw invalid_input(where, e.msg);
  }
  f.path = path;
  f.text = text;
  return f;
}

}  // namespace qf::batch
