// env.cpp: reads the runtime's knobs once.
#include "env.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "check.hpp"
#include "logger.hpp"  // smla_cache's: is_log_level

namespace smla {

const RuntimeEnv& runtime_env() {
  static const RuntimeEnv env = [] {
    RuntimeEnv e;
    if (const char* v = std::getenv("SMLA_KERNEL_SRC_DIR")) e.kernel_src_dir = v;
    auto ignored = [&e](const char* name, const char* v, const char* expected) {
      e.warnings.push_back(std::string("ignoring ") + name + "='" + v + "' (expected " + expected + ")");
    };
    if (const char* v = std::getenv("SMLA_INTERM_BUDGET_BYTES")) {
      char* end = nullptr;
      errno = 0;
      const unsigned long long b = std::strtoull(v, &end, 10);  // past 2^64 - 1: ULLONG_MAX and ERANGE (no budget)
      if (*v >= '0' && *v <= '9' && end && *end == '\0' && errno != ERANGE && b > 0) e.interm_budget = size_t(b);
      else ignored("SMLA_INTERM_BUDGET_BYTES", v, "a positive number of bytes");
    }
    if (const char* v = std::getenv("SMLA_LOG_LEVEL")) {
      // spdlog reads an unknown name as "off": a typo would silence every warning. The logger reads the variable
      // itself (cache/logger.cpp) and keeps warn for such a value; here only the warning a Runtime logs.
      if (!cache::is_log_level(v)) ignored("SMLA_LOG_LEVEL", v, "trace, debug, info, warn, error, critical or off");
    }
    if (const char* v = std::getenv("SMLA_SIDE_STREAM")) {
      if (std::strcmp(v, "0") == 0) e.side_stream = false;
      else if (std::strcmp(v, "1") == 0) e.side_stream = true;
      else ignored("SMLA_SIDE_STREAM", v, "0 or 1");
    }
    return e;
  }();
  return env;
}

}  // namespace smla
