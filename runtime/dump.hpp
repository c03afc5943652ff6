// dump.hpp: where a source that failed to compile is written, for the error message.
#pragma once
#include <string>

#include "backend.hpp"

namespace smla {
/// Writes the translation unit and its headers under $SMLA_DUMP_DIR (default
/// $TMPDIR/smla-failed) and returns the path of the main file ("(not written)" on failure).
std::string dump_failed_source(const RenderedSource& src, const std::string& target);
}  // namespace smla
