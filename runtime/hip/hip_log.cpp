// hip_log.cpp: see hip_log.hpp.
#include "hip_log.hpp"

#include <spdlog/spdlog.h>

#include <mutex>
#include <set>

namespace smla::hip::detail {

void warn(const std::string& msg) {
  if (auto l = spdlog::get("smla")) l->warn("{}", msg);
  else spdlog::default_logger_raw()->warn("{}", msg);
}

void warn_once(const std::string& msg) {
  static std::mutex m;
  static std::set<std::string> said;
  {
    std::lock_guard<std::mutex> lk(m);
    if (!said.insert(msg).second) return;
  }
  warn(msg);
}

}  // namespace smla::hip::detail
