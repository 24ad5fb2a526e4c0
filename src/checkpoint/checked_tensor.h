// Small helpers the checkpoint readers share: fetch a tensor after checking
// its dtype and shape (errors name the tensor), and copy its elements out.
#pragma once

#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "formats/safetensors.h"

namespace qf {

// The checkpoint tensor `name`; InvalidInput naming it when its dtype is not
// one of `dtypes` or its shape is not `shape`; NotFound when absent.
Tensor fetch_checked(const Checkpoint& ck, const std::string& name, std::initializer_list<DType> dtypes, const Shape& shape);

template <typename T>
std::vector<T> copy_elements(const Tensor& t) {
  std::vector<T> v(static_cast<size_t>(t.numel()));
  if (!v.empty()) std::memcpy(v.data(), t.data(), v.size() * sizeof(T));
  return v;
}

}  // namespace qf
