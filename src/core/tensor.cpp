#include "core/tensor.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace qf {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw invalid_input("", "negative dimension in shape " + shape_str(shape));
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d)
      throw invalid_input("", "shape " + shape_str(shape) + " has too many elements");
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  size_t n = t.nbytes();
  std::shared_ptr<uint8_t[]> buf(new uint8_t[n > 0 ? n : 1]());
  t.data_ = buf.get();
  t.owner_ = std::shared_ptr<const void>(buf, buf.get());
  t.writable_ = true;
  return t;
}

Tensor Tensor::from_f32(const std::vector<float>& values, Shape shape) {
  Tensor t = zeros(DType::F32, std::move(shape));
  if (static_cast<size_t>(t.numel()) != values.size())
    throw invalid_input("tensor", std::to_string(values.size()) + " values for shape " + shape_str(t.shape()));
  std::copy(values.begin(), values.end(), t.mutable_data_as<float>());
  return t;
}

Tensor Tensor::view_of(std::shared_ptr<const void> owner, const void* data, DType dtype, Shape shape) {
  Tensor t;
  t.owner_ = std::move(owner);
  t.data_ = data;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  shape_numel(t.shape_);
  return t;
}

int64_t Tensor::dim(int i) const {
  int n = ndim();
  if (i < 0) i += n;
  if (i < 0 || i >= n) throw Error(ErrorKind::Internal, "tensor axis " + std::to_string(i) + " out of range for shape " + shape_str(shape_));
  return shape_[static_cast<size_t>(i)];
}

void* Tensor::mutable_data() {
  if (!writable_) throw Error(ErrorKind::Internal, "tensor is a read-only view");
  return const_cast<void*>(data_);
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  if (shape_.empty() || begin < 0 || end < begin || end > shape_[0])
    throw Error(ErrorKind::Internal, "rows [" + std::to_string(begin) + ", " + std::to_string(end) + ") out of range for " + shape_str(shape_));
  Shape inner(shape_.begin() + 1, shape_.end());
  size_t row_bytes = static_cast<size_t>(shape_numel(inner)) * dtype_size(dtype_);
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.data_ = static_cast<const uint8_t*>(data_) + static_cast<size_t>(begin) * row_bytes;
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  if (shape_numel(shape) != numel())
    throw Error(ErrorKind::Internal, "cannot reshape " + shape_str(shape_) + " to " + shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  Tensor out = zeros(dtype, shape_);
  if (dtype == dtype_) {
    std::memcpy(out.mutable_data(), data_, nbytes());
  } else {
    convert(data_, dtype_, out.mutable_data(), dtype, static_cast<size_t>(numel()));
  }
  return out;
}

std::vector<float> Tensor::to_f32_vector() const {
  std::vector<float> v(static_cast<size_t>(numel()));
  if (dtype_ == DType::F32) {
    if (!v.empty()) std::memcpy(v.data(), data_, nbytes());
  } else {
    convert(data_, dtype_, v.data(), DType::F32, v.size());
  }
  return v;
}

}  // namespace qf
