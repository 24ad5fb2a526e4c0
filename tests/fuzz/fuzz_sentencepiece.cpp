// Fuzz target: a SentencePiece tokenizer.model (a ModelProto), loaded as
// load_tokenizer does (libsentencepiece plus quantforge's own reading of the
// piece types and flags) and exercised; its Vocab also through the "llama"
// algorithm (the GGUF export path).
#include "formats/tokenizer/tokenizer.h"
#include "fuzz_tokenize.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = qf::fuzz::write_file("sentencepiece/tokenizer.model", data, size);
  qf::fuzz::run([&] {
    const auto tok = qf::load_tokenizer(path);
    qf::fuzz::exercise_tokenizer(*tok);
    const auto own = qf::make_tokenizer(tok->vocab());
    qf::fuzz::exercise_tokenizer(*own);
  });
  return 0;
}
