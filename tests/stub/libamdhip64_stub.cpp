// libamdhip64_stub.cpp: a stand-in libamdhip64 (SMLA_LIBHIP) with two gfx942 devices, so that a machine with no AMD
// GPU can test what the HIP backend does around the current device: which device is current when it loads a module,
// launches, synchronizes and copies, and which one the caller's thread has afterwards. It runs nothing and holds no
// memory. Each thread has its own current device (0 at first), as in HIP. Device memory: the addresses
// STUB_DEVICE_BASE.. (never mapped, only asked about), of the ordinal in bits 32-35, as the CUDA stub's. What smla
// does not need here (hipRTC, allocation) answers hipErrorNotSupported. Exports the symbols runtime/hip/hip_api.cpp
// binds, plus smla_stub_hip_* to read what the calls found.
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace {
enum { kOk = 0, kInvalidValue = 1, kInvalidDevice = 101, kNotSupported = 801 };
constexpr int kDevices = 2;
constexpr uint64_t kDeviceBase = 0xd00000000000ull;

thread_local int g_current = 0;
// The device current at the last call of each kind (-1: never called).
int g_launch_device = -1, g_sync_device = -1, g_copy_device = -1, g_load_device = -1, g_devsync_device = -1,
    g_unload_device = -1;
// The order of the last device synchronize and the last module unload (0: never called).
int g_calls = 0, g_devsync_call = 0, g_unload_call = 0;

bool is_device(const void* p) { return (reinterpret_cast<uint64_t>(p) >> 44) == (kDeviceBase >> 44); }
int ordinal_of(const void* p) { return int((reinterpret_cast<uint64_t>(p) >> 32) & 0xf); }

// ROCm's hipPointerAttribute_t (hip_runtime_api.h), written out here rather than taken from smla's own declaration
// (runtime/hip/hip_api.hpp) so that the stub stands for the runtime, not for what smla believes of it.
struct hipPointerAttribute_t {
  int type;  // hipMemoryType
  int device;
  void* devicePointer;
  void* hostPointer;
  int isManaged;
  unsigned allocationFlags;
};
}  // namespace

#define STUB extern "C" __attribute__((visibility("default")))

STUB int smla_stub_hip_launch_device() { return g_launch_device; }
STUB int smla_stub_hip_sync_device() { return g_sync_device; }
STUB int smla_stub_hip_copy_device() { return g_copy_device; }
STUB int smla_stub_hip_load_device() { return g_load_device; }
STUB int smla_stub_hip_devsync_device() { return g_devsync_device; }
STUB int smla_stub_hip_unload_device() { return g_unload_device; }
// 1 when the last unload came right after a device synchronize.
STUB int smla_stub_hip_devsync_then_unload() { return g_devsync_call > 0 && g_unload_call == g_devsync_call + 1; }

// Streams: the handles smla_stub_hip_stream(device) gives (none is created); hipStreamGetDevice knows no other.
constexpr uint64_t kStreamBase = 0xe000000;
STUB void* smla_stub_hip_stream(int device) { return reinterpret_cast<void*>(kStreamBase + 16 * uint64_t(device)); }
STUB int hipStreamGetDevice(void* stream, int* device) {
  const uint64_t v = reinterpret_cast<uint64_t>(stream);
  if (v < kStreamBase || (v - kStreamBase) % 16 != 0 || (v - kStreamBase) / 16 >= uint64_t(kDevices))
    return kInvalidValue;
  *device = int((v - kStreamBase) / 16);
  return kOk;
}

STUB int hipInit(unsigned) { return kOk; }
STUB int hipRuntimeGetVersion(int* v) {
  *v = 60300000;  // 6.3.0
  return kOk;
}
STUB int hipDriverGetVersion(int* v) {
  *v = 60300000;
  return kOk;
}
STUB const char* hipGetErrorName(int e) { return e == kOk ? "hipSuccess" : "hipErrorStub"; }
STUB const char* hipGetErrorString(int) { return "stub HIP runtime"; }
// The thread's pending error, as HIP keeps one (ROCm >= 7: a later call's check reads it): set by a failed launch,
// returned and cleared by hipGetLastError.
thread_local int g_pending = kOk;
STUB int smla_stub_hip_pending() { return g_pending; }
STUB int hipGetLastError() {
  const int e = g_pending;
  g_pending = kOk;
  return e;
}
// SMLA_STUB_HIP_NO_DEVICE=1: a runtime that finds no GPU (count 0, no error).
STUB int hipGetDeviceCount(int* n) {
  const char* none = std::getenv("SMLA_STUB_HIP_NO_DEVICE");
  *n = none && std::strcmp(none, "1") == 0 ? 0 : kDevices;
  return kOk;
}
STUB int hipDeviceGet(int* d, int ordinal) {
  if (ordinal < 0 || ordinal >= kDevices) return kInvalidDevice;
  *d = ordinal;
  return kOk;
}
STUB int hipGetDevice(int* d) {
  *d = g_current;
  return kOk;
}
STUB int hipSetDevice(int d) {
  if (d < 0 || d >= kDevices) return kInvalidDevice;
  g_current = d;
  return kOk;
}
STUB int hipDeviceGetAttribute(int* v, int attr, int device) {
  if (device < 0 || device >= kDevices) return kInvalidDevice;
  *v = attr == 74 ? 65536 : attr == 63 ? 304 : 0;  // max shared memory a block (LDS), multiprocessors
  return kOk;
}
// A raw hipDeviceProp_t: smla finds gcnArchName by content.
static int device_properties(void* prop, int device) {
  if (device < 0 || device >= kDevices) return kInvalidDevice;
  std::memset(prop, 0, 4096);
  std::strcpy(static_cast<char*>(prop) + 1024, "gfx942:sramecc+:xnack-");
  return kOk;
}
STUB int hipGetDeviceProperties(void* prop, int device) { return device_properties(prop, device); }
STUB int hipGetDevicePropertiesR0600(void* prop, int device) { return device_properties(prop, device); }
int g_loads = 0;
STUB int smla_stub_hip_loads() { return g_loads; }
// An image starting "BAD" is refused (hipErrorInvalidImage, 200), the error left pending as ROCm >= 7 leaves it.
STUB int hipModuleLoadData(void** module, const void* image) {
  if (image && std::memcmp(image, "BAD", 3) == 0) return g_pending = 200;
  static int modules;
  *module = &modules;
  g_load_device = g_current;
  ++g_loads;
  return kOk;
}
STUB int hipModuleUnload(void*) {
  g_unload_device = g_current;
  g_unload_call = ++g_calls;
  return kOk;
}
STUB int hipDeviceSynchronize() {
  g_devsync_device = g_current;
  g_devsync_call = ++g_calls;
  return kOk;
}
STUB int hipModuleGetFunction(void** fn, void*, const char*) {
  static int functions;
  *fn = &functions;
  return kOk;
}
// A launch on the stream smla_stub_hip_failing_stream() fails (hipErrorInvalidValue), leaving the error pending.
STUB void* smla_stub_hip_failing_stream() { return reinterpret_cast<void*>(0xbad0000); }
STUB int hipModuleLaunchKernel(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               void* stream, void**, void**) {
  g_launch_device = g_current;
  if (stream == smla_stub_hip_failing_stream()) return g_pending = kInvalidValue;
  return kOk;
}
STUB int hipFuncSetAttribute(const void*, int, int) { return kOk; }
// The address smla_stub_hip_broken_pointer() gives is answered with hipErrorNotInitialized (3), left pending: a runtime
// failure, not ROCm 5's word for memory it does not know.
STUB void* smla_stub_hip_broken_pointer() { return reinterpret_cast<void*>(0xbad2000); }
STUB int hipPointerGetAttributes(hipPointerAttribute_t* a, const void* p) {
  if (p == smla_stub_hip_broken_pointer()) return g_pending = 3;
  // ROCm 5's answer for plain host memory; left pending on the thread, as ROCm >= 7 leaves every error until read.
  if (!is_device(p)) return g_pending = kInvalidValue;
  std::memset(a, 0, sizeof *a);
  a->type = 2;  // hipMemoryTypeDevice (ROCm 6)
  a->device = ordinal_of(p);
  a->isManaged = (reinterpret_cast<uint64_t>(p) >> 31) & 1;  // bit 31: managed memory (as the CUDA stub's)
  return kOk;
}
STUB int hipStreamSynchronize(void*) {
  g_sync_device = g_current;
  return kOk;
}
STUB int hipMemcpyDtoH(void* dst, const void* src, size_t bytes) {
  if (!is_device(src)) return kInvalidValue;
  std::memset(dst, 0, bytes);
  g_copy_device = g_current;
  return kOk;
}

#define STUB_UNSUPPORTED(name) \
  STUB int name() { return kNotSupported; }
STUB_UNSUPPORTED(hipMalloc)
STUB_UNSUPPORTED(hipFree)
STUB_UNSUPPORTED(hipMemcpy)
STUB_UNSUPPORTED(hipMemcpyHtoD)
STUB_UNSUPPORTED(hiprtcVersion)
STUB_UNSUPPORTED(hiprtcCreateProgram)
STUB_UNSUPPORTED(hiprtcCompileProgram)
STUB_UNSUPPORTED(hiprtcGetProgramLogSize)
STUB_UNSUPPORTED(hiprtcGetProgramLog)
STUB_UNSUPPORTED(hiprtcGetCodeSize)
STUB_UNSUPPORTED(hiprtcGetCode)
STUB_UNSUPPORTED(hiprtcDestroyProgram)
STUB const char* hiprtcGetErrorString(int) { return "stub hipRTC"; }
