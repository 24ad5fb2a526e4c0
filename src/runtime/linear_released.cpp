// The stand-in for a Linear whose weights quantize has written out and let
// go of (runtime/linear.h, make_released_linear).
#include "core/error.h"
#include "runtime/linear.h"

namespace qf::rt {
namespace {

class ReleasedLinear final : public Linear {
 public:
  ReleasedLinear(int64_t in, int64_t out, std::vector<float> bias, std::string format, std::string name)
      : Linear(in, out), bias_(std::move(bias)), format_(std::move(format)), name_(std::move(name)) {}

  void forward(const float*, int64_t, float*, ThreadPool&) const override { fail(); }
  void decode_row(int64_t, float*) const override { fail(); }
  uint64_t weight_bytes() const override { return 0; }
  std::string format() const override { return format_; }
  bool quantized() const override { return true; }
  std::vector<float> bias_values() const override { return bias_; }

 private:
  [[noreturn]] void fail() const {
    throw Error(ErrorKind::Internal, name_ + ": the weights were written out and released; this Linear cannot run");
  }
  std::vector<float> bias_;
  std::string format_, name_;
};

}  // namespace

std::unique_ptr<Linear> make_released_linear(int64_t in, int64_t out, std::vector<float> bias, std::string format,
                                             std::string name) {
  return std::make_unique<ReleasedLinear>(in, out, std::move(bias), std::move(format), std::move(name));
}

}  // namespace qf::rt
