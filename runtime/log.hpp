// log.hpp: the library's logger: spdlog logger "smla" on stderr (stdout belongs to the caller),
// level from SMLA_LOG_LEVEL. The disk cache logs through it too (it is cache/logger.hpp's).
#pragma once
#include <spdlog/spdlog.h>

namespace smla {
spdlog::logger& log();
}  // namespace smla
