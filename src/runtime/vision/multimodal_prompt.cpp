#include "runtime/vision/multimodal_prompt.h"

#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/text_input.h"

namespace qf::rt {

MultimodalSequence image_text_sequence(const ModelConfig& c, ImageEmbedding image, const std::vector<int32_t>& text,
                                       std::optional<int32_t> bos) {
  if (!c.vlm) throw unsupported("config.json", "not a vision-language model: it takes no images");
  const VisionLanguageConfig& v = *c.vlm;
  if (image.hidden != c.hidden_size || static_cast<int64_t>(image.rows.size()) != image.n_rows * image.hidden)
    throw invalid_input("image", "the vision side gave rows of width " + std::to_string(image.hidden) +
                                     ", the language model takes " + std::to_string(c.hidden_size));
  if (image.grid_t * image.grid_h * image.grid_w != image.n_rows)
    throw invalid_input("image", "the image's grid " + std::to_string(image.grid_t) + " x " + std::to_string(image.grid_h) +
                                     " x " + std::to_string(image.grid_w) + " does not hold its " +
                                     std::to_string(image.n_rows) + " rows");
  MultimodalSequence out;
  std::vector<int32_t>& tok = out.tokens;
  MultimodalInputs& in = out.inputs;
  in.embeds = std::make_shared<const std::vector<float>>(std::move(image.rows));
  in.hidden = image.hidden;
  const bool mrope = !v.mrope_section.empty();
  int64_t next = 0;  // the next text token's rotary position
  auto text_token = [&](int32_t t) {
    tok.push_back(t);
    in.embed_row.push_back(-1);
    if (mrope) in.rope_pos.insert(in.rope_pos.end(), 3, next);
    ++next;
  };
  if (bos) text_token(*bos);
  if (mrope) {
    if (v.vision_start_token_id < 0 || v.vision_end_token_id < 0)
      throw unsupported("config.json", "a " + v.model_type + " config needs vision_start_token_id and vision_end_token_id");
    text_token(static_cast<int32_t>(v.vision_start_token_id));
    const int64_t s = next;
    int32_t row = 0;
    for (int64_t t = 0; t < image.grid_t; ++t)
      for (int64_t r = 0; r < image.grid_h; ++r)
        for (int64_t col = 0; col < image.grid_w; ++col) {
          tok.push_back(static_cast<int32_t>(v.image_token_id));
          in.embed_row.push_back(row++);
          in.rope_pos.insert(in.rope_pos.end(), {s + t, s + r, s + col});
        }
    next = s + std::max({image.grid_t, image.grid_h, image.grid_w});
    text_token(static_cast<int32_t>(v.vision_end_token_id));
  } else {
    for (int32_t row = 0; row < image.n_rows; ++row) {
      tok.push_back(static_cast<int32_t>(v.image_token_id));
      in.embed_row.push_back(row);
      ++next;
    }
  }
  out.first_text = static_cast<int64_t>(tok.size());
  for (int32_t t : text) text_token(t);
  return out;
}

std::vector<ImageTextRecord> parse_image_text_records(const std::string& text, const std::filesystem::path& file,
                                                      const std::string& text_field) {
  std::vector<ImageTextRecord> out;
  size_t b = 0, line_no = 0;
  while (b < text.size()) {
    size_t e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    const std::string line = text.substr(b, e - b);
    ++line_no;
    b = e + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string at = file.string() + ":" + std::to_string(line_no);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& ex) {
      throw invalid_input(at, std::string("not valid JSON: ") + ex.what());
    }
    if (!j.is_object() || !j.contains(text_field) || !j[text_field].is_string())
      throw invalid_input(at, "no string field '" + text_field + "'");
    ImageTextRecord r{j[text_field].get<std::string>(), {}, at};
    if (j.contains("image")) {
      if (!j["image"].is_string() || j["image"].get<std::string>().empty())
        throw invalid_input(at, "'image' must be the path of an image file");
      r.image = j["image"].get<std::string>();
      if (r.image.is_relative()) r.image = file.parent_path() / r.image;
    }
    out.push_back(std::move(r));
  }
  return out;
}

bool jsonl_names_images(const std::filesystem::path& file) {
  if (file.extension() != ".jsonl") return false;
  const std::string text = read_text_input(file, [](const std::string&) {});
  size_t b = 0;
  while (b < text.size()) {
    size_t e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    if (text.find("\"image\"", b) >= e) {  // not on this line
      b = e + 1;
      continue;
    }
    try {
      const nlohmann::json j = nlohmann::json::parse(text.substr(b, e - b));
      if (j.is_object() && j.contains("image")) return true;
    } catch (const nlohmann::json::exception&) {  // the reader of the records says where
    }
    b = e + 1;
  }
  return false;
}

}  // namespace qf::rt
