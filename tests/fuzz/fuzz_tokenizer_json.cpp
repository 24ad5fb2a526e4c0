// Fuzz target: a Hugging Face tokenizer.json (BPE, byte-level or
// SentencePiece-style), loaded as load_tokenizer does and exercised.
#include "formats/tokenizer/tokenizer.h"
#include "fuzz_tokenize.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = qf::fuzz::write_file("tokenizer_json/tokenizer.json", data, size);
  qf::fuzz::run([&] {
    const auto tok = qf::load_tokenizer(path);
    qf::fuzz::exercise_tokenizer(*tok);
  });
  return 0;
}
