// log.cpp: the runtime's name for the library's one logger (cache/logger.hpp: the cache, the lowest library, makes it).
#include "log.hpp"

#include "logger.hpp"

namespace smla {

spdlog::logger& log() { return cache::logger(); }

}  // namespace smla
