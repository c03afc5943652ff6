// log.cpp: creates the "smla" logger once.
#include "log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>

#include "env.hpp"

namespace smla {

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::get("smla");
    if (!l) {
      try {
        l = spdlog::stderr_color_mt("smla");
      } catch (const spdlog::spdlog_ex&) {  // registered meanwhile by another thread
        l = spdlog::get("smla");
      }
    }
    l->set_level(spdlog::level::from_str(runtime_env().log_level));
    l->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%l] %v");
    return l;
  }();
  return *logger;
}

}  // namespace smla
