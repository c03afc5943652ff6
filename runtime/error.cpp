// error.cpp: smla::Error and the names of statuses and backends.
#include "smla/smla.hpp"

#include <string>

// The standard library ABI this library was built with, which smla.hpp's callers must share: each of their translation
// units refers to the symbol of its own ABI (smla.hpp), so a mismatch fails to link instead of corrupting strings.
// Here, beside smla::Error, which everything that includes smla.hpp links.
extern "C" __attribute__((visibility("default"))) const int SMLA_ABI_SYMBOL = 1;

namespace smla {

const char* status_name(Status s) {
  switch (s) {
    case Status::Ok: return "ok";
    case Status::InvalidArgument: return "invalid argument";
    case Status::Unsupported: return "unsupported";
    case Status::NoBackend: return "no backend";
    case Status::CompileError: return "compile error";
    case Status::DriverError: return "driver error";
    case Status::WorkspaceTooSmall: return "workspace too small";
    case Status::Internal: return "internal error";
  }
  return "unknown";
}

const char* backend_name(BackendKind b) {
  switch (b) {
    case BackendKind::Auto: return "auto";
    case BackendKind::Cpu: return "cpu";
    case BackendKind::Cuda: return "cuda";
    case BackendKind::Hip: return "hip";
  }
  return "unknown";
}

static std::string compose(Status status, const std::string& message, const char* file, int line,
                           const std::string& call) {
  std::string s = std::string("smla: ") + status_name(status) + ": " + message;
  if (!call.empty()) s += " [in " + call + "]";
  if (file && *file) s += " (" + std::string(file) + ":" + std::to_string(line) + ")";
  return s;
}

Error::Error(Status status, std::string message, const char* file, int line, std::string call)
    : std::runtime_error(compose(status, message, file, line, call)),
      status_(status),
      parts_(std::make_shared<const Parts>(Parts{std::move(message), std::move(call)})),
      file_(file ? file : ""),
      line_(line) {}

}  // namespace smla
