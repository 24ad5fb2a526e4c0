#include "core/version.h"

namespace qf {

const char* version() { return QF_VERSION; }

}  // namespace qf
