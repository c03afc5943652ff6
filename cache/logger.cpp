// logger.cpp (cache): see logger.hpp.
#include "logger.hpp"

#include <pthread.h>
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

namespace {
// Every lookup of the logger goes through this mutex, which a fork() takes first (pthread_atfork): so no thread of
// smla is inside spdlog's registry, holding its mutex, when the process forks. A fork while a thread was there (any
// plan() logs, even a line its level filters out) left the child blocked in its first log() for ever, even in a
// Runtime of its own. The logger is still looked up at every call, so a host that registers or replaces "smla" later
// is followed.
std::mutex& lookup_mutex() {
  static std::mutex* m = new std::mutex;  // never destroyed: a log line of a static's destructor at exit still works
  return *m;
}
void hold_lookups_across_fork() {
  static std::once_flag once;
  std::call_once(once, [] {
    ::pthread_atfork([] { lookup_mutex().lock(); }, [] { lookup_mutex().unlock(); },
                     [] { lookup_mutex().unlock(); });
  });
}
}  // namespace

spdlog::logger& logger() {
  hold_lookups_across_fork();
  std::lock_guard<std::mutex> g(lookup_mutex());
  if (auto l = spdlog::get("smla")) return *l;  // kept alive by the registry
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
