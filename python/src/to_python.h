// JSON from the library as Python objects, for the extension's sources
// (module.cpp, report_binding.cpp).
#pragma once

#include <pybind11/pybind11.h>

namespace qf::python {

// Through Python's json module. Strings that are not UTF-8 (a path given as
// bytes, say) come back with U+FFFD in place of the bad bytes rather than
// failing the whole result.
template <class Json>
pybind11::object to_python(const Json& j) {
  return pybind11::module_::import("json").attr("loads")(j.dump(-1, ' ', false, Json::error_handler_t::replace));
}

}  // namespace qf::python
