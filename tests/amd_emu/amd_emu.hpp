// amd_emu.hpp: the HIP device environment that the AMD kernels (kernel_src/*.hip) use, emulated on the host CPU, for
// tests/test_amd_emulated.cpp. No AMD GPU exists where smla is developed: this is how the AMD-only kernel code runs at
// all, under the MFMA layout amd_mfma.h assumes (its header comment). It checks index math, tiling, masking, chunk
// carries and barriers; it says nothing of the AMD compiler, of the MFMA hardware or of LDS hazards between wavefronts
// (each work-item is a host thread, so memory is coherent at every barrier).
//
// The test renders a kernel unit as the runtime does for hipRTC, replaces its `extern __shared__ T name[];` with
// `T* name = smla_emu::lds<T>();`, appends one launcher a kernel entry (SMLA_EMU_LAUNCHER), and compiles it with the
// host's clang (ext_vector_type, __bf16) into a shared object with this file included first (-include), __HIPCC__
// defined (portable.h then takes the HIP spellings), and __gfx950__ for that target's MFMA (K = 32).
//
// A launch runs its blocks one after another; a block's work-items are std::threads (one set a launch).
// __syncthreads is a barrier of the block, an MFMA a collective of the 64 lanes of its wavefront (each lane hands in
// its fragments, waits for the wavefront, computes its own accumulator elements, waits again). A work-item that
// returns leaves the block's barrier (as an exited wavefront does on the hardware). The block's LDS is a buffer of exactly the launch's size that ends at an
// inaccessible page (a write or read past it faults), filled with 0xCD before each block.
#pragma once

#include <math.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

struct smla_emu_dim3 {
  unsigned x = 0, y = 0, z = 0;
};
// Initial-exec: the shared object is dlopened by the test, and a dynamically allocated TLS block is one more thing for
// LeakSanitizer's tracer to walk in the sanitized pass.
inline thread_local __attribute__((tls_model("initial-exec"))) smla_emu_dim3 threadIdx, blockIdx;
inline smla_emu_dim3 blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// gfx950's fragments are vectors of __bf16, which the kernels only move (bit casts, loads) and hand to the MFMA: here
// they are their bits. (x86 clang 15 converts __bf16 through float with a libcall the test's process does not have.)
#define __bf16 unsigned short
// One block runs at a time: a kernel's static __shared__ array is one object for the block's work-items.
#define __shared__ static

struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
inline int4 make_int4(int a, int b, int c, int d) { return {a, b, c, d}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }

inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
template <class T> inline T __ldg(const T* p) { return *p; }

// HIP's min and max take mixed arguments (an int and a long long): the common type.
template <class A, class B> inline std::common_type_t<A, B> min(A a, B b) { return b < a ? b : a; }
template <class A, class B> inline std::common_type_t<A, B> max(A a, B b) { return a < b ? b : a; }

namespace smla_emu {

constexpr int kWave = 64;

struct Wave {
  std::barrier<> bar{kWave};
  float a[kWave][8], b[kWave][8];
  uint64_t x[kWave];  // __shfl_xor's values
};

struct Block {
  std::unique_ptr<std::barrier<>> bar;
  std::vector<std::unique_ptr<Wave>> waves;
  unsigned char* lds = nullptr;
};
inline Block g_block;

inline unsigned linear_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

template <class T> inline T* lds() { return reinterpret_cast<T*>(g_block.lds); }

inline float bf16_bits_to_float(uint16_t b) { return __uint_as_float(unsigned(b) << 16); }

// One 16 x 16 x (4 KPL) MFMA of the wavefront: D = C + A B, fragments as amd_mfma.h lays them out (lane l: A row l %
// 16 and B column l % 16 at k = (l / 16) KPL .. + KPL - 1; accumulator element v: row 4 (l / 16) + v, column l % 16).
// Products are exact in fp32; the sum runs in fp32, k in order.
template <int KPL, class F, class Acc> inline Acc mfma(const F& a, const F& b, Acc c) {
  static_assert(sizeof(F) == 2 * KPL, "a fragment is KPL bf16");
  const unsigned t = linear_tid();
  Wave& w = *g_block.waves[t / kWave];
  const int lane = int(t % kWave);
  uint16_t av[KPL], bv[KPL];
  std::memcpy(av, &a, sizeof av);
  std::memcpy(bv, &b, sizeof bv);
  for (int e = 0; e < KPL; ++e) w.a[lane][e] = bf16_bits_to_float(av[e]), w.b[lane][e] = bf16_bits_to_float(bv[e]);
  w.bar.arrive_and_wait();
  const int j = lane % 16, g = lane / 16;
  Acc d = c;
  for (int v = 0; v < 4; ++v) {
    const int i = 4 * g + v;
    float s = 0.f;
    for (int kg = 0; kg < 4; ++kg)
      for (int e = 0; e < KPL; ++e) s += w.a[i + 16 * kg][e] * w.b[j + 16 * kg][e];
    d[v] = c[v] + s;
  }
  w.bar.arrive_and_wait();  // every lane has read the fragments before any lane hands in its next ones
  return d;
}

// Runs the grid: the block's work-items are threads (one set for the launch, block after block); `kernel` is the
// entry called with the launch's arguments. Returns 0, or -1 with `err` filled where the launch cannot be emulated.
inline int run_grid(const std::function<void()>& kernel, const unsigned grid[3], const unsigned block[3],
                    unsigned lds_bytes, char* err, size_t err_len) {
  auto fail = [&](const std::string& m) {
    std::snprintf(err, err_len, "%s", m.c_str());
    return -1;
  };
  const unsigned threads = block[0] * block[1] * block[2];
  if (threads == 0 || threads % kWave != 0)
    return fail("a block of " + std::to_string(threads) + " work-items is not whole wavefronts");
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t body = (size_t(lds_bytes) + page - 1) / page * page;
  void* map = mmap(nullptr, body + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) return fail("mmap of the LDS failed");
  unsigned char* base = static_cast<unsigned char*>(map);
  if (mprotect(base + body, page, PROT_NONE) != 0) {
    munmap(map, body + page);
    return fail("mprotect of the LDS guard page failed");
  }
  g_block.lds = base + body - lds_bytes;  // ends at the guard page
  gridDim = {grid[0], grid[1], grid[2]};
  blockDim = {block[0], block[1], block[2]};
  const unsigned long long blocks = 1ull * grid[0] * grid[1] * grid[2];
  unsigned long long current = 0, next = 0;
  // Between blocks every work-item waits at `gate`, whose completion sets up the next block: its LDS poisoned, its
  // barriers new (a work-item that returned left the last block's).
  auto next_block = [&]() noexcept {
    current = next++;
    if (current >= blocks) return;
    std::memset(base, 0xCD, body);
    g_block.bar = std::make_unique<std::barrier<>>(threads);
    g_block.waves.clear();
    for (unsigned w = 0; w < threads / kWave; ++w) g_block.waves.push_back(std::make_unique<Wave>());
  };
  std::barrier gate(threads, next_block);
  std::vector<std::thread> th;
  th.reserve(threads);
  for (unsigned t = 0; t < threads; ++t)
    th.emplace_back([&, t] {
      threadIdx = {t % block[0], t / block[0] % block[1], t / (block[0] * block[1])};
      for (;;) {
        gate.arrive_and_wait();
        if (current >= blocks) return;
        blockIdx = {unsigned(current % grid[0]), unsigned(current / grid[0] % grid[1]),
                    unsigned(current / (1ull * grid[0] * grid[1]))};
        kernel();
        // An exited work-item no longer counts at the block's barrier (a lane alone cannot leave an MFMA's wavefront).
        g_block.bar->arrive_and_drop();
      }
    });
  for (std::thread& x : th) x.join();
  munmap(map, body + page);
  return 0;
}

}  // namespace smla_emu

inline void __syncthreads() { smla_emu::g_block.bar->arrive_and_wait(); }

// HIP's atomics on global or shared memory (the memory-bound kernels' index check).
template <class T> inline T atomicAdd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_add(v); }
template <class T> inline T atomicMin(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T old = a.load();
  while (v < old && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}
template <class T> inline T atomicMax(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T old = a.load();
  while (old < v && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}

// HIP's __shfl_xor: the value of lane (l ^ mask), or the lane's own where that falls outside its group of `width`.
// Every lane of the wavefront takes part (CDNA lanes run in lockstep; the kernels call it from whole wavefronts).
template <class T> inline T __shfl_xor(T v, int mask, int width = smla_emu::kWave) {
  static_assert(sizeof(T) <= 8, "a shuffled value is at most 8 bytes");
  const unsigned t = smla_emu::linear_tid();
  smla_emu::Wave& w = *smla_emu::g_block.waves[t / smla_emu::kWave];
  const int lane = int(t % smla_emu::kWave);
  std::memcpy(&w.x[lane], &v, sizeof(T));
  w.bar.arrive_and_wait();
  int src = lane ^ mask;
  if (src >= ((lane + width) & ~(width - 1))) src = lane;
  T r;
  std::memcpy(&r, &w.x[src], sizeof(T));
  w.bar.arrive_and_wait();
  return r;
}

#define __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, cbsz, abid, blgp) smla_emu::mfma<4>(a, b, c)
#define __builtin_amdgcn_mfma_f32_16x16x32_bf16(a, b, c, cbsz, abid, blgp) smla_emu::mfma<8>(a, b, c)

// The launcher of one entry: extern "C" int smla_emu_launch_ENTRY(params, grid, block, lds bytes, err, err_len).
#define SMLA_EMU_LAUNCHER(entry)                                                                                 \
  extern "C" int smla_emu_launch_##entry(const SmlaParams* p, const unsigned* grid, const unsigned* block,   \
                                         unsigned lds_bytes, char* err, size_t err_len) {                    \
    return smla_emu::run_grid([p] { entry(*p); }, grid, block, lds_bytes, err, err_len);                    \
  }
