/* libcuda_stub.c: a stand-in for libcuda.so.1 (SMLA_LIBCUDA) so that CI, which has no driver, can test what smla does
 * around opening the driver: one device of compute capability 9.0, and what a real driver does in a process forked
 * from the one that initialised it (every call fails with CUDA_ERROR_NOT_INITIALIZED). It runs no kernel and holds no
 * memory: calls smla makes only on a real GPU answer CUDA_ERROR_NOT_SUPPORTED, so a test that reaches one fails
 * visibly. Pointers: none of this process's memory is CUDA's; the addresses STUB_DEVICE_BASE.. (never mapped, only asked
 * about) are device memory of the ordinal in bits 32-35, managed where bit 31 is set. Exports every symbol
 * runtime/cuda/cuda_api.hpp loads, plus smla_stub_cuinit_calls() and smla_stub_pointer_queries() (the calls of
 * cuPointerGetAttribute and cuPointerGetAttributes together). SMLA_STUB_CC (e.g. "75") sets the device's compute
 * capability (default 90): a GPU smla does not support. SMLA_STUB_DEVICES (0 to 8, default 1) sets the device count.
 * Contexts: each device's primary context, and one other context of it (what cuCtxCreate would make), as handles only;
 * the current context is per thread. Streams: the handles smla_stub_stream(device, primary) gives (none is created),
 * whose context cuStreamGetCtx reports; any other handle is CUDA_ERROR_INVALID_HANDLE there. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { OK = 0, INVALID_VALUE = 1, NOT_INITIALIZED = 3, INVALID_IMAGE = 200, INVALID_CONTEXT = 201, INVALID_HANDLE = 400, NOT_SUPPORTED = 801 };

static pid_t init_pid;
static int cuinit_calls, pointer_queries;

static int forked(void) { return init_pid != 0 && getpid() != init_pid; }

int smla_stub_cuinit_calls(void) { return cuinit_calls; }
int smla_stub_pointer_queries(void) { return pointer_queries; }

int cuInit(unsigned flags) {
  (void)flags;
  ++cuinit_calls;
  if (forked()) return NOT_INITIALIZED;
  init_pid = getpid();
  return OK;
}

int cuDriverGetVersion(int* v) {
  *v = 13000;
  return OK;
}

#define STUB_GUARD \
  if (init_pid == 0 || forked()) return NOT_INITIALIZED

static int stub_devices(void) {
  const char* e = getenv("SMLA_STUB_DEVICES");
  const int n = e && *e ? atoi(e) : 1;
  return n >= 0 && n <= 8 ? n : 1;
}

int cuDeviceGetCount(int* n) {
  STUB_GUARD;
  *n = stub_devices();
  return OK;
}

int cuDeviceGet(int* dev, int ordinal) {
  STUB_GUARD;
  if (ordinal < 0 || ordinal >= stub_devices()) return INVALID_VALUE;
  *dev = ordinal;
  return OK;
}

/* The compute capability, major * 10 + minor: SMLA_STUB_CC, else 90. */
static int stub_cc(void) {
  const char* e = getenv("SMLA_STUB_CC");
  const int cc = e && *e ? atoi(e) : 0;
  return cc > 0 ? cc : 90;
}

int cuDeviceGetAttribute(int* v, int attr, int dev) {
  STUB_GUARD;
  (void)dev;
  switch (attr) {
    case 75: *v = stub_cc() / 10; break; /* compute capability major */
    case 76: *v = stub_cc() % 10; break; /* minor */
    case 97: *v = 232448; break;   /* max shared memory per block, opt-in */
    case 16: *v = 132; break;      /* multiprocessors */
    default: *v = 0;
  }
  return OK;
}

int cuDeviceGetName(char* name, int len, int dev) {
  STUB_GUARD;
  (void)dev;
  strncpy(name, "smla stub device", (size_t)len);
  if (len > 0) name[len - 1] = 0;
  return OK;
}

/* Context handles: 0xc0000 + 16 device for a device's primary context, + 8 for its other one. */
#define STUB_CTX_BASE 0xc0000ul
static void* stub_ctx(int dev, int primary) { return (void*)(STUB_CTX_BASE + 16ul * (unsigned long)dev + (primary ? 0 : 8)); }
/* The same handles for the tests (a context a test makes current, or names). */
void* smla_stub_context(int dev, int primary) { return stub_ctx(dev, primary); }
/* The device of a stub context handle, or -1. */
static int ctx_device(const void* ctx) {
  const unsigned long v = (unsigned long)ctx;
  if (v < STUB_CTX_BASE || (v - STUB_CTX_BASE) % 8 != 0) return -1;
  const int dev = (int)((v - STUB_CTX_BASE) / 16);
  return dev < stub_devices() ? dev : -1;
}
static __thread void* current_ctx; /* per thread, as the driver's */

/* Retains of a primary context not yet released, over every device (a backend's end must leave none of its own). */
static int primary_held;
int smla_stub_primary_contexts_held(void) { return primary_held; }

int cuDevicePrimaryCtxRetain(void** ctx, int dev) {
  STUB_GUARD;
  if (dev < 0 || dev >= stub_devices()) return INVALID_VALUE;
  *ctx = stub_ctx(dev, 1);
  ++primary_held;
  return OK;
}

int cuDevicePrimaryCtxRelease_v2(int dev) {
  STUB_GUARD;
  if (dev < 0 || dev >= stub_devices()) return INVALID_VALUE;
  --primary_held;
  return OK;
}

int cuCtxGetCurrent(void** ctx) {
  STUB_GUARD;
  *ctx = current_ctx;
  return OK;
}

int cuCtxSetCurrent(void* ctx) {
  STUB_GUARD;
  if (ctx && ctx_device(ctx) < 0) return INVALID_CONTEXT;
  current_ctx = ctx;
  return OK;
}

int cuCtxGetDevice(int* dev) {
  STUB_GUARD;
  if (!current_ctx) return INVALID_CONTEXT;
  *dev = ctx_device(current_ctx);
  return OK;
}

/* Stream handles: 0xe000000 + 16 device, + 8 for a stream of the device's other context. */
#define STUB_STREAM_BASE 0xe000000ul
void* smla_stub_stream(int dev, int primary) {
  return (void*)(STUB_STREAM_BASE + 16ul * (unsigned long)dev + (primary ? 0 : 8));
}

int cuStreamGetCtx(void* stream, void** ctx) {
  STUB_GUARD;
  const unsigned long v = (unsigned long)stream;
  if (v < STUB_STREAM_BASE || (v - STUB_STREAM_BASE) % 8 != 0) return INVALID_HANDLE;
  const int dev = (int)((v - STUB_STREAM_BASE) / 16);
  if (dev >= stub_devices()) return INVALID_HANDLE;
  *ctx = stub_ctx(dev, (v - STUB_STREAM_BASE) % 16 == 0);
  return OK;
}

#define STUB_DEVICE_BASE 0xd00000000000ull /* above any user mapping on x86-64 (47 bits) */
enum { MEMORY_TYPE = 2, IS_MANAGED = 8, DEVICE_ORDINAL = 9, MEMORYTYPE_DEVICE = 2 };

/* Writes attribute `attr` of device memory at `ptr` to `out`; INVALID_VALUE for an attribute the stub does not know. */
static int device_attribute(void* out, int attr, unsigned long long ptr) {
  switch (attr) {
    case MEMORY_TYPE: *(unsigned*)out = MEMORYTYPE_DEVICE; return OK;
    case DEVICE_ORDINAL: *(int*)out = (int)((ptr >> 32) & 0xf); return OK;
    case IS_MANAGED: *(unsigned char*)out = (ptr >> 31) & 1; return OK; /* a boolean: one byte */
    default: return INVALID_VALUE;
  }
}

static int is_device(unsigned long long ptr) { return (ptr >> 44) == (STUB_DEVICE_BASE >> 44); }

int cuPointerGetAttribute(void* out, int attr, unsigned long long ptr) {
  STUB_GUARD;
  ++pointer_queries;
  return is_device(ptr) ? device_attribute(out, attr, ptr) : INVALID_VALUE; /* not CUDA's: an error, as the driver */
}

/* Memory CUDA does not know is no error here: its attributes are zero (the driver's "default NULL values"). */
/* SMLA_STUB_POINTER_NEEDS_CONTEXT=1: a driver that wants a current context for the query (CUDA_ERROR_INVALID_CONTEXT
 * without one), as smla allows for. */
int cuPointerGetAttributes(unsigned n, int* attrs, void** data, unsigned long long ptr) {
  STUB_GUARD;
  ++pointer_queries;
  const char* needs = getenv("SMLA_STUB_POINTER_NEEDS_CONTEXT");
  if (needs && strcmp(needs, "1") == 0 && !current_ctx) return INVALID_CONTEXT;
  for (unsigned i = 0; i < n; ++i) {
    if (!is_device(ptr)) {
      if (attrs[i] == IS_MANAGED) *(unsigned char*)data[i] = 0;
      else *(int*)data[i] = 0;
    } else if (device_attribute(data[i], attrs[i], ptr) != OK) {
      return INVALID_VALUE;
    }
  }
  return OK;
}

int cuGetErrorName(int r, const char** s) {
  *s = r == OK ? "CUDA_SUCCESS"
     : r == INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE"
     : r == NOT_INITIALIZED ? "CUDA_ERROR_NOT_INITIALIZED"
     : r == INVALID_CONTEXT ? "CUDA_ERROR_INVALID_CONTEXT"
     : r == INVALID_HANDLE ? "CUDA_ERROR_INVALID_HANDLE"
     : r == NOT_SUPPORTED ? "CUDA_ERROR_NOT_SUPPORTED"
     : r == INVALID_IMAGE ? "CUDA_ERROR_INVALID_IMAGE" : "CUDA_ERROR_UNKNOWN";
  return OK;
}

int cuGetErrorString(int r, const char** s) {
  *s = r == NOT_INITIALIZED ? "initialization error" : r == NOT_SUPPORTED ? "not supported by the stub driver" : "";
  return OK;
}

/* What only a real GPU does. */
#define STUB_UNSUPPORTED(name) \
  int name(void) {             \
    STUB_GUARD;                \
    return NOT_SUPPORTED;      \
  }

/* Modules, with SMLA_STUB_MODULES=1 only (else they are what only a real GPU does): an ELF image (what NVRTC's cubins
 * are) loads as a handle, anything else is CUDA_ERROR_INVALID_IMAGE; a function is any name; its attributes are those
 * of a kernel with no limit of its own (1024 threads, no static shared memory, 0 registers: smla checks the count only
 * for bodies with a register split). So that plan() can be tested without a GPU: what it compiles, loads and caches. */
enum { FUNC_MAX_THREADS = 0, FUNC_SHARED_BYTES = 1, FUNC_NUM_REGS = 4 };
static int modules_on(void) {
  const char* e = getenv("SMLA_STUB_MODULES");
  return e && strcmp(e, "1") == 0;
}
static int modules_loaded;
int smla_stub_modules_loaded(void) { return modules_loaded; }
#define STUB_MODULES_GUARD \
  STUB_GUARD;              \
  if (!modules_on()) return NOT_SUPPORTED

int cuModuleLoadData(void** module, const void* image) {
  STUB_MODULES_GUARD;
  if (!image || memcmp(image, "\177ELF", 4) != 0) return INVALID_IMAGE;
  ++modules_loaded;
  *module = (void*)(0xf000000ul + 16ul * (unsigned long)modules_loaded);
  return OK;
}
/* Unloads, and those that came right after a cuCtxSynchronize (a module's launches may still be queued until then). */
static int modules_unloaded, unloads_after_sync, synced;
int smla_stub_modules_unloaded(void) { return modules_unloaded; }
int smla_stub_unloads_after_sync(void) { return unloads_after_sync; }
int cuModuleUnload(void* module) {
  STUB_MODULES_GUARD;
  if (!module) return INVALID_HANDLE;
  ++modules_unloaded;
  if (synced) ++unloads_after_sync;
  synced = 0;
  return OK;
}
int cuModuleGetFunction(void** fn, void* module, const char* name) {
  STUB_MODULES_GUARD;
  if (!module || !name || !*name) return INVALID_HANDLE;
  *fn = (char*)module + 1;
  return OK;
}
/* What every function reports may be set, as a compiled kernel's own limits: SMLA_STUB_FUNC_MAX_THREADS (default
 * 1024), SMLA_STUB_FUNC_STATIC_SMEM (default 0), SMLA_STUB_FUNC_REGS (default 0). */
static int env_int(const char* name, int fallback) {
  const char* e = getenv(name);
  return e && *e ? atoi(e) : fallback;
}
int cuFuncGetAttribute(int* v, int attr, void* fn) {
  STUB_MODULES_GUARD;
  (void)fn;
  *v = attr == FUNC_MAX_THREADS    ? env_int("SMLA_STUB_FUNC_MAX_THREADS", 1024)
       : attr == FUNC_SHARED_BYTES ? env_int("SMLA_STUB_FUNC_STATIC_SMEM", 0)
       : attr == FUNC_NUM_REGS     ? env_int("SMLA_STUB_FUNC_REGS", 0)
                                   : 0;
  return attr == FUNC_MAX_THREADS || attr == FUNC_SHARED_BYTES || attr == FUNC_NUM_REGS ? OK : INVALID_VALUE;
}
int cuFuncSetAttribute(void* fn, int attr, int v) {
  STUB_MODULES_GUARD;
  (void)fn, (void)attr, (void)v;
  return OK;
}
/* A module unload waits for the context first (cuda_backend.cpp): nothing ever runs here. */
int cuCtxSynchronize(void) {
  STUB_MODULES_GUARD;
  synced = 1;
  return OK;
}

STUB_UNSUPPORTED(cuLaunchKernel)
STUB_UNSUPPORTED(cuMemAlloc_v2) STUB_UNSUPPORTED(cuMemFree_v2) STUB_UNSUPPORTED(cuMemcpyHtoD_v2)
STUB_UNSUPPORTED(cuMemcpyDtoH_v2) STUB_UNSUPPORTED(cuMemcpyDtoHAsync_v2) STUB_UNSUPPORTED(cuMemsetD8_v2)
STUB_UNSUPPORTED(cuMemsetD32_v2) STUB_UNSUPPORTED(cuMemGetInfo_v2) STUB_UNSUPPORTED(cuStreamCreate)
STUB_UNSUPPORTED(cuStreamDestroy_v2) STUB_UNSUPPORTED(cuStreamSynchronize) STUB_UNSUPPORTED(cuEventCreate)
STUB_UNSUPPORTED(cuStreamCreateWithPriority) STUB_UNSUPPORTED(cuStreamWaitEvent)
STUB_UNSUPPORTED(cuStreamIsCapturing) STUB_UNSUPPORTED(cuCtxGetStreamPriorityRange)
STUB_UNSUPPORTED(cuEventDestroy_v2) STUB_UNSUPPORTED(cuEventRecord) STUB_UNSUPPORTED(cuEventSynchronize)
/* Built with STUB_OLD_DRIVER: a driver before 12.8, whose cuda.h had only the unversioned cuEventElapsedTime. */
#ifdef STUB_OLD_DRIVER
STUB_UNSUPPORTED(cuEventElapsedTime)
#else
STUB_UNSUPPORTED(cuEventElapsedTime_v2)
#endif
STUB_UNSUPPORTED(cuStreamBeginCapture_v2)
STUB_UNSUPPORTED(cuStreamEndCapture) STUB_UNSUPPORTED(cuGraphInstantiateWithFlags) STUB_UNSUPPORTED(cuGraphLaunch)
STUB_UNSUPPORTED(cuGraphExecDestroy) STUB_UNSUPPORTED(cuGraphDestroy)
