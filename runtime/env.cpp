// env.cpp: reads the runtime's knobs once.
#include "env.hpp"

#include <cstdlib>

#include "check.hpp"

namespace smla {

const RuntimeEnv& runtime_env() {
  static const RuntimeEnv env = [] {
    RuntimeEnv e;
    if (const char* v = std::getenv("SMLA_KERNEL_SRC_DIR")) e.kernel_src_dir = v;
    if (const char* v = std::getenv("SMLA_INTERM_BUDGET_BYTES")) {
      char* end = nullptr;
      unsigned long long b = std::strtoull(v, &end, 10);
      if (end && *end == '\0' && b > 0) e.interm_budget = size_t(b);
    }
    if (const char* v = std::getenv("SMLA_LOG_LEVEL")) e.log_level = v;
    if (const char* v = std::getenv("SMLA_SIDE_STREAM")) e.side_stream = std::string(v) != "0";
    return e;
  }();
  return env;
}

}  // namespace smla
