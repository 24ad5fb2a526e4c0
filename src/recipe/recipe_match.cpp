// Target/ignore matching (compressed-tensors' is_match and match_targets) and
// the per-module scheme lookup.
#include <algorithm>
#include <memory>
#include <mutex>
#include <unordered_map>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "recipe/recipe.h"
#include "recipe/recipe_internal.h"

namespace qf {

namespace {

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
using CodePtr = std::shared_ptr<pcre2_code>;

// PCRE2_ANCHORED: Python's re.match, which compressed-tensors uses, anchors at
// the start of the name only. Returns nullptr and sets *err on a bad pattern.
pcre2_code* compile_anchored(const std::string& regex, std::string* err) {
  int code = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(regex.data()), regex.size(),
                                PCRE2_ANCHORED | PCRE2_UTF, &code, &off, nullptr);
  if (!c) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(code, msg, sizeof msg);
    *err = "invalid regular expression: " + std::string(reinterpret_cast<const char*>(msg)) + " at offset " +
           std::to_string(off);
  }
  return c;
}

// Compiled "re:" patterns, shared by every lookup. Recipes hold a handful;
// a process that parses many recipes (a fuzzer, a service) would grow the
// cache without end, so it is emptied when it reaches kMaxCached patterns.
CodePtr compiled(const std::string& regex) {
  constexpr size_t kMaxCached = 256;
  static std::mutex mu;
  static std::unordered_map<std::string, CodePtr> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(regex);
  if (it != cache.end()) return it->second;
  std::string err;
  pcre2_code* c = compile_anchored(regex, &err);
  if (!c) throw invalid_input("re:" + regex, err);
  CodePtr p(c, CodeDeleter());
  if (cache.size() >= kMaxCached) cache.clear();  // holders keep their shared_ptr
  cache.emplace(regex, p);
  return p;
}

}  // namespace

std::string regex_error(const std::string& regex) {
  std::string err;
  pcre2_code* c = compile_anchored(regex, &err);
  if (c) pcre2_code_free(c);
  return err;
}

static bool match_name(const std::string& pattern, const std::string& name) {
  if (pattern.rfind("re:", 0) == 0) {
    CodePtr code = compiled(pattern.substr(3));
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code.get(), nullptr);
    const int rc = pcre2_match(code.get(), reinterpret_cast<PCRE2_SPTR>(name.data()), name.size(), 0, 0, md, nullptr);
    pcre2_match_data_free(md);
    return rc >= 0;
  }
  return pattern == name;
}

static bool match_class(const std::string& pattern, std::string_view module_class) {
  // A regex never names a class (":" is not allowed in class names).
  return !module_class.empty() && pattern == module_class;
}

bool recipe_matches(const std::string& pattern, const std::string& module_name, std::string_view module_class) {
  return match_name(pattern, module_name) || match_class(pattern, module_class);
}

std::optional<ModifierSpec::Group> scheme_for(const ModifierSpec& m, const std::string& module_name,
                                              std::string_view module_class) {
  for (const auto& ign : m.ignore)
    if (recipe_matches(ign, module_name, module_class)) return std::nullopt;
  // target -> index of the last group listing it (compressed-tensors builds an
  // ordered dict target -> scheme, so a later group overwrites an earlier one).
  std::vector<std::pair<std::string, size_t>> owner;
  for (size_t g = 0; g < m.groups.size(); ++g)
    for (const auto& t : m.groups[g].targets) {
      bool found = false;
      for (auto& [tt, gi] : owner)
        if (tt == t) {
          gi = g;
          found = true;
        }
      if (!found) owner.emplace_back(t, g);
    }
  // match_targets: targets sorted by ("re:" in t, t); name matches (exact,
  // then regex) first, class matches after.
  std::sort(owner.begin(), owner.end(), [](const auto& a, const auto& b) {
    const bool ra = a.first.rfind("re:", 0) == 0, rb = b.first.rfind("re:", 0) == 0;
    if (ra != rb) return !ra;
    return a.first < b.first;
  });
  const ModifierSpec::Group* chosen = nullptr;
  for (const auto& [t, g] : owner)
    if (match_name(t, module_name)) {
      chosen = &m.groups[g];
      break;
    }
  if (!chosen)
    for (const auto& [t, g] : owner)
      if (match_class(t, module_class)) {
        chosen = &m.groups[g];
        break;
      }
  if (!chosen || !chosen->quantize_weights) return std::nullopt;
  return *chosen;
}

}  // namespace qf
