#include "core/error.h"

namespace qf {

int exit_code(ErrorKind kind) { return static_cast<int>(kind); }

const char* kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::Internal: return "internal error";
    case ErrorKind::Usage: return "usage error";
    case ErrorKind::InvalidInput: return "invalid input";
    case ErrorKind::Unsupported: return "unsupported";
    case ErrorKind::Io: return "i/o error";
    case ErrorKind::NotFound: return "not found";
    case ErrorKind::GateFailed: return "gate failed";
  }
  return "error";
}

// Built with append(): GCC 12's -Wrestrict misfires on `a + ": " + b` here.
static std::string join(const std::string& where, const std::string& what) {
  if (where.empty()) return what;
  std::string s;
  s.reserve(where.size() + 2 + what.size());
  s.append(where).append(": ").append(what);
  return s;
}

Error invalid_input(const std::string& where, const std::string& what) {
  return Error(ErrorKind::InvalidInput, join(where, what));
}
Error unsupported(const std::string& where, const std::string& what) {
  return Error(ErrorKind::Unsupported, join(where, what));
}
Error io_error(const std::string& where, const std::string& what) {
  return Error(ErrorKind::Io, join(where, what));
}
Error not_found(const std::string& where, const std::string& what) {
  return Error(ErrorKind::NotFound, join(where, what));
}

std::string printable_text(std::string_view text) {
  std::string shown;
  shown.reserve(text.size());
  for (char c : text) shown += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  return shown;
}

}  // namespace qf
