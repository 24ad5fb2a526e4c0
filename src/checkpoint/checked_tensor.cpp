#include "checkpoint/checked_tensor.h"

#include "core/error.h"

namespace qf {

Tensor fetch_checked(const Checkpoint& ck, const std::string& name, std::initializer_list<DType> dtypes, const Shape& shape) {
  const TensorInfo& info = ck.info(name);
  bool ok = false;
  std::string want;
  for (DType d : dtypes) {
    ok = ok || info.dtype == d;
    if (!want.empty()) want += " or ";
    want += safetensors_dtype_name(d);
  }
  if (!ok) throw invalid_input(name, std::string("dtype is ") + safetensors_dtype_name(info.dtype) + ", expected " + want);
  if (info.shape != shape) throw invalid_input(name, "shape is " + shape_str(info.shape) + ", expected " + shape_str(shape));
  return ck.tensor(name);
}

}  // namespace qf
