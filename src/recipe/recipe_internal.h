// Helpers shared by the recipe sources; not part of the public interface.
#pragma once

#include <string>

namespace qf {

// Empty when `regex` compiles (PCRE2, anchored like Python's re.match),
// else "invalid regular expression: <reason> at offset <n>".
std::string regex_error(const std::string& regex);

}  // namespace qf
