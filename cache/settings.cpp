// settings.cpp: every environment knob of the cache, read in one place.
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <spdlog/spdlog.h>

#include "entry_store.hpp"
#include "kernel_cache.hpp"

namespace smla::cache {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

void read_bool(const char* name, bool* out) {
  const char* v = env(name);
  if (!v) return;
  std::string s(v);
  for (char& c : s) c = char(std::tolower((unsigned char)c));
  if (s == "1" || s == "true" || s == "yes" || s == "on") *out = true;
  else if (s == "0" || s == "false" || s == "no" || s == "off") *out = false;
  else detail::log().warn("smla-cache: ignoring {}='{}' (expected 0 or 1)", name, v);
}

// Accepts 123, 64K, 512M, 4G, 1T (binary units; an optional trailing "B" or "iB").
bool parse_bytes(const std::string& s, int64_t* out) {
  size_t i = 0;
  while (i < s.size() && std::isdigit((unsigned char)s[i])) ++i;
  if (i == 0 || i > 15) return false;
  int64_t v = std::stoll(s.substr(0, i));
  std::string u = s.substr(i);
  for (char& c : u) c = char(std::toupper((unsigned char)c));
  if (u.size() >= 2 && u.substr(u.size() - 2) == "IB") u.resize(u.size() - 2);
  else if (!u.empty() && u.back() == 'B') u.pop_back();
  int shift = u.empty() ? 0 : u == "K" ? 10 : u == "M" ? 20 : u == "G" ? 30 : u == "T" ? 40 : -1;
  // An overflowing shift wrapped negative, which prune read as "evict everything".
  if (shift < 0 || v > (INT64_MAX >> shift)) return false;
  *out = v << shift;
  return true;
}

void read_bytes(const char* name, int64_t* out) {
  const char* v = env(name);
  if (!v) return;
  if (!parse_bytes(v, out))
    detail::log().warn("smla-cache: ignoring {}='{}' (expected bytes, e.g. 4G)", name, v);
}

void read_number(const char* name, double lo, double* out) {
  const char* v = env(name);
  if (!v) return;
  char* end = nullptr;
  double d = std::strtod(v, &end);
  if (end && *end == 0 && d >= lo) *out = d;
  else detail::log().warn("smla-cache: ignoring {}='{}' (expected a number >= {})", name, v, lo);
}

std::string home_dir() {
  if (const char* h = env("HOME")) return h;
  if (const passwd* pw = getpwuid(getuid()); pw && pw->pw_dir) return pw->pw_dir;
  return "";
}

}  // namespace

bool parse_byte_size(const std::string& s, int64_t* out) { return parse_bytes(s, out); }

Settings settings_from_env() {
  Settings s;
  if (const char* d = env("SMLA_CACHE_DIR")) s.dir = d;
  else if (const char* x = env("XDG_CACHE_HOME")) s.dir = std::string(x) + "/smla";
  else if (std::string h = home_dir(); !h.empty()) s.dir = h + "/.cache/smla";
  else {
    s.dir = "/tmp/smla-cache-" + std::to_string(getuid());
    s.dir_in_shared_tmp = true;
  }
  if (const char* d = env("SMLA_CACHE_SYSTEM_DIR")) s.system_dir = d;
  read_bool("SMLA_CACHE_DISABLE", &s.disable);
  read_bool("SMLA_CACHE_READONLY", &s.readonly);
  read_bytes("SMLA_CACHE_MAX_BYTES", &s.max_bytes);
  read_bool("SMLA_CACHE_LOCK", &s.lock);
  // Unset: DiskCache derives the lock directory from the cache directory alone, so that every
  // process sharing the cache agrees (it once followed XDG_RUNTIME_DIR, which a batch job and an
  // ssh shell of one user do not share). See lock_location() in disk_cache.cpp.
  if (const char* d = env("SMLA_CACHE_LOCK_DIR")) s.lock_dir = d;
  read_number("SMLA_CACHE_LOCK_TIMEOUT_S", 0, &s.lock_timeout_s);
  double stale = double(s.stale_staging_s);
  // Under a minute it would take another process's publish in flight for left over (0 did): refused, with a warning.
  read_number("SMLA_CACHE_STALE_S", 60, &stale);
  // Past ~31 years means never (and stays well inside int64 nanoseconds: 99999999999999999999 became a negative
  // age limit, which removed every other process's staging at once).
  s.stale_staging_s = int64_t(std::min(stale, 1e9));
  read_bool("SMLA_CACHE_TEST_FAIL_WRITES", &s.test_fail_writes);
  double delay = 0;
  read_number("SMLA_CACHE_TEST_PUBLISH_DELAY_MS", 0, &delay);
  s.test_publish_delay_ms = int(std::min(delay, 3.6e6));  // at most an hour (int(3e9) was no delay)
  return s;
}

}  // namespace smla::cache
