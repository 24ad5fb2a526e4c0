#include "core/error.h"
#include "core/text_input.h"
#include "eval/perplexity.h"

namespace qf::eval {

std::vector<Span> image_text_spans(const std::filesystem::path& file, const Tokenizer& tok,
                                   const rt::ImageSequencer& image, int64_t max_context, const PplOptions& o) {
  std::vector<Span> spans;
  for (const rt::ImageTextRecord& r : rt::parse_image_text_records(read_text_input(file), file, "text")) {
    Span s;
    if (!r.image.empty()) {
      rt::MultimodalSequence m = image(r.image, tok.encode(r.text, false));
      s.tokens = std::move(m.tokens);
      s.first_scored = m.first_text - 1;  // the prediction of the first text token on
      s.mm = std::make_shared<const rt::MultimodalInputs>(std::move(m.inputs));
    } else {
      s.tokens = tok.encode(r.text, tok.bos_id() >= 0);
    }
    if (max_context > 0 && static_cast<int64_t>(s.tokens.size()) > max_context)
      throw invalid_input(r.where, "the record takes " + std::to_string(s.tokens.size()) +
                                       " tokens, more than the model's context " + std::to_string(max_context));
    if (s.scored() > 0) spans.push_back(std::move(s));
  }
  if (spans.empty()) throw invalid_input(file.string(), "no record scores a token");
  if (o.max_spans > 0 && static_cast<int64_t>(spans.size()) > o.max_spans) spans.resize(static_cast<size_t>(o.max_spans));
  return spans;
}

}  // namespace qf::eval
