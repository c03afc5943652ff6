// hip_log.hpp: warnings of the HIP backend, through the library's logger.
#pragma once
#include <string>

namespace smla::hip::detail {

/// Logs `msg` as a warning through the "smla" logger, as the disk cache does (cache::logger(): the registered one,
/// else one it makes on stderr at SMLA_LOG_LEVEL).
void warn(const std::string& msg);

/// warn(msg), once per process for each distinct message.
void warn_once(const std::string& msg);

}  // namespace smla::hip::detail
