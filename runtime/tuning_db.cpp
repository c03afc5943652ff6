// tuning_db.cpp: the tuning database file: parse, look up, merge-and-publish under a lock.
#include "tuning_db.hpp"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "../cache/entry_store.hpp"
#include "../cache/lock_file.hpp"
#include "../cache/private_dir.hpp"
#include "check.hpp"
#include "env.hpp"
#include "log.hpp"
#include "planner.hpp"
#include "relative_path.hpp"  // parent_dir
#include "sources.hpp"
#include "writable_dir.hpp"

namespace smla {

const std::vector<std::pair<std::string, std::string>>& embedded_kernel_sources();  // generated

namespace {

using json = nlohmann::json;
constexpr const char* kFormat = "smla-tuning-db";
constexpr const char* kSmlaVersion = "0.1.0";
// A temp file of another host (or of an older smla, whose names hold no host) is removed once this old, as the kernel
// cache's staging is by default (SMLA_CACHE_STALE_S): a store takes milliseconds.
constexpr int64_t kStaleTempS = 3600;

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

// default_tuning_db_path()'s fallback without a home directory: a name anyone can predict, so used only while
// private (TuningDb::private_dir_).
std::string shared_tmp_dir() { return "/tmp/smla-tuning-" + std::to_string(getuid()); }

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

void make_dirs(const std::string& dir) {
  std::string cur;
  std::stringstream ss(dir);
  if (!dir.empty() && dir[0] == '/') cur = "/";
  for (std::string part; std::getline(ss, part, '/');) {
    if (part.empty()) continue;
    cur += part + "/";
    // 0777: the umask decides (as the kernel cache does), so under umask 002 a group's directory stays writable by
    // the group. EEXIST is fine; a real failure shows when the directory is resolved.
    ::mkdir(cur.c_str(), 0777);
  }
}

std::string real_path(const std::string& path) {
  char* r = ::realpath(path.c_str(), nullptr);
  if (!r) return {};
  std::string s(r);
  std::free(r);
  return s;
}

// The file a store replaces: `path` with every symlink resolved, so that rename() replaces the link's target, not
// the link, and writers through different links (~/.cache/smla/tuning.json -> /shared/tuning.json) share one
// lock file. A link to a file not created yet is followed by hand. Creates the target's missing directories.
std::string resolve_for_write(const std::string& path) {
  std::string p = path;
  for (int hops = 0;; ++hops) {
    if (std::string r = real_path(p); !r.empty()) return r;
    char buf[PATH_MAX];
    const ssize_t n = ::readlink(p.c_str(), buf, sizeof buf);
    if (n <= 0) break;  // not a link (absent): resolve its directory
    if (hops == 40)     // Linux's own limit (MAXSYMLINKS)
      SMLA_THROW(Status::InvalidArgument, "tuning db: " + path + ": too many levels of symbolic links");
    const std::string target(buf, size_t(n));
    p = target[0] == '/' ? target : parent_dir(p) + "/" + target;
  }
  const std::string dir = parent_dir(p);
  make_dirs(dir);
  const std::string rdir = real_path(dir);
  const int err = errno;
  if (rdir.empty())
    SMLA_THROW(Status::InvalidArgument, "tuning db: cannot create directory " + dir + " for " + path + ": " +
                                            std::strerror(err) + " (set SMLA_TUNING_DB to a writable path)");
  return (rdir == "/" ? "" : rdir) + "/" + base_name(p);
}

// Identity of the file content as the filesystem sees it: a rename gives a new inode, a rewrite in place a new size
// or mtime. "absent" when there is no file; a stat error is an identity too, so it is warned about once.
std::string file_stamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return errno == ENOENT ? "absent" : "error:" + std::to_string(errno);
  return std::to_string(st.st_ino) + ":" + std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
         std::to_string(st.st_mtim.tv_nsec);
}

// Corrupt: a damaged tuning database (it names the format, or is empty); Foreign: a file that shows no sign of being
// one (SMLA_TUNING_DB or --tuning-db pointed at the wrong file), which a store must not replace.
enum class Parsed { Ok, Absent, Unreadable, Corrupt, Foreign, OlderSchema, NewerSchema };

// -1, 0, 1: `s` (an integer) below, at or above kTuningSchema, compared without get<int>(), which truncates
// (4294967297 would read as 1).
int schema_order(const json& s) {
  if (s.is_number_unsigned()) {
    const uint64_t v = s.get<uint64_t>();
    return v < uint64_t(kTuningSchema) ? -1 : v > uint64_t(kTuningSchema) ? 1 : 0;
  }
  const int64_t v = s.get<int64_t>();
  return v < kTuningSchema ? -1 : v > kTuningSchema ? 1 : 0;
}

// Reads the file into `entries` (a JSON object keyed by tuning_key). `why` explains a non-Ok. Never throws: whatever
// the file holds, a lookup must fall back to the heuristics.
constexpr size_t kMaxDbBytes = size_t(256) << 20;

Parsed read_db(const std::string& path, json* entries, std::string* why) {
  *entries = json::object();
  // O_NONBLOCK: a FIFO at the path blocked every plan() until a writer came (the check below then refuses it).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return Parsed::Absent;
    *why = std::string("cannot be read: ") + std::strerror(errno);  // EACCES is not "no database"
    return Parsed::Unreadable;
  }
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {  // open() succeeds on a directory
    ::close(fd);
    *why = "is a directory, not a file (set SMLA_TUNING_DB to a file path)";
    return Parsed::Unreadable;
  }
  if (!S_ISREG(st.st_mode)) {  // /dev/null (read as empty, so "damaged", and replaced by a store), /dev/zero, a FIFO
    ::close(fd);
    *why = "is not a regular file";
    return Parsed::Unreadable;
  }
  // Tests only: holds the reader here, inside a lookup (TuningDb.ForkedChildLooksUpWhileAParentThreadIsInsideALookup).
  // A whole number of milliseconds up to 10 minutes; anything else (atoi read "1500x" as 1500) is no delay.
  if (const char* ms = std::getenv("SMLA_TUNING_DB_TEST_READ_DELAY_MS")) {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(ms, &end, 10);
    if (end != ms && *end == '\0' && errno == 0 && v > 0 && v <= 600000)
      std::this_thread::sleep_for(std::chrono::milliseconds(v));
  }
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *why = std::string("cannot be read: ") + std::strerror(errno);
      ::close(fd);
      return Parsed::Unreadable;
    }
    if (n == 0) break;
    text.append(buf, size_t(n));
    if (text.size() > kMaxDbBytes) {  // a database of ~100 bytes an entry: not one
      ::close(fd);
      *why = "is larger than " + std::to_string(kMaxDbBytes >> 20) + " MiB: not a tuning database";
      return Parsed::Unreadable;
    }
  }
  ::close(fd);
  // Damaged rather than foreign: empty, or any text that names the format (a store writes it first, so a copy cut
  // short keeps it; databases written before that had it last).
  const Parsed damaged = text.empty() || text.find(kFormat) != std::string::npos ? Parsed::Corrupt : Parsed::Foreign;
  try {
    json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded() || !doc.is_object()) {
      *why = damaged == Parsed::Corrupt ? "not a JSON object (truncated or overwritten?)"
                                        : "not a tuning database (not JSON, nor naming the format \"smla-tuning-db\")";
      return damaged;
    }
    const auto format = doc.find("format"), schema = doc.find("schema"), ents = doc.find("entries");
    if (format == doc.end() || !format->is_string() || *format != kFormat || schema == doc.end() ||
        !schema->is_number_integer() || ents == doc.end() || !ents->is_object()) {
      *why = damaged == Parsed::Corrupt ? "missing \"format\": \"smla-tuning-db\", \"schema\" or \"entries\""
                                        : "not a tuning database (a JSON object without \"format\": \"smla-tuning-db\")";
      return damaged;
    }
    if (const int order = schema_order(*schema); order != 0) {
      *why = "schema " + schema->dump() + ", this smla reads schema " + std::to_string(kTuningSchema);
      return order < 0 ? Parsed::OlderSchema : Parsed::NewerSchema;
    }
    *entries = std::move(*ents);
    return Parsed::Ok;
  } catch (const json::exception& e) {  // belt and braces: no JSON quirk may escape a lookup
    *why = e.what();
    return damaged;
  }
}

// The integer `k` of `o` when it lies in [lo, hi]: checked before any narrowing, since get<int>() truncates
// (4294967312 would read as 16) and get<int64_t>() wraps an unsigned above INT64_MAX.
bool int_field(const json& o, const char* k, int64_t lo, int64_t hi, int64_t* out) {
  const auto it = o.find(k);
  if (it == o.end() || !it->is_number_integer()) return false;
  if (it->is_number_unsigned()) {
    const uint64_t v = it->get<uint64_t>();
    if (v > uint64_t(hi) || (lo > 0 && v < uint64_t(lo))) return false;
  } else if (it->get<int64_t>() < lo || it->get<int64_t>() > hi) {
    return false;
  }
  *out = it->get<int64_t>();
  return true;
}

// "" when `v` is a well-formed entry (then in `e`), else what is wrong with it. r_chunk against topk is checked at
// lookup, where the problem is known.
std::string entry_from_json(const json& v, TuningEntry* e) {
  if (!v.is_object() || !v.contains("config") || !v["config"].is_object()) return "no \"config\" object";
  const json& c = v["config"];
  int64_t x = 0;
  const std::pair<const char*, int*> tiles[] = {{"dq_block_h", &e->config.dq_block_h},
                                                {"dq_block_r", &e->config.dq_block_r},
                                                {"dkv_block_r", &e->config.dkv_block_r},
                                                {"dkv_block_d", &e->config.dkv_block_d}};
  for (const auto& t : tiles) {
    if (!int_field(c, t.first, 0, INT_MAX, &x))
      return std::string(t.first) + " is not an integer in 0.." + std::to_string(INT_MAX);
    *t.second = int(x);
  }
  // The planner's rule for Problem::r_chunk: a bad one here would make plan() throw about a field the user never set.
  if (!int_field(c, "r_chunk", 0, INT_MAX, &x) || x % 16 != 0)
    return "r_chunk is not 0 or a multiple of 16";
  e->config.r_chunk = x;
  // The bodies are optional (entries written before a body existed read as 0, the planner's choice);
  // a value outside 0..max (TileConfig::kMaxDqImpl, kMaxDkvImpl) rejects the entry.
  const std::tuple<const char*, int, int*> bodies[] = {{"dq_impl", TileConfig::kMaxDqImpl, &e->config.dq_impl},
                                                       {"dkv_impl", TileConfig::kMaxDkvImpl, &e->config.dkv_impl}};
  for (const auto& [k, max, dst] : bodies) {
    if (!c.contains(k)) continue;
    if (!int_field(c, k, 0, max, &x)) return std::string(k) + " is not an integer in 0.." + std::to_string(max);
    *dst = int(x);
  }
  // The timings are informative; still, a wrong type is a malformed entry (json's value() would throw).
  for (const auto& [k, dst] : {std::pair<const char*, double*>{"ms", &e->ms}, {"heuristic_ms", &e->heuristic_ms}}) {
    if (!v.contains(k)) continue;
    if (!v[k].is_number()) return std::string(k) + " is not a number";
    *dst = v[k].get<double>();
  }
  for (const auto& [k, dst] :
       {std::pair<const char*, int64_t*>{"T_tuned", &e->T_tuned}, {"num_kv_tuned", &e->num_kv_tuned}}) {
    if (!v.contains(k)) continue;
    if (!int_field(v, k, 0, INT64_MAX, dst)) return std::string(k) + " is not a non-negative integer";
  }
  return {};
}

std::string lse_name(const Problem& p) {
  // Without a sink both conventions of includes_sink coincide: one class.
  return std::string(p.lse.base2 ? "log2" : "ln") + (p.has_sink && !p.lse.includes_sink ? ",excl" : ",incl");
}

json entry_to_json(const std::string& device_class, const Problem& p, const std::string& version,
                   const TuningEntry& e) {
  json v;
  v["device"] = device_class;
  v["target"] = target_of_device_class(device_class);
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

// An exclusive flock on "<db>.lock" (a separate file: the database itself is replaced by rename, and a lock on a
// replaced inode would protect nothing), waited for at most `timeout_s`. The cache's LockFile: a process forked while
// a store holds it does not keep it (see cache/lock_file.hpp).
class DbLock {
 public:
  DbLock(const std::string& path, double timeout_s) {
    std::string err;
    const auto t0 = std::chrono::steady_clock::now();
    switch (lock_.acquire(path, timeout_s, {}, &err)) {
      case cache::detail::LockFile::Acquired: return;
      case cache::detail::LockFile::Unavailable:
        SMLA_THROW(Status::InvalidArgument, "tuning db: " + err + " (set SMLA_TUNING_DB to a writable path)");
      default: {
        const std::string who = cache::detail::LockFile::holders(path);
        char waited[32];
        std::snprintf(waited, sizeof waited, "%.1f",
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        SMLA_THROW(Status::Internal, "tuning db: waited " + std::string(waited) + " s for the lock file " + path +
                                         ", held by " + (who.empty() ? "another process" : who) +
                                         "; a store takes milliseconds, so that process is stuck: end it, or raise "
                                         "SMLA_TUNING_DB_LOCK_TIMEOUT_S. Nothing was stored");
      }
    }
  }

 private:
  cache::detail::LockFile lock_;
};

double lock_timeout_from_env() {
  double t = kTuningDbLockTimeoutS;
  if (const char* v = env("SMLA_TUNING_DB_LOCK_TIMEOUT_S")) {
    char* end = nullptr;
    const double d = std::strtod(v, &end);
    if (end && *end == 0 && d >= 0) t = d;
    else log().warn("ignoring SMLA_TUNING_DB_LOCK_TIMEOUT_S='{}' (expected a number of seconds >= 0)", v);
  }
  return t;
}

}  // namespace

std::string default_tuning_db_path() {
  if (const char* p = env("SMLA_TUNING_DB")) return p;
  if (const char* x = env("XDG_CACHE_HOME")) return std::string(x) + "/smla/tuning.json";
  std::string home;
  if (const char* h = env("HOME")) home = h;
  else if (const passwd* pw = getpwuid(getuid()); pw && pw->pw_dir) home = pw->pw_dir;
  if (!home.empty()) return home + "/.cache/smla/tuning.json";
  return shared_tmp_dir() + "/tuning.json";
}

bool tuning_db_in_shared_tmp(const std::string& path) { return path == shared_tmp_dir() + "/tuning.json"; }

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

std::string default_tuning_runtime_version(const std::string& kernel_src_dir) {
  // The sources Runtime::Impl compiles (and warm_kernels warms): a tool that hashed the embedded ones instead would
  // store entries no plan() finds while SMLA_KERNEL_SRC_DIR is set.
  return tuning_runtime_version(KernelSources(!kernel_src_dir.empty() ? kernel_src_dir : runtime_env().kernel_src_dir));
}

std::string tune_heuristic_error(const std::string& config, const std::string& state, const std::string& detail,
                                 size_t others_timed) {
  if (state == "timed") return {};
  const std::string what = state == "wrong"      ? "fails the correctness check"
                           : state == "rejected" ? "cannot be planned or run"
                                                 : "was not measured (" + state + ")";
  // Every untuned plan() runs this config: a wrong one is a defect to report, not a missing tuned config.
  return "the planner's heuristic config " + config + " " + what + (detail.empty() ? "" : ": " + detail) +
         "; nothing stored (" + std::to_string(others_timed) + " other candidates passed)";
}

int64_t pow2_bucket(int64_t v) {
  int64_t b = 1;
  while (b < v) b <<= 1;
  return b;
}

std::string tuning_device_class(const std::string& target, const std::string& device_name, int multiprocessors) {
  std::string name = device_name;
  for (char& c : name)
    if (c == ';' || c == '/' || c == '=') c = '_';
  return target + "/" + name + "/" + std::to_string(multiprocessors) + "sm";
}

std::string target_of_device_class(const std::string& device_class) {
  return device_class.substr(0, device_class.find('/'));
}

std::string tuning_key(const std::string& device_class, const Problem& p, const std::string& runtime_version) {
  return "device=" + device_class + ";H=" + std::to_string(p.H) + ";topk=" + std::to_string(p.topk) +
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
  s.smem_limit = cuda_smem_limit(target);
}

TuningDb::TuningDb(std::string path, std::string runtime_version, std::string private_dir)
    : path_(path.empty() ? default_tuning_db_path() : std::move(path)),
      version_(runtime_version.empty() ? default_tuning_runtime_version() : std::move(runtime_version)),
      private_dir_(!private_dir.empty()                ? std::move(private_dir)
                   : tuning_db_in_shared_tmp(path_) ? parent_dir(path_)
                                                    : std::string()),
      lock_timeout_s_(lock_timeout_from_env()),
      state_(new State(::getpid())) {}

std::string TuningDb::unprivate_dir(std::string* why) const {
  if (private_dir_.empty()) return "";
  *why = cache::private_dir_problem(private_dir_);
  return why->empty() ? "" : "tuning db " + path_ + ": not using " + private_dir_ + " (" + *why + ")";
}

void TuningDb::refuse_unprivate_dir() const {
  std::string why;
  if (const std::string msg = unprivate_dir(&why); !msg.empty())
    SMLA_THROW(Status::InvalidArgument, msg + "; set SMLA_TUNING_DB or HOME to a place of your own");
}

TuningDb::~TuningDb() { delete state_.load(); }

TuningDb::State& TuningDb::state() const {
  State* s = state_.load(std::memory_order_acquire);
  const pid_t me = ::getpid();
  if (s->pid == me) return *s;
  auto* fresh = new State(me);
  if (state_.compare_exchange_strong(s, fresh, std::memory_order_acq_rel)) return *fresh;
  delete fresh;  // another thread of this child was first: `s` is its state
  return *s;
}

void TuningDb::warn(State& st, const std::string& msg) const {
  st.warnings.push_back(msg);
  log().warn("{}", msg);
}

std::vector<std::string> TuningDb::warnings() const {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.warnings;
}

void TuningDb::refresh(State& st) const {
  // Checked on every lookup (a stat): the directory may be replaced while this process runs.
  std::string dir_why;
  if (const std::string msg = unprivate_dir(&dir_why); !msg.empty()) {
    if (dir_why != st.private_problem)
      warn(st, msg + "; the planner uses its heuristics. Set SMLA_TUNING_DB or HOME to a place of your own.");
    st.private_problem = dir_why;
    st.stamp.clear();
    st.entries.clear();
    return;
  }
  st.private_problem.clear();
  const std::string stamp = file_stamp(path_);
  if (stamp == st.stamp) return;  // unchanged since the last parse: warnings were given then
  st.stamp = stamp;
  st.entries.clear();
  json entries;
  std::string why;
  switch (read_db(path_, &entries, &why)) {
    case Parsed::Absent: return;
    case Parsed::Unreadable:
      warn(st, "tuning db " + path_ + " " + why + ": ignored; the planner uses its heuristics");
      return;
    case Parsed::Corrupt:
      warn(st, "tuning db " + path_ + " is corrupt (" + why + "): ignored; the planner uses its heuristics, and the "
               "next smla-tune store replaces it, keeping it under another name");
      return;
    case Parsed::Foreign:
      warn(st, "tuning db " + path_ + " is " + why + ": ignored; the planner uses its heuristics, and no store will "
               "replace it (set SMLA_TUNING_DB to the database's path)");
      return;
    case Parsed::OlderSchema:
      warn(st, "tuning db " + path_ + " has " + why + ": ignored; the next smla-tune store rewrites it");
      return;
    case Parsed::NewerSchema:
      warn(st, "tuning db " + path_ + " has " + why +
                   ": ignored (a newer smla wrote it; this one will not overwrite it)");
      return;
    case Parsed::Ok: break;
  }
  for (auto it = entries.begin(); it != entries.end(); ++it) {
    TuningEntry e;
    const std::string bad = entry_from_json(it.value(), &e);
    if (bad.empty()) st.entries.emplace_back(it.key(), e);
    else warn(st, "tuning db " + path_ + ": malformed entry '" + it.key() + "' ignored (" + bad + ")");
  }
}

std::optional<TuningEntry> TuningDb::find(const std::string& device_class, const Problem& p) const {
  const std::string key = tuning_key(device_class, p, version_);
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  refresh(st);
  for (auto it = st.entries.begin(); it != st.entries.end(); ++it) {
    if (it->first != key) continue;
    // The key holds topk, so an r_chunk that does not divide it was never a measured config: the planner would
    // reject it naming Problem::r_chunk, which the user never set. Dropped until the file changes (one warning).
    const int64_t rc = it->second.config.r_chunk;
    if (rc && p.topk % rc != 0) {
      warn(st, "tuning db " + path_ + ": malformed entry '" + key + "' ignored (r_chunk " + std::to_string(rc) +
                   " does not divide topk " + std::to_string(p.topk) + ")");
      st.entries.erase(it);
      return std::nullopt;
    }
    return it->second;
  }
  return std::nullopt;
}

std::optional<TileConfig> TuningDb::lookup(const std::string& device_class, const Problem& p) const {
  std::optional<TuningEntry> e = find(device_class, p);
  if (!e) return std::nullopt;
  TileConfig c = e->config;
  if (p.r_chunk) c.r_chunk = p.r_chunk;  // the caller's explicit choice wins
  return c;
}

std::vector<TileConfig> TuningDb::lookup_target(const std::string& target, const Problem& p) const {
  // Every class of `target` has the key "device=<target>[/...]" followed by what tuning_key puts after the class.
  const std::string bare = tuning_key(target, p, version_), head = "device=" + target;
  const std::string tail = bare.substr(head.size());
  std::vector<std::string> classes;
  {
    State& st = state();
    std::lock_guard<std::mutex> lock(st.mu);
    refresh(st);
    for (const auto& [key, e] : st.entries) {
      if (key.size() < head.size() + tail.size() || key.compare(0, head.size(), head) != 0 ||
          key.compare(key.size() - tail.size(), tail.size(), tail) != 0)
        continue;
      const std::string mid = key.substr(head.size(), key.size() - head.size() - tail.size());
      if (mid.empty() || (mid[0] == '/' && mid.find(';') == std::string::npos)) classes.push_back(target + mid);
    }
  }
  std::vector<TileConfig> out;
  for (const std::string& c : classes)  // through lookup: its checks (r_chunk dividing topk) and the caller's r_chunk
    if (auto cfg = lookup(c, p)) out.push_back(*cfg);
  return out;
}

namespace {

// What a store refuses before it takes the lock: a path that is no file to write (checked first, so that nothing, no
// <path>.lock, is created beside a directory; nor beside a device or a FIFO: SMLA_TUNING_DB=/dev/null, tuning off
// one would think, read as an empty, so damaged, database, and a store run as root replaced the device node).
void refuse_non_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode))
    SMLA_THROW(Status::InvalidArgument, "tuning db " + path + " is a directory, not a file (set SMLA_TUNING_DB to a "
                                        "file path, e.g. " + path + "/tuning.json)");
  if (!S_ISREG(st.st_mode))
    SMLA_THROW(Status::InvalidArgument, "tuning db " + path + " is not a regular file: not written (set "
                                        "SMLA_TUNING_DB to a file path)");
}

// What a store refuses once it has read the file (`path` as the caller named it); true when the file is to be kept
// aside as it is replaced.
bool refuse_or_keep_aside(Parsed parsed, const std::string& path, const std::string& why) {
  switch (parsed) {
    case Parsed::Unreadable:  // rewriting what we cannot read would drop its entries
      SMLA_THROW(Status::InvalidArgument, "tuning db " + path + " " + why + ": not rewritten");
    case Parsed::Foreign:  // someone's file at the wrong path: not ours to replace
      SMLA_THROW(Status::InvalidArgument, "tuning db " + path + " is " + why + ": not overwritten (set "
                                          "SMLA_TUNING_DB or --tuning-db to the database file, or remove this one)");
    case Parsed::NewerSchema:  // an older smla must not wipe a newer database
      SMLA_THROW(Status::Unsupported, "tuning db " + path + " has " + why + " and writes schema " +
                                          std::to_string(kTuningSchema) +
                                          ": not overwritten (tune with the newer smla, or set SMLA_TUNING_DB to "
                                          "another file)");
    case Parsed::Corrupt:
    case Parsed::OlderSchema: return true;
    case Parsed::Absent:
    case Parsed::Ok: break;
  }
  return false;
}

}  // namespace

void TuningDb::check_read() const {
  json entries;
  std::string why;
  const Parsed parsed = read_db(path_, &entries, &why);
  if (parsed == Parsed::Absent) SMLA_THROW(Status::InvalidArgument, "tuning db " + path_ + ": no such file");
  if (parsed != Parsed::Ok) SMLA_THROW(Status::InvalidArgument, "tuning db " + path_ + " " + why + ": no entries read");
}

void TuningDb::check_store() const {
  refuse_unprivate_dir();
  if (!path_.empty() && path_.back() == '/')  // (open() of an absent "dir/" is ENOENT, as of an absent file)
    SMLA_THROW(Status::InvalidArgument, "tuning db " + path_ + " names a directory (it ends in '/'), not a file (set "
                                        "SMLA_TUNING_DB to a file path, e.g. " + path_ + "tuning.json)");
  refuse_non_file(path_);
  // The directory the store writes the file, its temp copy and its lock in: made if absent, so its nearest existing
  // ancestor must take new entries. Asked here, before minutes of tuning, not found out by the store at their end.
  const std::string real = real_path(path_);
  const std::string dir = parent_dir(real.empty() ? path_ : real);
  if (std::string why = dir_write_problem(dir); !why.empty())
    SMLA_THROW(Status::InvalidArgument, "tuning db " + path_ + " cannot be written: " + why +
                                        " (set SMLA_TUNING_DB or --tuning-db to a writable path)");
  json entries;
  std::string why;
  refuse_or_keep_aside(read_db(path_, &entries, &why), path_, why);  // (open() follows a link as store() does)
}

void TuningDb::store(const std::string& device_class, const Problem& p, const TuningEntry& e) {
  refuse_unprivate_dir();
  refuse_non_file(path_);
  // Resolved once: the lock, the temp file and the rename target all sit beside the real file.
  const std::string real = resolve_for_write(path_);
  const std::string dir = parent_dir(real);
  DbLock lock(real + ".lock", lock_timeout_s_);
  // Re-read under the lock: entries other processes stored since we last looked are kept.
  json entries;
  std::string why;
  // A file this store replaces without reading its entries is kept under another name.
  const bool keep_aside = refuse_or_keep_aside(read_db(real, &entries, &why), path_, why);
  entries[tuning_key(device_class, p, version_)] = entry_to_json(device_class, p, version_, e);
  // "format" first: a copy cut short still names it, and reads as a damaged database rather than a foreign file.
  nlohmann::ordered_json doc;
  doc["format"] = kFormat;
  doc["schema"] = kTuningSchema;
  doc["entries"] = nlohmann::ordered_json(entries);
  const std::string text = doc.dump(1) + "\n";

  // Temp files of stores killed part way (each a full copy of the database) were left for ever. Every store writes
  // its temp file under this lock, so one present now belongs to a store that did not finish; it is removed once the
  // kernel cache's rule for its staging says the writer is gone (same host and a dead pid, or old).
  for (const auto& gone : cache::detail::remove_left_over_temps(real, kStaleTempS))
    log().info("tuning db: removed {}, left by a store that did not finish", gone);
  // "<db>.tmp.<host>.<pid>.<rand>", which that rule reads back.
  const std::string tmp = real + ".tmp." + cache::detail::owner_tag();
  if (std::string why; !cache::detail::within_file_size_limit(text.size(), tmp, &why))
    SMLA_THROW(Status::Internal, "tuning db: " + why);  // written, SIGXFSZ would end the process
  // 0666: the umask decides, so under umask 002 the published file stays writable by the group.
  const int fd = ::open(tmp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0666);
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
  // A corrupt file, one of an older schema, or one that is not a tuning database at all (SMLA_TUNING_DB or
  // --tuning-db pointed at the wrong file) is not destroyed: its bytes stay under "<db>.replaced.<host>.<pid>.<rand>"
  // (a hard link, so the database path never goes missing), and the warning says where.
  std::string aside;
  if (keep_aside) {
    aside = real + ".replaced." + cache::detail::owner_tag();
    if (::link(real.c_str(), aside.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      SMLA_THROW(Status::InvalidArgument, "tuning db " + path_ + ": " + why + "; not replaced, since it could not "
                                              "be kept as " + aside + ": " + std::strerror(err) +
                                              " (move it away, or set SMLA_TUNING_DB to another file)");
    }
  }
  if (::rename(tmp.c_str(), real.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    if (!aside.empty()) ::unlink(aside.c_str());  // the database was not replaced: one name for it is enough
    SMLA_THROW(Status::Internal, "tuning db: cannot rename " + tmp + " to " + real + ": " + std::strerror(err));
  }
  // The rename is durable only once the directory is synced.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  if (!aside.empty()) {
    State& st = state();
    std::lock_guard<std::mutex> g(st.mu);
    warn(st, "tuning db " + path_ + ": " + why + "; replaced by a database of this entry only, the old file kept as " +
                 aside);
  }
}

}  // namespace smla
