// logger.cpp (cache): see logger.hpp.
#include "logger.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

namespace smla::cache {

bool is_log_level(const char* name) {
  static const char* const levels[] = {"trace", "debug", "info", "warn", "warning", "error", "err", "critical", "off"};
  for (const char* l : levels)
    if (std::strcmp(name, l) == 0) return true;
  return false;
}

spdlog::logger& logger() {
  if (auto l = spdlog::get("smla")) return *l;  // kept alive by the registry
  static std::mutex m;
  std::lock_guard<std::mutex> g(m);
  if (auto l = spdlog::get("smla")) return *l;
  std::shared_ptr<spdlog::logger> l;
  try {
    l = spdlog::stderr_color_mt("smla");
  } catch (const spdlog::spdlog_ex&) {  // registered meanwhile outside this function
    return *spdlog::get("smla");
  }
  const char* v = std::getenv("SMLA_LOG_LEVEL");
  l->set_level(spdlog::level::from_str(v && is_log_level(v) ? v : "warn"));
  l->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%l] %v");
  return *l;
}

}  // namespace smla::cache
