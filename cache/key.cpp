// key.cpp: the cache key and the names derived from it.
#include <algorithm>
#include <cstdio>

#include <xxhash.h>

#include "entry_store.hpp"
#include "kernel_cache.hpp"

namespace smla::cache {
namespace detail {

std::string to_hex(const void* data, size_t n) {
  static const char* const hex = "0123456789abcdef";
  const auto* b = static_cast<const unsigned char*>(data);
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = hex[b[i] >> 4];
    s[2 * i + 1] = hex[b[i] & 15];
  }
  return s;
}

std::string hash_hex(const void* data, size_t n) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(data, n));
  return to_hex(c.digest, sizeof c.digest);
}

namespace {
// Length-prefixed so that no two different field lists serialize to the same bytes.
void put(std::string& m, const std::string& label, const std::string& v) {
  m += label;
  m += ':';
  m += std::to_string(v.size());
  m += ':';
  m += v;
  m += ';';
}
}  // namespace

std::string digest_of(const std::string& kernel, const std::string& shape_tag,
                      const std::string& source_hash,
                      std::vector<std::pair<std::string, std::string>> header_hashes,
                      std::vector<std::string> options, const std::string& target,
                      const std::string& compiler_id) {
  std::sort(header_hashes.begin(), header_hashes.end());
  std::sort(options.begin(), options.end());
  std::string m;
  put(m, "format", std::to_string(kFormatVersion));
  put(m, "kernel", kernel);
  put(m, "shape", shape_tag);
  put(m, "source", source_hash);
  put(m, "nheaders", std::to_string(header_hashes.size()));
  for (const auto& h : header_hashes) {
    put(m, "hname", h.first);
    put(m, "hhash", h.second);
  }
  put(m, "noptions", std::to_string(options.size()));
  for (const auto& o : options) put(m, "opt", o);
  put(m, "target", target);
  put(m, "compiler", compiler_id);
  return hash_hex(m);
}

bool valid_entry_name(const std::string& name, std::string* digest) {
  if (name.size() < 34 || name.size() > 200 || name[0] == '.') return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.';
    if (!ok) return false;
  }
  if (name[name.size() - 33] != '-') return false;
  std::string d = name.substr(name.size() - 32);
  for (char c : d)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  if (digest) *digest = d;
  return true;
}

}  // namespace detail

Key make_key(const KeyFields& f) {
  std::vector<std::pair<std::string, std::string>> hh;
  hh.reserve(f.headers.size());
  for (const auto& h : f.headers) hh.emplace_back(h.first, detail::hash_hex(h.second));
  Key k;
  k.digest = detail::digest_of(f.kernel, f.shape_tag, detail::hash_hex(f.source), std::move(hh),
                               f.options, f.target, f.compiler_id);
  // The tag is only for humans (and logs); the digest alone identifies the entry.
  std::string t = f.kernel + (f.shape_tag.empty() ? "" : "-" + f.shape_tag);
  for (char& c : t) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.';
    if (!ok) c = '_';
  }
  if (t.size() > 96) t.resize(96);
  if (t.empty() || t[0] == '.') t = "k" + t;
  k.tag = t;
  return k;
}

const char* origin_name(Origin o) {
  switch (o) {
    case Origin::Compiled: return "compiled";
    case Origin::Disk: return "disk";
    case Origin::SystemDisk: return "system-disk";
    case Origin::Memory: return "memory";
  }
  return "?";
}

}  // namespace smla::cache
