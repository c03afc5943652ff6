// writable_dir.hpp: whether a process could write into a directory, asked without writing anything (warm-up's dry
// run, the tuning db's check before a sweep).
#pragma once
#include <string>

namespace smla {

/// "" when `dir` is a directory this process may make files in, or is absent below one it may (made on the first
/// write); else why not, naming `dir` or the ancestor at fault. Beyond access(W_OK), which root passes everywhere: a
/// read-only mount, or a kernel pseudo file system (/proc, /sys...) where nothing can be made.
std::string dir_write_problem(const std::string& dir);

}  // namespace smla
