// Errors: one exception type carrying the exit code class the CLI maps to (see docs/CLI.md).
// Every message names the file, the field or tensor, what was expected and what was found.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tessera {

enum class ErrorKind : int {
  Usage = 1,     // bad command line / bad request
  BadInput = 2,  // malformed or unsupported file / model
  Runtime = 3,   // device, I/O or other failure while running
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }
  int exit_code() const { return static_cast<int>(kind_); }

 private:
  ErrorKind kind_;
};

// cat("a", 1, 'b') -> "a1b": message building without iostream noise at call sites.
template <class... A>
std::string cat(A&&... a) {
  std::ostringstream s;
  (s << ... << std::forward<A>(a));
  return s.str();
}

template <class... A>
[[noreturn]] void bad_input(A&&... a) {
  throw Error(ErrorKind::BadInput, cat(std::forward<A>(a)...));
}
template <class... A>
[[noreturn]] void usage_error(A&&... a) {
  throw Error(ErrorKind::Usage, cat(std::forward<A>(a)...));
}
template <class... A>
[[noreturn]] void runtime_error(A&&... a) {
  throw Error(ErrorKind::Runtime, cat(std::forward<A>(a)...));
}

}  // namespace tessera
