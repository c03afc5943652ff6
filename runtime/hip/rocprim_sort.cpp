// rocprim_sort.cpp: see rocprim_sort.hpp.
#include "rocprim_sort.hpp"

#include <dlfcn.h>

#include <filesystem>
#include <mutex>
#include <vector>

#include "hip_api.hpp"

namespace smla::hip {
namespace fs = std::filesystem;
namespace {

constexpr int kAbi = 2;  // must match SMLA_ROCPRIM_ABI in rocprim_sort.hip

// The HIP runtime a just-opened library resolved its own hip* calls to (its dependency libamdhip64), or "".
std::string hip_runtime_of(void* handle) {
  void* sym = dlsym(handle, "hipGetLastError");  // searched in the handle's own dependencies, in their order
  Dl_info info{};
  if (!sym || !dladdr(sym, &info) || !info.dli_fname) return "";
  return info.dli_fname;
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ea, eb;
  const fs::path ca = fs::canonical(a, ea), cb = fs::canonical(b, eb);
  return !ea && !eb ? ca == cb : a == b;
}

std::vector<std::string> candidates(const std::string& hint) {
  const char* name = "libsmla_rocprim.so";
  std::vector<std::string> c;
  if (!hint.empty()) c.push_back(hint);
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&radix_bits_for), &info) && info.dli_fname) {
    std::error_code ec;
    fs::path dir = fs::absolute(info.dli_fname, ec).parent_path();
    c.push_back((dir / name).string());
    c.push_back((dir.parent_path() / "lib" / name).string());
  }
#ifdef SMLA_ROCPRIM_LIB_DIR
  c.push_back(std::string(SMLA_ROCPRIM_LIB_DIR) + "/" + name);  // the build tree
#endif
  c.push_back(name);  // LD_LIBRARY_PATH and the loader cache
  return c;
}

}  // namespace

const RocprimSort* RocprimSort::get(std::string* why, const std::string& path_hint) {
  static std::mutex m;
  static RocprimSort loaded;
  static bool ok = false;
  static std::string error;
  std::lock_guard<std::mutex> lk(m);
  if (!ok) {
    error.clear();
    for (const auto& path : candidates(path_hint)) {
      // Its dependency libamdhip64 must resolve, to the copy Api::get() opened: one of another soname (a
      // framework's bundled libamdhip64.so.6 beside the ROCm 5 this library was built with) is a second HIP runtime
      // in the process, whose sort would be handed the first one's streams and memory.
      void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!h) {
        error += std::string(error.empty() ? "" : "; ") + dlerror();
        continue;
      }
      const Api* api = Api::get();
      const std::string mine = hip_runtime_of(h);
      if (api && !mine.empty() && !same_file(mine, api->hip_library)) {
        error += std::string(error.empty() ? "" : "; ") + path + " uses the HIP runtime " + mine +
                 ", but smla's HIP runtime is " + api->hip_library +
                 ": two HIP runtimes in one process share no streams or memory (rebuild libsmla_rocprim.so with the "
                 "hipcc of that runtime's ROCm: -DSMLA_HIPCC=..., or set SMLA_LIBHIP to " + mine + ")";
        dlclose(h);
        continue;
      }
      auto abi = reinterpret_cast<int (*)()>(dlsym(h, "smla_rocprim_abi_version"));
      loaded.temp_bytes_ = reinterpret_cast<decltype(loaded.temp_bytes_)>(dlsym(h, "smla_rocprim_sort_pairs_temp_bytes"));
      loaded.sort_ = reinterpret_cast<decltype(loaded.sort_)>(dlsym(h, "smla_rocprim_sort_pairs"));
      auto targets = reinterpret_cast<const char* (*)()>(dlsym(h, "smla_rocprim_targets"));
      if (!abi || abi() != kAbi || !loaded.temp_bytes_ || !loaded.sort_ || !targets) {
        error += "; " + path + " is not a matching libsmla_rocprim (ABI " + std::to_string(kAbi) +
                 "; rebuild it with this smla: the smla_rocprim target)";
        dlclose(h);
        continue;
      }
      loaded.targets_.clear();
      const std::string list = targets() ? targets() : "";
      for (size_t b = 0; b < list.size();) {
        size_t e = list.find(',', b);
        if (e == std::string::npos) e = list.size();
        if (e > b) loaded.targets_.push_back(list.substr(b, e - b));
        b = e + 1;
      }
      loaded.path_ = path;
      ok = true;
      break;
    }
  }
  if (!ok && why) *why = "libsmla_rocprim.so unavailable (build it with hipcc: SMLA_WITH_ROCPRIM): " + error;
  return ok ? &loaded : nullptr;
}

bool rocprim_supports(const std::vector<std::string>& built, const std::string& path, const std::string& target,
                      std::string* why) {
  const std::string proc = target.substr(0, target.find(':'));
  for (const std::string& b : built)
    if (b == proc) return true;
  if (why) {
    std::string list;
    for (const std::string& b : built) list += (list.empty() ? "" : ", ") + b;
    *why = "the AMD csr sort " + path + " has device code for " + (list.empty() ? "no processor" : list) +
           ", not for " + proc + " (target " + target + "): rebuild it with a hipcc that accepts --offload-arch=" +
           proc + " (reconfigure with -DSMLA_HIPCC=<that ROCm's bin/hipcc> and build the smla_rocprim target)";
  }
  return false;
}

bool RocprimSort::supports(const std::string& target, std::string* why) const {
  return rocprim_supports(targets_, path_, target, why);
}

size_t RocprimSort::temp_bytes(int n, int begin_bit, int end_bit) const {
  size_t bytes = 0;
  int e = temp_bytes_(n, begin_bit, end_bit, &bytes);
  if (e != 0)
    throw Error(Status::DriverError, "rocprim::radix_sort_pairs (size query) failed: hipError " + std::to_string(e),
                __FILE__, __LINE__, "rocprim::radix_sort_pairs");
  return bytes;
}

void RocprimSort::sort_pairs(void* temp, size_t temp_bytes, const int* keys_in, int* keys_out,
                             const int* values_in, int* values_out, int n, int begin_bit, int end_bit,
                             void* stream) const {
  int e = sort_(temp, temp_bytes, keys_in, keys_out, values_in, values_out, n, begin_bit, end_bit, stream);
  if (e != 0) {
    std::string text = "hipError " + std::to_string(e);
    if (const Api* api = Api::get()) text = hip_error_text(*api, e);
    throw Error(Status::DriverError, "rocprim::radix_sort_pairs failed: " + text, __FILE__, __LINE__,
                "rocprim::radix_sort_pairs");
  }
}

int radix_bits_for(int max_key) {
  int bits = 1;
  while (bits < 31 && (1 << bits) <= max_key) ++bits;
  return bits;
}

}  // namespace smla::hip
