// The report's inputs for quantforge.chart (qf.report()): the C++ parser and
// output checks that `quantforge report` uses, so that Python only draws rows
// that were read and validated the same way.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "eval/report_input.h"
#include "to_python.h"

namespace py = pybind11;

namespace qf::python {

void register_report_bindings(py::module_& m) {
  m.def(
      "_report_rows",
      [](const std::vector<std::string>& paths, const std::string& out, bool force) {
        const eval::ReportInputs in = eval::load_report_inputs(paths);
        eval::check_report_output(out, in.read, force, "out");
        return to_python(eval::report_rows_json(in));  // a path that is not UTF-8 shows U+FFFD
      },
      py::arg("paths"), py::arg("out"), py::arg("force") = false,
      "Reads and validates the report's inputs and checks its output folder (nothing is written); returns "
      "{'reference': row, 'outputs': [row, ...]}, the outputs sorted by size.");
}

}  // namespace qf::python
