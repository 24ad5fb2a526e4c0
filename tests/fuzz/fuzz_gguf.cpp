// Fuzz target: a .gguf file. The reader (header, metadata, tensor infos and
// placement), every typed getter on every key, `inspect` (the JSON and the
// report), the metadata -> model config validation and, when that passes,
// the runtime's loader; the GGUF tokenizer metadata -> Vocab -> tokenizer.
#include "formats/gguf/gguf.h"
#include "inspect/gguf_inspect.h"
#include "formats/tokenizer/tokenizer.h"
#include "fuzz_util.h"
#include "runtime/model.h"

namespace {

void getters(const qf::GgufFile& f) {
  for (const std::string& k : f.keys()) {
    const qf::GgufValue& v = f.value(k);
    qf::fuzz::run([&] { f.get_string(k); });
    qf::fuzz::run([&] { f.get_u32(k); });
    qf::fuzz::run([&] { f.get_i64(k); });
    qf::fuzz::run([&] { f.get_f32(k); });
    qf::fuzz::run([&] { f.get_bool(k); });
    if (v.type == qf::GgufType::Array) {
      if (f.get_array_size(k) != v.count) qf::fuzz::fail("array size mismatch");
      qf::fuzz::run([&] { f.get_string_array(k); });
      qf::fuzz::run([&] { f.get_int_array(k); });
      qf::fuzz::run([&] { f.get_float_array(k); });
    }
  }
  for (const qf::GgufTensorInfo& t : f.tensors()) {
    const uint8_t* p = f.tensor_data(t);
    if (t.nbytes > 0) {
      volatile uint8_t first = p[0], last = p[t.nbytes - 1];  // inside the mapping (ASan)
      (void)first, (void)last;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = qf::fuzz::write_file("gguf/model.gguf", data, size);
  bool config_ok = false;
  qf::fuzz::run([&] {
    const qf::GgufFile f = qf::GgufFile::open(path);
    getters(f);
    qf::fuzz::run([&] {
      qf::rt::gguf_model_config(f);
      config_ok = true;
    });
  });
  qf::fuzz::run([&] {
    const nlohmann::json info = qf::inspect_gguf(path);
    qf::format_gguf_report(info);
    info.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
  });
  if (config_ok) qf::fuzz::run([&] { qf::rt::load_gguf_model(path); });
  qf::fuzz::run([&] {
    const auto tok = qf::make_tokenizer(qf::vocab_from_gguf(path));
    const std::vector<int32_t> ids = tok->encode("Hello world, <s> \xC3\xA9t\xC3\xA9 \xFF 123!", true);
    tok->decode(ids);
    for (int32_t id : ids) tok->piece(id);
  });
  return 0;
}
