// Fuzz target: a recipe given to the Python module as a dict. The module
// writes it with json.dump(recipe, f, indent=1) and the recipe parser reads
// that JSON text as YAML. The input bytes drive a generator of such text, so
// every input is something json.dump can write: nested objects and lists
// (deep ones too), recipe keys and words, Python's float spellings NaN,
// Infinity and -Infinity, and strings with ensure_ascii's \uXXXX escapes,
// lone surrogates included. The text is parsed and each modifier's schemes
// described and validated, as fuzz_recipe does for hand-written YAML.
#include <cstdio>
#include <string>

#include "fuzz_recipe_util.h"
#include "fuzz_util.h"
#include "recipe/recipe.h"

namespace {

const char* const kWords[] = {
    "quant_stage", "quant_modifiers", "GPTQModifier", "QuantizationModifier", "AWQModifier", "SmoothQuantModifier",
    "scheme", "W4A16", "W8A8", "FP8", "NVFP4", "targets", "ignore", "Linear", "lm_head", "re:.*mlp.*",
    "config_groups", "group_0", "weights", "input_activations", "num_bits", "type", "int", "float", "symmetric",
    "strategy", "group", "channel", "tensor", "group_size", "dynamic", "observer", "actorder", "block_size",
    "dampening_frac", "kv_cache_scheme", "calibration", "num_samples", "seq_len", "seed", "dataset", "export",
    "format", "compressed-tensors", "gptq", "autoawq", "modelopt", "mappings", "smoothing_strength", ""};

// Emits the text json.dump(obj, indent=1) writes for an object the input
// bytes describe.
class JsonDump {
 public:
  JsonDump(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}

  std::string top() {
    object(0);
    return out_;
  }

 private:
  static constexpr int kMaxDepth = 600;  // past yaml-cpp's limit (about 500); the text grows as depth squared
  const uint8_t* p_;
  const uint8_t* end_;
  std::string out_;

  uint8_t next() { return p_ < end_ ? *p_++ : 0; }
  bool more() const { return p_ < end_; }

  void newline(int depth) {
    out_ += '\n';
    out_.append(static_cast<size_t>(depth), ' ');
  }

  // A JSON string as ensure_ascii=True writes it: ASCII as is (with " \ and
  // control characters escaped), anything else as \uXXXX code units.
  void string_literal() {
    const uint8_t pick = next();
    if (pick < 160) {
      out_ += '"';
      out_ += kWords[pick % (sizeof kWords / sizeof *kWords)];
      out_ += '"';
      return;
    }
    const size_t n = next() % 12;
    out_ += '"';
    for (size_t i = 0; i < n && more(); ++i) {
      const uint8_t c = next();
      char buf[16];
      if (c == '"' || c == '\\') {
        out_ += '\\';
        out_ += static_cast<char>(c);
      } else if (c >= 0x20 && c < 0x7f) {
        out_ += static_cast<char>(c);
      } else if (c >= 0xf0) {  // a UTF-16 surrogate, paired or alone (Python str allows both)
        std::snprintf(buf, sizeof buf, "\\u%04x", 0xd800 + (c & 0x7) * 0x100 + next());
        out_ += buf;
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", c < 0x20 ? c : c * 0x101);
        out_ += buf;
      }
    }
    out_ += '"';
  }

  void number() {
    static const char* const kFloats[] = {"NaN", "Infinity", "-Infinity", "0.0", "-0.0", "1e+300", "0.01", "1.5"};
    const uint8_t b = next();
    if (b < 64) {
      out_ += kFloats[b % 8];
      return;
    }
    static const long long kInts[] = {0, 1, -1, 2, 4, 8, 16, 128, 512, 4096, 1LL << 40, -(1LL << 62)};
    out_ += std::to_string(b < 128 ? kInts[b % 12] : static_cast<long long>(next()) - 64);
  }

  void value(int depth) {
    const uint8_t op = next();
    if (depth >= kMaxDepth) return number();
    switch (op % 9) {
      case 0: return object(depth);
      case 1: return list(depth);
      case 2:
      case 3: return string_literal();
      case 4: return number();
      case 5: out_ += (op & 16) ? "true" : "false"; return;
      case 6: out_ += "null"; return;
      case 7: {  // a chain of single-key objects or one-item lists, up to kMaxDepth deep
        const int n = 1 + next() * 4;
        const bool lists = op & 32;
        int d = depth;
        for (int i = 0; i < n && d < kMaxDepth; ++i, ++d) {
          out_ += lists ? "[" : "{";
          newline(d + 1);
          if (!lists) out_ += "\"x\": ";
        }
        value(d);
        while (d > depth) {
          newline(--d);
          out_ += lists ? "]" : "}";
        }
        return;
      }
      default: return object(depth);
    }
  }

  void object(int depth) {
    const int n = next() % 5;
    if (n == 0 || !more()) {
      out_ += "{}";
      return;
    }
    out_ += '{';
    for (int i = 0; i < n; ++i) {
      if (i) out_ += ',';
      newline(depth + 1);
      string_literal();  // json.dump writes every key as a string
      out_ += ": ";
      value(depth + 1);
    }
    newline(depth);
    out_ += '}';
  }

  void list(int depth) {
    const int n = next() % 5;
    if (n == 0 || !more()) {
      out_ += "[]";
      return;
    }
    out_ += '[';
    for (int i = 0; i < n; ++i) {
      if (i) out_ += ',';
      newline(depth + 1);
      value(depth + 1);
    }
    newline(depth);
    out_ += ']';
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = JsonDump(data, size).top();
  qf::fuzz::run([&] { qf::fuzz::exercise_recipe(qf::parse_recipe_text(text, "recipe.yaml")); });
  return 0;
}
