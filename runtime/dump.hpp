// dump.hpp: where a source that failed to compile is written, for the error message.
#pragma once
#include <string>

#include "backend.hpp"

namespace smla {
/// Writes the translation unit and its headers into a directory of their own under $SMLA_DUMP_DIR (default
/// $TMPDIR/smla-failed-<uid>, this user's alone: made with mode 0700, refused when another user owns it or it is a
/// link), named by the source's stem, the target and a hash of every byte, the headers beside the source under their
/// names (relative paths without "..": no file lands outside it; none is written through a link); returns the path
/// of the source, or "(not written: why)". Never throws. Only the newest 32 dumps are kept in the directory (older
/// ones, by when they were last written, are removed with this one's writing).
/// The one writer of NVRTC, hipRTC and the hipRTC worker process (which links this file: runtime/hip/CMakeLists.txt).
std::string dump_failed_source(const RenderedSource& src, const std::string& target);
}  // namespace smla
