// tuning_db.cpp: the tuning database file: parse, look up, merge-and-publish under a lock.
#include "tuning_db.hpp"

#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "check.hpp"
#include "log.hpp"
#include "planner.hpp"
#include "sources.hpp"

namespace smla {

const std::vector<std::pair<std::string, std::string>>& embedded_kernel_sources();  // generated

namespace {

using json = nlohmann::json;
constexpr const char* kFormat = "smla-tuning-db";
constexpr const char* kSmlaVersion = "0.1.0";

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

std::string parent_dir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

void make_dirs(const std::string& dir) {
  std::string cur;
  std::stringstream ss(dir);
  if (!dir.empty() && dir[0] == '/') cur = "/";
  for (std::string part; std::getline(ss, part, '/');) {
    if (part.empty()) continue;
    cur += part + "/";
    ::mkdir(cur.c_str(), 0755);  // EEXIST is fine; a real failure shows when the file is opened
  }
}

// Identity of the file content as the filesystem sees it: a rename gives a new inode, a rewrite
// in place a new size or mtime. "absent" when there is no file.
std::string file_stamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "absent";
  return std::to_string(st.st_ino) + ":" + std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
         std::to_string(st.st_mtim.tv_nsec);
}

enum class Parsed { Ok, Absent, Corrupt, OtherSchema };

// Reads the file into `entries` (a JSON object keyed by tuning_key). `why` explains a non-Ok.
Parsed read_db(const std::string& path, json* entries, std::string* why) {
  *entries = json::object();
  std::ifstream in(path, std::ios::binary);
  if (!in) return Parsed::Absent;
  std::stringstream buf;
  buf << in.rdbuf();
  json doc = json::parse(buf.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    *why = "not a JSON object (truncated or overwritten?)";
    return Parsed::Corrupt;
  }
  if (doc.value("format", std::string()) != kFormat || !doc.contains("schema") || !doc["schema"].is_number_integer() ||
      !doc.contains("entries") || !doc["entries"].is_object()) {
    *why = "missing \"format\": \"smla-tuning-db\", \"schema\" or \"entries\"";
    return Parsed::Corrupt;
  }
  if (doc["schema"].get<int>() != kTuningSchema) {
    *why = "schema " + std::to_string(doc["schema"].get<int>()) + ", this smla reads schema " +
           std::to_string(kTuningSchema);
    return Parsed::OtherSchema;
  }
  *entries = std::move(doc["entries"]);
  return Parsed::Ok;
}

bool entry_from_json(const json& v, TuningEntry* e) {
  if (!v.is_object() || !v.contains("config") || !v["config"].is_object()) return false;
  const json& c = v["config"];
  for (const char* k : {"dq_block_h", "dq_block_r", "dkv_block_r", "dkv_block_d", "r_chunk"})
    if (!c.contains(k) || !c[k].is_number_integer() || c[k].get<int64_t>() < 0) return false;
  e->config.dq_block_h = c["dq_block_h"].get<int>();
  e->config.dq_block_r = c["dq_block_r"].get<int>();
  e->config.dkv_block_r = c["dkv_block_r"].get<int>();
  e->config.dkv_block_d = c["dkv_block_d"].get<int>();
  e->config.r_chunk = c["r_chunk"].get<int64_t>();
  // The bodies are optional (entries written before a body existed read as 0, the planner's choice);
  // a value outside 0..max (TileConfig::kMaxDqImpl, kMaxDkvImpl) rejects the entry.
  auto body = [&c](const char* k, int max, int* dst) {
    if (!c.contains(k)) return true;
    if (!c[k].is_number_integer() || c[k].get<int64_t>() < 0 || c[k].get<int64_t>() > max) return false;
    *dst = c[k].get<int>();
    return true;
  };
  if (!body("dq_impl", TileConfig::kMaxDqImpl, &e->config.dq_impl) ||
      !body("dkv_impl", TileConfig::kMaxDkvImpl, &e->config.dkv_impl))
    return false;
  e->ms = v.value("ms", 0.0);
  e->heuristic_ms = v.value("heuristic_ms", 0.0);
  e->T_tuned = v.value("T_tuned", int64_t(0));
  e->num_kv_tuned = v.value("num_kv_tuned", int64_t(0));
  return true;
}

std::string lse_name(const Problem& p) {
  // Without a sink both conventions of includes_sink coincide: one class.
  return std::string(p.lse.base2 ? "log2" : "ln") + (p.has_sink && !p.lse.includes_sink ? ",excl" : ",incl");
}

json entry_to_json(const std::string& target, const Problem& p, const std::string& version, const TuningEntry& e) {
  json v;
  v["target"] = target;
  v["H"] = p.H;
  v["topk"] = p.topk;
  v["sink"] = p.has_sink;
  v["lse"] = lse_name(p);
  v["dkv_fp32"] = p.dkv_fp32;
  v["T_bucket"] = pow2_bucket(p.T);
  v["num_kv_bucket"] = pow2_bucket(p.num_kv);
  v["runtime_version"] = version;
  v["config"] = {{"dq_block_h", e.config.dq_block_h},   {"dq_block_r", e.config.dq_block_r},
                 {"dkv_block_r", e.config.dkv_block_r}, {"dkv_block_d", e.config.dkv_block_d},
                 {"r_chunk", e.config.r_chunk},         {"dq_impl", e.config.dq_impl},
                 {"dkv_impl", e.config.dkv_impl}};
  v["ms"] = e.ms;
  v["heuristic_ms"] = e.heuristic_ms;
  v["T_tuned"] = e.T_tuned;
  v["num_kv_tuned"] = e.num_kv_tuned;
  v["stored_at"] = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  return v;
}

void write_all(int fd, const std::string& data, const std::string& path) {
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) SMLA_THROW(Status::Internal, "tuning db: cannot write " + path + ": " + std::strerror(errno));
    off += size_t(n);
  }
}

// Holds an exclusive flock on "<db>.lock" (a separate file: the database itself is replaced by
// rename, and a lock on a replaced inode would protect nothing).
class FileLock {
 public:
  explicit FileLock(const std::string& path) : fd_(::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644)) {
    if (fd_ < 0)
      SMLA_THROW(Status::InvalidArgument, "tuning db: cannot open lock file " + path + ": " + std::strerror(errno) +
                                              " (set SMLA_TUNING_DB to a writable path)");
    while (::flock(fd_, LOCK_EX) != 0)
      if (errno != EINTR) SMLA_THROW(Status::Internal, "tuning db: flock " + path + ": " + std::strerror(errno));
  }
  ~FileLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

}  // namespace

std::string default_tuning_db_path() {
  if (const char* p = env("SMLA_TUNING_DB")) return p;
  if (const char* x = env("XDG_CACHE_HOME")) return std::string(x) + "/smla/tuning.json";
  std::string home;
  if (const char* h = env("HOME")) home = h;
  else if (const passwd* pw = getpwuid(getuid()); pw && pw->pw_dir) home = pw->pw_dir;
  if (!home.empty()) return home + "/.cache/smla/tuning.json";
  return "/tmp/smla-tuning-" + std::to_string(getuid()) + ".json";
}

std::string tuning_runtime_version(const KernelSources& sources) {
  // FNV-1a 64 over every kernel file the build knows (names from the embedded set, content
  // from `sources`, so a development source directory changes the version too).
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;  // separator: ("ab","c") != ("a","bc")
  };
  for (const auto& f : embedded_kernel_sources()) {
    mix(f.first);
    if (sources.has(f.first)) mix(sources.file(f.first));
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return std::string("smla-") + kSmlaVersion + ";kernels=" + hex;
}

int64_t pow2_bucket(int64_t v) {
  int64_t b = 1;
  while (b < v) b <<= 1;
  return b;
}

std::string tuning_key(const std::string& target, const Problem& p, const std::string& runtime_version) {
  return "target=" + target + ";H=" + std::to_string(p.H) + ";topk=" + std::to_string(p.topk) +
         ";sink=" + (p.has_sink ? "1" : "0") + ";lse=" + lse_name(p) + ";dkv=" + (p.dkv_fp32 ? "f32" : "bf16") +
         ";T<=" + std::to_string(pow2_bucket(p.T)) + ";num_kv<=" + std::to_string(pow2_bucket(p.num_kv)) +
         ";v=" + runtime_version;
}

ShapeInfo shape_with_config(const Problem& p_in, const TileConfig* cfg, size_t interm_budget_bytes,
                            const std::string& target) {
  Problem p = p_in;
  if (cfg && cfg->r_chunk) p.r_chunk = cfg->r_chunk;
  ShapeInfo s = choose_shape(p, interm_budget_bytes);
  apply_config(s, cfg, target);
  return s;
}

void apply_config(ShapeInfo& s, const TileConfig* cfg, const std::string& target) {
  if (cfg) {
    s.dq_block_h = cfg->dq_block_h;
    s.dq_block_r = cfg->dq_block_r;
    s.dkv_block_r = cfg->dkv_block_r;
    s.dkv_block_d = cfg->dkv_block_d;
    s.dq_impl = cfg->dq_impl;
    s.dkv_impl = cfg->dkv_impl;
  }
  s.sm90a = target == "sm_90a";
}

TuningDb::TuningDb(std::string path, std::string runtime_version)
    : path_(path.empty() ? default_tuning_db_path() : std::move(path)),
      version_(runtime_version.empty() ? tuning_runtime_version(KernelSources()) : std::move(runtime_version)) {}

void TuningDb::warn(const std::string& msg) const {
  warnings_.push_back(msg);
  log().warn("{}", msg);
}

std::vector<std::string> TuningDb::warnings() const {
  std::lock_guard<std::mutex> lock(mu_);
  return warnings_;
}

void TuningDb::refresh() const {
  const std::string stamp = file_stamp(path_);
  if (stamp == stamp_) return;  // unchanged since the last parse: warnings were given then
  stamp_ = stamp;
  entries_.clear();
  json entries;
  std::string why;
  switch (read_db(path_, &entries, &why)) {
    case Parsed::Absent: return;
    case Parsed::Corrupt:
      warn("tuning db " + path_ + " is corrupt (" + why + "): ignored; the planner uses its heuristics, and the next "
           "smla-tune store rewrites it");
      return;
    case Parsed::OtherSchema:
      warn("tuning db " + path_ + " has " + why + ": ignored; the next smla-tune store rewrites it");
      return;
    case Parsed::Ok: break;
  }
  for (auto it = entries.begin(); it != entries.end(); ++it) {
    TuningEntry e;
    if (entry_from_json(it.value(), &e)) entries_.emplace_back(it.key(), e);
    else warn("tuning db " + path_ + ": malformed entry '" + it.key() + "' ignored");
  }
}

std::optional<TuningEntry> TuningDb::find(const std::string& target, const Problem& p) const {
  const std::string key = tuning_key(target, p, version_);
  std::lock_guard<std::mutex> lock(mu_);
  refresh();
  for (const auto& kv : entries_)
    if (kv.first == key) return kv.second;
  return std::nullopt;
}

std::optional<TileConfig> TuningDb::lookup(const std::string& target, const Problem& p) const {
  std::optional<TuningEntry> e = find(target, p);
  if (!e) return std::nullopt;
  TileConfig c = e->config;
  if (p.r_chunk) {
    c.r_chunk = p.r_chunk;  // the caller's explicit choice wins
  } else if (c.r_chunk && p.topk % c.r_chunk != 0) {
    c.r_chunk = 0;  // no longer divides: the planner's
  }
  return c;
}

void TuningDb::store(const std::string& target, const Problem& p, const TuningEntry& e) {
  const std::string dir = parent_dir(path_);
  make_dirs(dir);
  FileLock lock(path_ + ".lock");
  // Re-read under the lock: entries other processes stored since we last looked are kept.
  json entries;
  std::string why;
  const Parsed st = read_db(path_, &entries, &why);
  if (st == Parsed::Corrupt || st == Parsed::OtherSchema) {
    std::lock_guard<std::mutex> g(mu_);
    warn("tuning db " + path_ + ": " + why + "; rewriting it with this entry only");
  }
  entries[tuning_key(target, p, version_)] = entry_to_json(target, p, version_, e);
  json doc;
  doc["format"] = kFormat;
  doc["schema"] = kTuningSchema;
  doc["entries"] = std::move(entries);
  const std::string text = doc.dump(1) + "\n";

  std::random_device rd;
  const std::string tmp = path_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(rd());
  const int fd = ::open(tmp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0)
    SMLA_THROW(Status::InvalidArgument, "tuning db: cannot create " + tmp + ": " + std::strerror(errno) +
                                            " (set SMLA_TUNING_DB to a writable path)");
  try {
    write_all(fd, text, tmp);
    if (::fsync(fd) != 0) SMLA_THROW(Status::Internal, "tuning db: fsync " + tmp + ": " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    SMLA_THROW(Status::Internal, "tuning db: cannot rename " + tmp + " to " + path_ + ": " + std::strerror(err));
  }
  // The rename is durable only once the directory is synced.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace smla
