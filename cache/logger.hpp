// logger.hpp (cache): smla's one logger, "smla" on stderr (stdout belongs to the caller, and to the tools' listings and
// JSON), level from SMLA_LOG_LEVEL. It lives in this, the lowest, library so that every part of smla logs the same way
// whether or not a Runtime exists: the disk cache in smla-cache and smla-warmup once logged through spdlog's default
// logger, on stdout ahead of `smla-warmup --json`'s document, and deaf to SMLA_LOG_LEVEL.
#pragma once
#include <spdlog/spdlog.h>

namespace smla::cache {

/// The "smla" logger: the one registered under that name if there is one (a test may put its own there), else made
/// now and registered.
spdlog::logger& logger();

/// Whether `name` is a level SMLA_LOG_LEVEL may name (spdlog reads an unknown name as "off": a typo would silence
/// every warning, so an unknown one is ignored and the default, warn, kept).
bool is_log_level(const char* name);

}  // namespace smla::cache
