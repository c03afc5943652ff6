// fake_rocprim.cpp: a stand-in libsmla_rocprim.so (the csr sort's library on AMD, runtime/hip/rocprim_sort.cpp) that
// sorts nothing and records what it was handed, so that a machine without an AMD GPU can check which of the plan's
// ping-pong buffers the HIP backend's launch reads and writes. Its ABI and symbols are the real library's; it has code
// "for" gfx942, the HIP stub's processor.
#include <cstddef>

namespace {
struct Call {
  const void *keys_in = nullptr, *values_in = nullptr;
  void *keys_out = nullptr, *values_out = nullptr, *temp = nullptr;
  size_t temp_bytes = 0;
  int n = -1, begin_bit = -1, end_bit = -1, calls = 0;
} g_last;
}  // namespace

#define FAKE extern "C" __attribute__((visibility("default")))

FAKE int smla_rocprim_abi_version() { return 2; }  // SMLA_ROCPRIM_ABI of rocprim_sort.hip
FAKE const char* smla_rocprim_targets() { return "gfx942"; }
FAKE int smla_rocprim_sort_pairs_temp_bytes(int, int, int, size_t* bytes) {
  *bytes = 256;
  return 0;
}
FAKE int smla_rocprim_sort_pairs(void* temp, size_t temp_bytes, const int* keys_in, int* keys_out,
                                 const int* values_in, int* values_out, int n, int begin_bit, int end_bit, void*) {
  g_last.temp = temp, g_last.temp_bytes = temp_bytes;
  g_last.keys_in = keys_in, g_last.keys_out = keys_out, g_last.values_in = values_in, g_last.values_out = values_out;
  g_last.n = n, g_last.begin_bit = begin_bit, g_last.end_bit = end_bit;
  ++g_last.calls;
  return 0;
}

// What the last sort was handed: the four buffers, then n, begin_bit, end_bit, the scratch and its size; the calls.
FAKE int smla_fake_rocprim_last(const void** buffers, int* ints, void** temp, size_t* temp_bytes) {
  buffers[0] = g_last.keys_in, buffers[1] = g_last.keys_out, buffers[2] = g_last.values_in,
  buffers[3] = g_last.values_out;
  ints[0] = g_last.n, ints[1] = g_last.begin_bit, ints[2] = g_last.end_bit;
  *temp = g_last.temp, *temp_bytes = g_last.temp_bytes;
  return g_last.calls;
}
