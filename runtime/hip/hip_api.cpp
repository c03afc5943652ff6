// hip_api.cpp: dlopen of libamdhip64 / libhiprtc / libamd_comgr and the symbol table.
#include "hip_api.hpp"

#include <dlfcn.h>
#include <link.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace smla::hip {
namespace {

// Newest first: a machine with several ROCm releases gets the one its loader finds first.
const char* const kHipNames[] = {"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6",
                                 "libamdhip64.so.5", "/opt/rocm/lib/libamdhip64.so"};
// The sonames a HIP runtime already in the process answers to (RTLD_NOLOAD matches the soname of
// a library loaded by path, e.g. PyTorch-ROCm's bundled torch/lib/libamdhip64.so.6).
const char* const kHipLoadedNames[] = {"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5",
                                       "libamdhip64.so"};
const char* const kHiprtcNames[] = {"libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6",
                                    "/opt/rocm/lib/libhiprtc.so"};
const char* const kHiprtcLoadedNames[] = {"libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so"};
const char* const kComgrNames[] = {"libamd_comgr.so.3", "libamd_comgr.so.2", "libamd_comgr.so"};

std::string loaded_path(void* handle) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name) return map->l_name;
  return "";
}

template <size_t N>
void* open_first(const char* const (&names)[N], int flags, std::string* tried) {
  for (const char* n : names) {
    if (void* h = dlopen(n, flags)) return h;
    if (tried) *tried += std::string(tried->empty() ? "" : ", ") + n;
  }
  return nullptr;
}

template <typename F>
bool bind(void* lib, const char* name, F& fn, std::string* missing) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn && missing) *missing += std::string(missing->empty() ? "" : ", ") + name;
  return fn != nullptr;
}

struct Loaded {
  Api api{};
  bool ok = false;
  std::string why;
};

Loaded load() {
  Loaded l;
  Api& a = l.api;
  std::string tried;
  // RTLD_LOCAL: ROCm's LLVM must not leak symbols into the host process (it may hold another LLVM).
  void* hip = nullptr;
  if (const char* env = std::getenv("SMLA_LIBHIP"); env && *env) {
    // The user's choice, exactly: no fallback that would load another runtime than the one named.
    hip = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (!hip) {
      const char* e = dlerror();
      l.why = std::string("SMLA_LIBHIP='") + env + "' could not be opened (" + (e ? e : "?") +
              "); set it to the path of libamdhip64.so, or unset it";
      return l;
    }
  } else {
    // A HIP runtime the process already holds (PyTorch-ROCm's own copy, the host application's) is
    // the one to use: a second one in the same process would not share its devices' state.
    hip = open_first(kHipLoadedNames, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, nullptr);
    if (!hip) hip = open_first(kHipNames, RTLD_NOW | RTLD_LOCAL, &tried);
  }
  if (!hip) {
    l.why = "the HIP runtime (libamdhip64) was not found (tried " + tried +
            "); install ROCm, add its lib directory to LD_LIBRARY_PATH, or set SMLA_LIBHIP to the file";
    return l;
  }
  a.hip_library = loaded_path(hip);
  std::string missing;
#define SMLA_BIND(lib, name) bind(lib, #name, a.name, &missing)
  SMLA_BIND(hip, hipInit);
  SMLA_BIND(hip, hipRuntimeGetVersion);
  SMLA_BIND(hip, hipDriverGetVersion);
  SMLA_BIND(hip, hipGetErrorName);
  SMLA_BIND(hip, hipGetErrorString);
  SMLA_BIND(hip, hipGetLastError);
  SMLA_BIND(hip, hipGetDeviceCount);
  SMLA_BIND(hip, hipDeviceGet);
  SMLA_BIND(hip, hipGetDevice);
  SMLA_BIND(hip, hipSetDevice);
  SMLA_BIND(hip, hipDeviceGetAttribute);
  SMLA_BIND(hip, hipGetDeviceProperties);
  SMLA_BIND(hip, hipModuleLoadData);
  SMLA_BIND(hip, hipModuleUnload);
  SMLA_BIND(hip, hipModuleGetFunction);
  SMLA_BIND(hip, hipModuleLaunchKernel);
  SMLA_BIND(hip, hipFuncSetAttribute);
  SMLA_BIND(hip, hipPointerGetAttributes);
  SMLA_BIND(hip, hipStreamSynchronize);
  SMLA_BIND(hip, hipDeviceSynchronize);
  SMLA_BIND(hip, hipMalloc);
  SMLA_BIND(hip, hipFree);
  SMLA_BIND(hip, hipMemcpy);
  SMLA_BIND(hip, hipMemcpyHtoD);
  SMLA_BIND(hip, hipMemcpyDtoH);
  bind(hip, "hipGetDevicePropertiesR0600", a.hipGetDevicePropertiesR0600, nullptr);
  bind(hip, "hipStreamGetDevice", a.hipStreamGetDevice, nullptr);

  // hipRTC moved out of libamdhip64 in ROCm 6.0; prefer the separate library when present: the one
  // already loaded, else the one beside the HIP runtime of its major version (another ROCm's would
  // not match it), else the loader's.
  // The major version from the library's file name, not hipRuntimeGetVersion: that initializes the whole runtime
  // (HSA and every GPU: seconds on an 8-GPU node) in each hipRTC worker, which needs no device, and in a host that only
  // asked whether smla could compile.
  void* rtc = open_first(kHiprtcLoadedNames, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, nullptr);
  const size_t slash = a.hip_library.rfind('/');
  if (!rtc && slash != std::string::npos) {
    const std::string dir = a.hip_library.substr(0, slash + 1);
    std::vector<std::string> names;
    if (const int major = hip_major_of_library(a.hip_library); major > 0)
      names.push_back(dir + "libhiprtc.so." + std::to_string(major));
    names.push_back(dir + "libhiprtc.so");
    for (const std::string& n : names)
      if (!rtc) rtc = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (!rtc) rtc = open_first(kHiprtcNames, RTLD_NOW | RTLD_LOCAL, nullptr);
  if (!rtc || !dlsym(rtc, "hiprtcCreateProgram")) rtc = hip;
  a.hiprtc_library = loaded_path(rtc);
  SMLA_BIND(rtc, hiprtcVersion);
  SMLA_BIND(rtc, hiprtcGetErrorString);
  SMLA_BIND(rtc, hiprtcCreateProgram);
  SMLA_BIND(rtc, hiprtcCompileProgram);
  SMLA_BIND(rtc, hiprtcGetProgramLogSize);
  SMLA_BIND(rtc, hiprtcGetProgramLog);
  SMLA_BIND(rtc, hiprtcGetCodeSize);
  SMLA_BIND(rtc, hiprtcGetCode);
  SMLA_BIND(rtc, hiprtcDestroyProgram);
#undef SMLA_BIND
  if (!missing.empty()) {
    l.why = "the HIP runtime " + a.hip_library + " lacks " + missing + " (ROCm too old?)";
    return l;
  }

  // comgr is already mapped as a dependency of hipRTC: find that very copy first.
  void* comgr = open_first(kComgrNames, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, nullptr);
  if (!comgr) comgr = open_first(kComgrNames, RTLD_NOW | RTLD_LOCAL, nullptr);
  if (comgr && bind(comgr, "amd_comgr_get_version", a.amd_comgr_get_version, nullptr))
    a.comgr_library = loaded_path(comgr);
  l.ok = true;
  return l;
}

}  // namespace

const Api* Api::get(std::string* why) {
  static const Loaded loaded = load();  // the libraries stay open for the process' life
  if (!loaded.ok && why) *why = loaded.why;
  return loaded.ok ? &loaded.api : nullptr;
}

const Api& Api::require() {
  std::string why;
  const Api* a = get(&why);
  if (!a) throw Error(Status::NoBackend, "HIP backend unavailable: " + why, __FILE__, __LINE__, "dlopen");
  return *a;
}

std::string hip_error_text(const Api& api, hipError_t e) {
  const char* name = api.hipGetErrorName ? api.hipGetErrorName(e) : nullptr;
  const char* text = api.hipGetErrorString ? api.hipGetErrorString(e) : nullptr;
  std::string s = name ? name : "hipError " + std::to_string(e);
  if (text && (!name || std::strcmp(name, text) != 0)) s += std::string(" (") + text + ")";
  return s;
}

std::string hiprtc_error_text(const Api& api, hiprtcResult r) {
  const char* text = api.hiprtcGetErrorString ? api.hiprtcGetErrorString(r) : nullptr;
  return text ? std::string(text) : "hiprtcResult " + std::to_string(r);
}

int hip_major_of_library(const std::string& path) {
  std::string name = path;
  if (char* real = ::realpath(path.c_str(), nullptr)) {  // libamdhip64.so -> libamdhip64.so.7.0.70000
    name = real;
    std::free(real);
  }
  name = name.substr(name.rfind('/') == std::string::npos ? 0 : name.rfind('/') + 1);
  const std::string stem = "libamdhip64.so.";
  if (name.compare(0, stem.size(), stem) != 0) return 0;
  int major = 0;
  size_t i = stem.size();
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && major < 1000; ++i) major = major * 10 + (name[i] - '0');
  return i > stem.size() && (i == name.size() || name[i] == '.') ? major : 0;
}

int hip_runtime_version(const Api& api) {
  int v = 0;
  SMLA_HIP_CHECK(api, hipRuntimeGetVersion(&v));
  return v;
}

std::string hip_version_string(int v) {
  return std::to_string(v / 10000000) + "." + std::to_string(v / 100000 % 100) + "." + std::to_string(v % 100000);
}

std::string find_arch_name(const char* prop, size_t size) {
  std::string best;
  bool best_has_features = false;
  for (size_t i = 0; i + 4 < size; ++i) {
    // A candidate starts a string (field start or after a NUL) with "gfx" and a digit.
    if ((i > 0 && prop[i - 1] != '\0') || std::strncmp(prop + i, "gfx", 3) != 0) continue;
    if (prop[i + 3] < '0' || prop[i + 3] > '9') continue;
    size_t n = 0;
    while (i + n < size && prop[i + n] != '\0' && n < 256) ++n;
    if (i + n >= size || n >= 256) continue;  // unterminated: not a string field
    std::string s(prop + i, n);
    bool ok = true;
    for (char c : s) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == ':' || c == '+' || c == '-');
    if (!ok) continue;
    bool has_features = s.find(':') != std::string::npos;
    // Real gcnArchNames of Instinct GPUs carry features; otherwise the longest string wins.
    if (best.empty() || (has_features && !best_has_features) ||
        (has_features == best_has_features && s.size() > best.size())) {
      best = s;
      best_has_features = has_features;
    }
    i += n;
  }
  return best;
}

std::string device_arch_name(const Api& api, int device) {
  // hipDeviceProp_t is ~800 bytes in ROCm 5 and ~1.5 KiB as R0600; leave generous room so a
  // later layout cannot overrun it, then find gcnArchName by content rather than by offset.
  std::vector<char> prop(16384, '\0');
  if (api.hipGetDevicePropertiesR0600)
    SMLA_HIP_CHECK(api, hipGetDevicePropertiesR0600(prop.data(), device));
  else
    SMLA_HIP_CHECK(api, hipGetDeviceProperties(prop.data(), device));
  std::string arch = find_arch_name(prop.data(), prop.size());
  if (arch.empty())
    throw Error(Status::DriverError,
                "device " + std::to_string(device) + " reports no gcnArchName in hipGetDeviceProperties",
                __FILE__, __LINE__, "hipGetDeviceProperties");
  return arch;
}

}  // namespace smla::hip
