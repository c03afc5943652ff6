// rocprim_sort.hip: the csr phase's sort on AMD, built ahead of time by hipcc into
// libsmla_rocprim.so, which the runtime opens only when the HIP backend is used (so the main
// library still loads without ROCm). C ABI only: see rocprim_sort.hpp for the loader.
#include <hip/hip_runtime.h>

#include <rocprim/device/device_radix_sort.hpp>

#define SMLA_ROCPRIM_ABI 2

// The --offload-arch list this library was built with, comma-separated (runtime/hip/CMakeLists.txt).
#ifndef SMLA_ROCPRIM_TARGETS
#error "build with -DSMLA_ROCPRIM_TARGETS=<the --offload-arch targets, comma-separated>"
#endif
#define SMLA_ROCPRIM_STR(...) #__VA_ARGS__
#define SMLA_ROCPRIM_XSTR(...) SMLA_ROCPRIM_STR(__VA_ARGS__)

extern "C" {

__attribute__((visibility("default"))) int smla_rocprim_abi_version() { return SMLA_ROCPRIM_ABI; }

/// "gfx90a,gfx942": the processors this library has device code for.
__attribute__((visibility("default"))) const char* smla_rocprim_targets() { return SMLA_ROCPRIM_XSTR(SMLA_ROCPRIM_TARGETS); }

/// Temporary storage for sorting `n` pairs on bits [begin_bit, end_bit). Returns a hipError_t.
__attribute__((visibility("default"))) int smla_rocprim_sort_pairs_temp_bytes(int n, int begin_bit,
                                                                               int end_bit, size_t* bytes) {
  *bytes = 0;
  const int* in = nullptr;  // typed nulls: the iterator types pick the same instantiation
  int* out = nullptr;
  return static_cast<int>(rocprim::radix_sort_pairs(nullptr, *bytes, in, out, in, out,
                                                    static_cast<unsigned>(n),
                                                    static_cast<unsigned>(begin_bit),
                                                    static_cast<unsigned>(end_bit)));
}

/// Stable ascending radix sort of (key, value) pairs, enqueued on `stream` (no host sync).
/// Keys must be non-negative when end_bit < 32 (the csr keys are kv rows, 0..num_kv).
__attribute__((visibility("default"))) int smla_rocprim_sort_pairs(void* temp, size_t temp_bytes,
                                                                    const int* keys_in, int* keys_out,
                                                                    const int* values_in, int* values_out,
                                                                    int n, int begin_bit, int end_bit,
                                                                    void* stream) {
  return static_cast<int>(rocprim::radix_sort_pairs(temp, temp_bytes, keys_in, keys_out, values_in,
                                                    values_out, static_cast<unsigned>(n),
                                                    static_cast<unsigned>(begin_bit),
                                                    static_cast<unsigned>(end_bit),
                                                    static_cast<hipStream_t>(stream)));
}

}  // extern "C"
