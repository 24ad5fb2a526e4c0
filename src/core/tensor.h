// Tensor: a shape, a dtype and a contiguous row-major byte range whose storage
// is shared (an owned buffer or a memory-mapped file). Views (row ranges,
// reshapes) are zero-copy and keep the storage alive.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace qf {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);  // throws on negative or overflowing dims
std::string shape_str(const Shape& shape);  // "[4096, 256]"

class Tensor {
 public:
  Tensor() = default;
  // A zero-filled owned tensor.
  static Tensor zeros(DType dtype, Shape shape);
  // An owned F32 tensor holding a copy of `values` (InvalidInput when their
  // count is not the shape's).
  static Tensor from_f32(const std::vector<float>& values, Shape shape);
  // A view on memory owned by `owner` (for example a MappedFile); no copy.
  static Tensor view_of(std::shared_ptr<const void> owner, const void* data, DType dtype, Shape shape);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const;  // negative i counts from the end
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool empty() const { return data_ == nullptr && numel() == 0; }

  const void* data() const { return data_; }
  // Writable access; only for owned tensors (throws for mapped views).
  void* mutable_data();
  template <typename T> const T* data_as() const { return static_cast<const T*>(data_); }
  template <typename T> T* mutable_data_as() { return static_cast<T*>(mutable_data()); }

  // Rows [begin, end) of the first axis; zero-copy.
  Tensor rows(int64_t begin, int64_t end) const;
  // Same elements, new shape (same numel); zero-copy.
  Tensor reshape(Shape shape) const;
  // A deep copy converted to `dtype` (bit-exact conversions of core/dtype.h).
  Tensor to(DType dtype) const;
  // Elements as f32 (converting), for tests and reference code.
  std::vector<float> to_f32_vector() const;

 private:
  std::shared_ptr<const void> owner_;
  const void* data_ = nullptr;
  bool writable_ = false;
  DType dtype_ = DType::F32;
  Shape shape_;
};

}  // namespace qf
