// logger.cpp (cache): see logger.hpp.
#include "logger.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <atomic>
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
  // Looked up in spdlog's registry once, then held here: the registry's lookup takes its mutex on every call, and a
  // fork() while another thread held it (any plan() logs, even a line filtered out) left the child blocked in its
  // first log() for ever, even in a Runtime of its own. Never destroyed (a log line of a static's destructor at exit
  // finds it still there).
  static std::atomic<spdlog::logger*> cached{nullptr};
  if (spdlog::logger* l = cached.load(std::memory_order_acquire)) return *l;
  static std::mutex m;
  std::lock_guard<std::mutex> g(m);
  if (spdlog::logger* l = cached.load(std::memory_order_acquire)) return *l;
  std::shared_ptr<spdlog::logger> l = spdlog::get("smla");  // the host's own "smla" logger, if it made one first
  if (!l) {
    try {
      l = spdlog::stderr_color_mt("smla");
      const char* v = std::getenv("SMLA_LOG_LEVEL");
      l->set_level(spdlog::level::from_str(v && is_log_level(v) ? v : "warn"));
      l->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%l] %v");
    } catch (const spdlog::spdlog_ex&) {  // registered meanwhile outside this function
      l = spdlog::get("smla");
    }
  }
  auto* keep = new std::shared_ptr<spdlog::logger>(std::move(l));  // leaked on purpose: see above
  cached.store(keep->get(), std::memory_order_release);
  return **keep;
}

}  // namespace smla::cache
