// The tool's version (CMake's PROJECT_VERSION), for reports and --version.
#pragma once

namespace qf {

const char* version();

}  // namespace qf
