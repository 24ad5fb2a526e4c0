// Fuzz target: a llama2.c tokenizer file (tokenizer.bin), loaded as
// load_tokenizer does and exercised.
#include "formats/tokenizer/tokenizer.h"
#include "fuzz_tokenize.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = qf::fuzz::write_file("llama2c_tokenizer/tokenizer.bin", data, size);
  qf::fuzz::run([&] {
    const auto tok = qf::load_tokenizer(path);
    qf::fuzz::exercise_tokenizer(*tok);
  });
  return 0;
}
