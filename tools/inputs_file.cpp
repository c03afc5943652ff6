// inputs_file.cpp: see inputs_file.hpp.
#include "tools/inputs_file.hpp"

#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "cache/entry_store.hpp"  // owner tags and the left-over temp files

namespace smla::tools {
namespace {

constexpr char kMagic[8] = {'S', 'M', 'L', 'A', 'I', 'N', 'P', '1'};
// Another host's temp file (or one named by an older smla, without an owner) counts as left over once this old.
constexpr int64_t kStaleTempS = 3600;

struct Header {
  int32_t T, H, num_kv, topk, sink, kind;
  uint64_t seed;
  float scale;
  int32_t pad;
};

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

struct StateFree {
  void operator()(XXH64_state_t* s) const { XXH64_freeState(s); }
};

// Reads or writes the file's pieces in order, hashing them as they pass.
class Stream {
 public:
  explicit Stream(std::FILE* f) : f_(f), h_(XXH64_createState()) { XXH64_reset(h_.get(), 0); }
  bool put(const void* p, size_t n) {
    XXH64_update(h_.get(), p, n);
    return std::fwrite(p, 1, n, f_) == n;
  }
  bool get(void* p, size_t n) {
    if (std::fread(p, 1, n, f_) != n) return false;
    XXH64_update(h_.get(), p, n);
    return true;
  }
  template <class T>
  bool put_vec(const std::vector<T>& v) {
    const uint64_t n = v.size();
    return put(&n, sizeof n) && put(v.data(), n * sizeof(T));
  }
  // A vector whose length must be `want` (the problem fixes every length).
  template <class T>
  bool get_vec(std::vector<T>* v, size_t want) {
    uint64_t n = 0;
    if (!get(&n, sizeof n) || n != want) return false;
    v->resize(want);
    return get(v->data(), want * sizeof(T));
  }
  uint64_t digest() const { return XXH64_digest(h_.get()); }

 private:
  std::FILE* f_;
  std::unique_ptr<XXH64_state_t, StateFree> h_;
};

Header header_of(int T, int H, int num_kv, int topk, bool sink, uint64_t seed, ref::TopkKind kind, float scale) {
  Header h{};
  h.T = T, h.H = H, h.num_kv = num_kv, h.topk = topk, h.sink = sink ? 1 : 0;
  h.kind = kind == ref::TopkKind::Benchmark ? 0 : 1;
  h.seed = seed, h.scale = scale;
  return h;
}

// The file's inputs when it is whole and for this problem; otherwise false and why.
bool read_inputs(const std::string& path, const Header& want, ref::Inputs* in, std::string* why) {
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) {
    if (errno != ENOENT) *why = "cannot open " + path + ": " + std::strerror(errno);
    return false;
  }
  Stream s(f.get());
  char magic[8];
  Header h{};
  if (!s.get(magic, sizeof magic) || std::memcmp(magic, kMagic, sizeof magic) != 0 || !s.get(&h, sizeof h)) {
    *why = path + " is not an inputs file of this version";
    return false;
  }
  // The scale is derived, not asked for: compare the rest.
  Header want_but_scale = want;
  want_but_scale.scale = h.scale;
  if (std::memcmp(&h, &want_but_scale, sizeof h) != 0) {
    *why = path + " holds another problem's inputs";
    return false;
  }
  const size_t thd = size_t(h.T) * h.H * ref::D, th = size_t(h.T) * h.H;
  in->T = h.T, in->H = h.H, in->num_kv = h.num_kv, in->topk_n = h.topk, in->has_sink = h.sink != 0;
  in->scale = h.scale;
  const bool ok = s.get_vec(&in->q, thd) && s.get_vec(&in->kv, size_t(h.num_kv) * ref::D) && s.get_vec(&in->o, thd) &&
                  s.get_vec(&in->dout, thd) && s.get_vec(&in->lse, th) && s.get_vec(&in->topk, size_t(h.T) * h.topk) &&
                  s.get_vec(&in->sink, h.sink ? size_t(h.H) : 0) && s.get_vec(&in->lse_excl, th);
  const uint64_t computed = s.digest();
  uint64_t stored = 0;
  if (!ok || std::fread(&stored, 1, sizeof stored, f.get()) != sizeof stored) {
    *why = path + " is short or its lengths do not fit the problem";
    return false;
  }
  if (stored != computed || std::fgetc(f.get()) != EOF) {
    *why = path + " is damaged (checksum or length)";
    return false;
  }
  return true;
}

// Writes to a temporary file beside `path`, flushed to disk, then renamed into place; "" or why it failed.
std::string write_inputs(const std::string& path, const Header& h, const ref::Inputs& in) {
  // A writer killed part way left its temp file (1.6 GB at the seed shape) for good: removed by the next writer of
  // the same inputs once its owner is gone, by the kernel cache's rule ("<file>.tmp.<host>.<pid>.<rand>").
  cache::detail::remove_left_over_temps(path, kStaleTempS);
  const std::string tmp = path + ".tmp." + cache::detail::owner_tag();
  std::string err;
  auto bytes_of = [](const auto& v) { return uint64_t(sizeof(uint64_t) + v.size() * sizeof(v[0])); };
  const uint64_t total = sizeof kMagic + sizeof h + bytes_of(in.q) + bytes_of(in.kv) + bytes_of(in.o) +
                         bytes_of(in.dout) + bytes_of(in.lse) + bytes_of(in.topk) + bytes_of(in.sink) +
                         bytes_of(in.lse_excl) + sizeof(uint64_t);
  if (!cache::detail::within_file_size_limit(total, tmp, &err)) return err;  // SIGXFSZ would end the process
  {
    File f(std::fopen(tmp.c_str(), "wb"));
    if (!f) return "cannot create " + tmp + ": " + std::strerror(errno);
    Stream s(f.get());
    bool ok = s.put(kMagic, sizeof kMagic) && s.put(&h, sizeof h) && s.put_vec(in.q) && s.put_vec(in.kv) &&
              s.put_vec(in.o) && s.put_vec(in.dout) && s.put_vec(in.lse) && s.put_vec(in.topk) &&
              s.put_vec(in.sink) && s.put_vec(in.lse_excl);
    const uint64_t d = s.digest();
    ok = ok && std::fwrite(&d, 1, sizeof d, f.get()) == sizeof d && std::fflush(f.get()) == 0 &&
         ::fsync(::fileno(f.get())) == 0;
    if (!ok) err = "cannot write " + tmp + ": " + std::strerror(errno);
  }
  if (err.empty() && std::rename(tmp.c_str(), path.c_str()) != 0)
    err = "cannot rename " + tmp + " to " + path + ": " + std::strerror(errno);
  if (!err.empty()) std::remove(tmp.c_str());
  return err;
}

}  // namespace

std::string inputs_file_name(int T, int H, int num_kv, int topk, bool sink, uint64_t seed, ref::TopkKind kind) {
  return "inputs-v1-" + std::to_string(T) + "_" + std::to_string(H) + "_" + std::to_string(num_kv) + "_" +
         std::to_string(topk) + (sink ? "-sink" : "-nosink") + "-seed" + std::to_string(seed) +
         (kind == ref::TopkKind::Benchmark ? "-benchmark" : "-uniform") + ".bin";
}

ref::Inputs inputs_via_file(const std::string& dir, int T, int H, int num_kv, int topk, bool sink, uint64_t seed,
                            ref::TopkKind kind, InputsSource* source) {
  InputsSource local;
  InputsSource& src = source ? *source : local;
  src = InputsSource{};
  if (dir.empty()) return ref::make_inputs(T, H, num_kv, topk, sink, seed, kind);
  src.path = dir + "/" + inputs_file_name(T, H, num_kv, topk, sink, seed, kind);
  const Header want = header_of(T, H, num_kv, topk, sink, seed, kind, 0.0f);
  ref::Inputs in;
  std::string why;
  if (read_inputs(src.path, want, &in, &why)) {
    src.from_file = true;
    return in;
  }
  src.note = why;
  in = ref::make_inputs(T, H, num_kv, topk, sink, seed, kind);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string err = ec ? "cannot create " + dir + ": " + ec.message()
                             : write_inputs(src.path, header_of(T, H, num_kv, topk, sink, seed, kind, in.scale), in);
  if (!err.empty()) src.note += (src.note.empty() ? "" : "; ") + err;
  return in;
}

}  // namespace smla::tools
