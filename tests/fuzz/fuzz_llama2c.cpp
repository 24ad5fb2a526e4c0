// Fuzz target: a llama2.c checkpoint (.bin). The header is validated against
// the file size; a checkpoint that passes (with a vocabulary of 259 to 4096
// tokens) is converted to a Hugging Face folder with a generated llama2.c
// tokenizer of that size, and the result must load in the runtime.
#include <cstring>

#include "formats/llama2c/llama2c_model.h"
#include "fuzz_util.h"
#include "runtime/model.h"

namespace {

// <unk>, <s>, </s>, the 256 byte tokens, then "t259", "t260", ...
std::string llama2c_tokenizer(int32_t n) {
  std::string out;
  auto i32 = [&](int32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); };
  auto token = [&](const std::string& s, float score) {
    out.append(reinterpret_cast<const char*>(&score), 4);
    i32(static_cast<int32_t>(s.size()));
    out += s;
  };
  i32(16);
  token("<unk>", 0), token("\n<s>\n", 0), token("\n</s>\n", 0);
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    token(buf, 0);
  }
  for (int32_t i = 259; i < n; ++i) token(std::string(1, 't').append(std::to_string(i)), -static_cast<float>(i));
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = qf::fuzz::write_file("llama2c/model.bin", data, size);
  qf::Llama2cHeader h;
  bool ok = false;
  qf::fuzz::run([&] {
    h = qf::read_llama2c_header(path);
    ok = true;
  });
  if (!ok || h.vocab_size < 259 || h.vocab_size > 4096) return 0;
  const auto tok = qf::fuzz::write_file("llama2c/tokenizer.bin", llama2c_tokenizer(h.vocab_size));
  const auto out = qf::fuzz::scratch_dir() / "llama2c" / "hf";
  std::filesystem::remove_all(out);
  bool converted = false;
  qf::fuzz::run([&] {
    qf::convert_llama2c_to_hf(path, tok, out);
    converted = true;
  });
  // A checkpoint whose header passed converts into a model the runtime loads;
  // the only expected refusal is a config the runtime does not run.
  if (converted) {
    try {
      qf::rt::load_hf_model(out);
    } catch (const qf::Error& e) {
      qf::fuzz::fail(std::string("a converted llama2.c checkpoint does not load: ") + e.what());
    }
  }
  std::filesystem::remove_all(out);
  return 0;
}
