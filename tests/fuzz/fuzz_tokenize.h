// Shared by the tokenizer fuzz targets: what is done with a tokenizer that loaded.
#pragma once

#include <string_view>
#include <vector>

#include "formats/tokenizer/tokenizer.h"
#include "fuzz_util.h"

namespace qf::fuzz {

// Encodes a few probe strings (ASCII, spaces and newlines, digits, accented
// and CJK text, an emoji, invalid UTF-8, special-token spellings), checks
// that every id is in range, decodes them, and decodes every id of small
// vocabularies. Encoding may throw qf::Error (text with no token and no UNK).
inline void exercise_tokenizer(const Tokenizer& tok) {
  static const std::string_view probes[] = {
      "Hello world",
      "  two  spaces\n\tand a tab\r\n",
      "12345 678.9",
      "caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80",
      "bad \xFF\xFE utf8 \xC3",
      "<s>x</s><unk><|endoftext|>",
      "",
  };
  const int32_t n = tok.vocab_size();
  for (std::string_view text : probes) {
    for (bool bos : {false, true}) {
      run([&] {
        const std::vector<int32_t> ids = tok.encode(text, bos);
        for (int32_t id : ids)
          if (id < 0 || id >= n) fail("encode returned an id out of range");
        tok.decode(ids);
      });
    }
  }
  if (n <= 4096) {
    std::vector<int32_t> all(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
    run([&] { tok.decode(all); });
  }
  run([&] { tok.piece(n); });  // out of range: qf::Error
}

}  // namespace qf::fuzz
