// parse_image_preprocess_config: preprocessor_config.json -> ImagePreprocessConfig.
//
// transformers fills every key an image processor leaves out with its
// defaults, so a file that names only what differs is valid; the same
// defaults apply here. What transformers would refuse or misread (a wrong
// type, a size of 0, a std of 0, a filter Pillow does not resample with) is
// an error naming the file and the key.
#include <cmath>

#include "core/error.h"
#include "core/io.h"
#include "runtime/vision/anyres.h"
#include "runtime/vision/image_preprocess.h"

namespace qf::rt {
namespace {

using nlohmann::json;

struct Keys {
  const json& j;
  const std::string& where;

  const json* get(const char* k) const {
    auto it = j.find(k);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] void bad(const std::string& k, const std::string& want, const json& v) const {
    throw invalid_input(where, "'" + k + "' must be " + want + ", got " + printable_text(v.dump()));
  }
  void boolean(const char* k, bool& out) const {
    if (const json* v = get(k)) {
      if (!v->is_boolean()) bad(k, "true or false", *v);
      out = v->get<bool>();
    }
  }
  int64_t positive(const std::string& k, const json& v) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (int64_t(1) << 40))
      bad(k, "a positive integer", v);
    return v.get<int64_t>();
  }
  void integer(const char* k, int64_t& out) const {
    if (const json* v = get(k)) out = positive(k, *v);
  }
  // A number, or a list of 3 numbers (one per channel); a single number
  // applies to every channel, as transformers' normalize takes it.
  void triple(const char* k, std::array<double, 3>& out, bool nonzero) const {
    const json* v = get(k);
    if (!v) return;
    std::array<double, 3> r{};
    if (v->is_number()) {
      r.fill(v->get<double>());
    } else if (v->is_array() && v->size() == 3) {
      for (int c = 0; c < 3; ++c) {
        if (!(*v)[c].is_number()) bad(k, "a number or a list of 3 numbers", *v);
        r[c] = (*v)[c].get<double>();
      }
    } else {
      bad(k, "a number or a list of 3 numbers", *v);
    }
    for (double x : r)
      if (!std::isfinite(x) || (nonzero && x == 0)) bad(k, nonzero ? "finite and non-zero" : "finite", *v);
    out = r;
  }
};

ImageProcessorKind kind_of(const std::string& type, const std::string& where, ImageProcessorKind expected) {
  if (type.empty()) return expected;
  if (type == "Qwen2VLImageProcessor" || type == "Qwen2VLImageProcessorFast") return ImageProcessorKind::Qwen2VL;
  if (type == "CLIPImageProcessor" || type == "CLIPImageProcessorFast") return ImageProcessorKind::Clip;
  if (type == "LlavaNextImageProcessor" || type == "LlavaNextImageProcessorFast") return ImageProcessorKind::LlavaNext;
  throw unsupported(where, "image_processor_type '" + printable_text(type) +
                               "' is not supported (supported: Qwen2VLImageProcessor, CLIPImageProcessor, "
                               "LlavaNextImageProcessor)");
}

const char* kind_name(ImageProcessorKind k) {
  switch (k) {
    case ImageProcessorKind::Qwen2VL: return "Qwen2VLImageProcessor";
    case ImageProcessorKind::Clip: return "CLIPImageProcessor";
    case ImageProcessorKind::LlavaNext: return "LlavaNextImageProcessor";
  }
  return "?";
}

void parse_qwen(const Keys& r, ImagePreprocessConfig& c) {
  // Newer files give the pixel budget as size.shortest_edge/longest_edge
  // (older ones as size.min_pixels/max_pixels); top-level min_pixels and
  // max_pixels override either, as the processor's constructor does.
  if (const json* s = r.get("size")) {
    if (!s->is_object()) r.bad("size", "an object", *s);
    for (const auto& [key, field] : {std::pair{"shortest_edge", &c.min_pixels}, std::pair{"min_pixels", &c.min_pixels},
                                     std::pair{"longest_edge", &c.max_pixels}, std::pair{"max_pixels", &c.max_pixels}})
      if (s->contains(key) && !(*s)[key].is_null()) *field = r.positive(std::string("size.") + key, (*s)[key]);
  }
  r.integer("min_pixels", c.min_pixels);
  r.integer("max_pixels", c.max_pixels);
  if (c.min_pixels > c.max_pixels)
    throw invalid_input(r.where, "min_pixels " + std::to_string(c.min_pixels) + " exceeds max_pixels " +
                                     std::to_string(c.max_pixels));
  r.integer("patch_size", c.patch_size);
  r.integer("temporal_patch_size", c.temporal_patch_size);
  r.integer("merge_size", c.merge_size);
}

// CLIP's size: {"shortest_edge": n}, {"height": h, "width": w} or a bare
// integer (an older file: the shortest edge); crop_size: {"height", "width"}
// or a bare integer (a square).
void parse_clip(const Keys& r, ImagePreprocessConfig& c) {
  if (const json* s = r.get("size")) {
    if (s->is_number_integer()) {
      c.shortest_edge = r.positive("size", *s);
    } else if (s->is_object() && s->contains("shortest_edge")) {
      c.shortest_edge = r.positive("size.shortest_edge", (*s)["shortest_edge"]);
    } else if (s->is_object() && s->contains("height") && s->contains("width")) {
      c.shortest_edge = 0;
      c.size_height = r.positive("size.height", (*s)["height"]);
      c.size_width = r.positive("size.width", (*s)["width"]);
    } else {
      r.bad("size", "an integer or an object with 'shortest_edge' or 'height' and 'width'", *s);
    }
  }
  r.boolean("do_center_crop", c.do_center_crop);
  if (const json* s = r.get("crop_size")) {
    if (s->is_number_integer()) {
      c.crop_height = c.crop_width = r.positive("crop_size", *s);
    } else if (s->is_object() && s->contains("height") && s->contains("width")) {
      c.crop_height = r.positive("crop_size.height", (*s)["height"]);
      c.crop_width = r.positive("crop_size.width", (*s)["width"]);
    } else {
      r.bad("crop_size", "an integer or an object with 'height' and 'width'", *s);
    }
  }
}

// LlavaNextImageProcessor: CLIP's keys for the tiles, and the resolutions,
// each a whole number of crop_size.height tiles (divide_to_patches' side).
void parse_llava_next(const Keys& r, ImagePreprocessConfig& c) {
  parse_clip(r, c);
  if (const json* p = r.get("image_grid_pinpoints")) {
    c.grid_pinpoints = parse_grid_pinpoints(*p, r.where, "image_grid_pinpoints");
    check_grid_pinpoints(c.grid_pinpoints, c.crop_height, r.where, "crop_size.height");
  }
}

}  // namespace

ImagePreprocessConfig parse_image_preprocess_config(const json& j, const std::string& where,
                                                    ImageProcessorKind expected) {
  if (!j.is_object()) throw invalid_input(where, "an image processor config must be a JSON object");
  const Keys r{j, where};
  ImagePreprocessConfig c;
  c.where = where;
  if (const json* t = r.get("image_processor_type")) {
    if (!t->is_string()) r.bad("image_processor_type", "a string", *t);
    c.processor_type = t->get<std::string>();
  }
  c.kind = kind_of(c.processor_type, where, expected);
  if (c.kind != expected)
    throw invalid_input(where, "image_processor_type '" + c.processor_type + "' is not the processor of this model (" +
                                   kind_name(expected) + ")");
  r.boolean("do_resize", c.do_resize);
  r.boolean("do_rescale", c.do_rescale);
  r.boolean("do_normalize", c.do_normalize);
  if (const json* v = r.get("resample")) {
    if (!v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() > 5) r.bad("resample", "0 .. 5", *v);
    if (v->get<int64_t>() == 0)
      throw unsupported(where, "'resample': 0 (NEAREST) is not supported (supported: 1 LANCZOS, 2 BILINEAR, "
                               "3 BICUBIC, 4 BOX, 5 HAMMING)");
    c.resample = static_cast<PilFilter>(v->get<int64_t>());
  }
  if (const json* v = r.get("rescale_factor")) {
    if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() <= 0)
      r.bad("rescale_factor", "a positive number", *v);
    c.rescale_factor = v->get<double>();
  }
  r.triple("image_mean", c.image_mean, false);
  r.triple("image_std", c.image_std, true);
  if (c.kind == ImageProcessorKind::Qwen2VL)
    parse_qwen(r, c);
  else if (c.kind == ImageProcessorKind::LlavaNext)
    parse_llava_next(r, c);
  else
    parse_clip(r, c);
  return c;
}

ImagePreprocessConfig load_image_preprocess_config(const std::filesystem::path& model_dir,
                                                   ImageProcessorKind expected) {
  const std::filesystem::path path = model_dir / "preprocessor_config.json";
  if (!path_exists(path))
    throw not_found(path.string(), "a vision-language model needs its image processor's preprocessor_config.json");
  json j;
  try {
    j = json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    throw invalid_input(path.string(), std::string("not valid JSON: ") + e.what());
  }
  return parse_image_preprocess_config(j, path.string(), expected);
}

}  // namespace qf::rt
