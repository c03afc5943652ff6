// hip_log.cpp: see hip_log.hpp.
#include "hip_log.hpp"

#include "logger.hpp"  // smla_cache's

#include <mutex>
#include <set>

namespace smla::hip::detail {

void warn(const std::string& msg) {
  cache::logger().warn("{}", msg);
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
