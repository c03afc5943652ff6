// private_dir.hpp: a directory of this user's alone, for the fallbacks under a shared /tmp with predictable names
// (the failed-source dumps, the cache and its node-local locks without a home directory). Another user could have
// made such a directory first, writable by them, and planted files in it (a kernel binary with a re-sealed checksum,
// a link where a dump or a lock file is written), or kept every other user out of it.
#pragma once
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace smla::cache {

/// Makes `dir` (mode 0700) when it is absent (its parent must exist) and checks it: a directory, not a link, owned by
/// this user, and (unless `group_may_write`: a directory the user named, which may be a group's) writable by no one
/// else. Empty when it may be used, else why not.
inline std::string private_dir_problem(const std::string& dir, bool group_may_write = false) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return "cannot make it: " + std::string(std::strerror(errno));
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return "cannot stat it: " + std::string(std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return "it is not a directory (a link or a file in its place)";
  if (st.st_uid != ::geteuid()) return "it belongs to another user (uid " + std::to_string(st.st_uid) + ")";
  if (!group_may_write && (st.st_mode & (S_IWGRP | S_IWOTH))) return "other users may write into it (mode " + [&] {
    char m[8];
    std::snprintf(m, sizeof m, "%04o", unsigned(st.st_mode & 07777));
    return std::string(m);
  }() + ")";
  return "";
}

}  // namespace smla::cache
