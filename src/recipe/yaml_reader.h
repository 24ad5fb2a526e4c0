// Reading hand-written YAML with positions: every message starts
// "FILE:LINE:COL: ", scalars are typed strictly (an integer is an integer,
// "1.5x" is not a number), mappings reject duplicate and unknown keys with a
// "did you mean" hint. The recipe parser and the batch jobs file share it.
#pragma once

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include "core/did_you_mean.h"
#include "core/error.h"

namespace qf {

namespace yaml {

inline std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

inline std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += sep;
    s += v[i];
  }
  return s;
}

inline std::string quote(const std::string& s) { return "'" + s + "'"; }

}  // namespace yaml

// Parses `text` (named `name` in messages, its line numbers shifted by
// line_offset); InvalidInput "NAME:LINE:COL: YAML syntax error: ..." on failure.
// yaml-cpp stops nesting deeper than its depth limit (which keeps its
// recursive parser off the end of the stack) with the bare message "bad
// file": that case is named for what it is.
inline YAML::Node load_yaml(const std::string& text, const std::string& name, int line_offset = 0) {
  auto where = [&](const YAML::Mark& m) {
    if (m.is_null()) return name;
    return name + ":" + std::to_string(m.line + 1 + line_offset) + ":" + std::to_string(m.column + 1);
  };
  try {
    return YAML::Load(text);
  } catch (const YAML::DeepRecursion& e) {
    throw invalid_input(where(e.mark), "YAML nested too deeply: lists and mappings reach the reader's limit of " +
                                           std::to_string(e.depth()) + " levels");
  } catch (const YAML::Exception& e) {
    throw invalid_input(where(e.mark), "YAML syntax error: " + e.msg);
  }
}

class YamlReader {
 public:
  YamlReader(std::string file, int line_offset) : file_(std::move(file)), line_offset_(line_offset) {}

 protected:
  static std::string lower(std::string s) { return yaml::lower(std::move(s)); }
  static std::string join(const std::vector<std::string>& v, const char* sep = ", ") { return yaml::join(v, sep); }
  static std::string quote(const std::string& s) { return yaml::quote(s); }

  std::string file_;
  int line_offset_ = 0;
  YAML::Mark last_{};  // the last good position, for nodes without one

  // ---- positions and errors ----
  YAML::Mark mark(const YAML::Node& n) {
    YAML::Mark m = n.IsDefined() ? n.Mark() : YAML::Mark::null_mark();
    if (m.is_null()) return last_;
    last_ = m;
    return m;
  }
  std::string pos(const YAML::Mark& m) const {
    if (m.is_null()) return file_;
    return file_ + ":" + std::to_string(m.line + 1 + line_offset_) + ":" + std::to_string(m.column + 1);
  }
  [[noreturn]] void fail_at(const YAML::Mark& m, const std::string& what, ErrorKind kind = ErrorKind::InvalidInput) {
    throw Error(kind, pos(m) + ": " + what);
  }
  [[noreturn]] void fail(const YAML::Node& n, const std::string& what, ErrorKind kind = ErrorKind::InvalidInput) {
    fail_at(mark(n), what, kind);
  }

  // ---- scalars ----
  static bool quoted(const YAML::Node& n) { return n.Tag() == "!" || n.Tag() == "tag:yaml.org,2002:str"; }
  static const char* type_name(const YAML::Node& n) {
    switch (n.Type()) {
      case YAML::NodeType::Null: return "null";
      case YAML::NodeType::Scalar: return "a scalar";
      case YAML::NodeType::Sequence: return "a list";
      case YAML::NodeType::Map: return "a mapping";
      default: return "nothing";
    }
  }
  std::string got(const YAML::Node& n) {
    if (n.IsScalar()) return quoted(n) ? "the string \"" + n.Scalar() + "\"" : quote(n.Scalar());
    return type_name(n);
  }

  std::string as_string(const YAML::Node& n, const std::string& path) {
    if (!n.IsScalar()) fail(n, path + ": expected a string, got " + got(n));
    mark(n);
    return n.Scalar();
  }
  int64_t as_int(const YAML::Node& n, const std::string& path) {
    if (!n.IsScalar()) fail(n, path + ": expected an integer, got " + got(n));
    std::string s = n.Scalar();
    const char* b = s.data();
    const char* e = s.data() + s.size();
    if (b != e && *b == '+') ++b;
    int64_t v = 0;
    auto [p, ec] = std::from_chars(b, e, v);
    if (ec == std::errc::result_out_of_range) fail(n, path + ": integer " + s + " is out of range");
    if (ec != std::errc() || p != e || b == e) fail(n, path + ": expected an integer, got " + got(n));
    mark(n);
    return v;
  }
  double as_double(const YAML::Node& n, const std::string& path) {
    if (!n.IsScalar()) fail(n, path + ": expected a number, got " + got(n));
    const std::string& s = n.Scalar();
    char* end = nullptr;
    const double v = s.empty() ? 0.0 : std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v) ||
        s.find_first_of("xXnN") != std::string::npos)
      fail(n, path + ": expected a number, got " + got(n));
    mark(n);
    return v;
  }
  bool as_bool(const YAML::Node& n, const std::string& path) {
    if (n.IsScalar()) {
      const std::string s = lower(n.Scalar());
      if (s == "true" || s == "yes" || s == "on" || s == "1") return true;
      if (s == "false" || s == "no" || s == "off" || s == "0") return false;
    }
    fail(n, path + ": expected true or false, got " + got(n));
  }
  // A string or a list of strings (llm-compressor turns a lone string into a list).
  std::vector<std::string> as_string_list(const YAML::Node& n, const std::string& path) {
    std::vector<std::string> out;
    if (n.IsScalar()) {
      out.push_back(as_string(n, path));
    } else if (n.IsSequence()) {
      for (size_t i = 0; i < n.size(); ++i) out.push_back(as_string(n[i], path + "[" + std::to_string(i) + "]"));
    } else {
      fail(n, path + ": expected a string or a list of strings, got " + got(n));
    }
    return out;
  }
  // ---- mappings ----
  struct Entry {
    std::string key;
    YAML::Node key_node, value;
  };
  struct Entries {
    std::vector<Entry> items;
    const Entry* find(const std::string& k) const {
      for (const auto& e : items)
        if (e.key == k) return &e;
      return nullptr;
    }
    // The value, or an undefined node when absent.
    YAML::Node get(const std::string& k) const {
      const Entry* e = find(k);
      return e ? e->value : YAML::Node(YAML::NodeType::Undefined);
    }
    // Present and not null.
    bool has(const std::string& k) const {
      const Entry* e = find(k);
      return e && !e->value.IsNull();
    }
  };

  // The entries of a mapping (null counts as empty), with duplicate keys
  // rejected and, when `allowed` is given, unknown keys too.
  Entries entries(const YAML::Node& n, const std::string& path, const std::vector<std::string>* allowed = nullptr,
                  std::string (*extra_hint)(const std::string& key) = nullptr) {
    Entries out;
    if (n.IsNull()) return out;
    if (!n.IsMap()) fail(n, path + ": expected a mapping, got " + got(n));
    mark(n);
    for (auto it = n.begin(); it != n.end(); ++it) {
      const YAML::Node k = it->first;
      if (!k.IsScalar()) fail(k, path + ": keys must be strings, got " + got(k));
      const std::string key = k.Scalar();
      if (const Entry* prev = out.find(key))
        fail(k, path + ": duplicate key " + quote(key) + " (first at line " +
                    std::to_string(prev->key_node.Mark().line + 1 + line_offset_) + ")");
      if (allowed && std::find(allowed->begin(), allowed->end(), key) == allowed->end()) {
        std::string hint = extra_hint ? extra_hint(key) : "";
        if (hint.empty()) {
          const std::string c = closest_word(key, *allowed);
          hint = c.empty() ? "valid keys: " + join(*allowed) : "did you mean " + quote(c) + "?";
        }
        fail(k, (path.empty() ? "" : path + ": ") + "unknown key " + quote(key) + " (" + hint + ")");
      }
      out.items.push_back({key, k, it->second});
    }
    return out;
  }
};

}  // namespace qf
