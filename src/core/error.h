// qf::Error: the one exception type users see. It carries a kind that the CLI
// maps to an exit code, and a message that says what, where and what to do.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace qf {

enum class ErrorKind {
  Internal = 1,     // a bug: should never happen
  Usage = 2,        // bad command line (CLI11 uses 2 as well)
  InvalidInput = 3, // malformed or inconsistent file, wrong shape, bad value
  Unsupported = 4,  // well-formed but not supported (architecture, dtype, feature)
  Io = 5,           // cannot open, read, write or rename
  NotFound = 6,     // a named file, tensor or key is missing
  GateFailed = 10,  // an evaluation gate (--max-ppl-delta, --max-kld, ...) failed
};

// Process exit code for an error kind (documented in README.md).
int exit_code(ErrorKind kind);
const char* kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  explicit Error(const std::string& message) : Error(ErrorKind::InvalidInput, message) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Shorthands: `throw invalid_input(path, "header length 12 exceeds file size 8")`
// produce "path: header length ...".
Error invalid_input(const std::string& where, const std::string& what);
Error unsupported(const std::string& where, const std::string& what);
Error io_error(const std::string& where, const std::string& what);
Error not_found(const std::string& where, const std::string& what);

// `text` with control characters shown as '?', so that a value quoted in a
// message keeps the message on one line.
std::string printable_text(std::string_view text);

}  // namespace qf
