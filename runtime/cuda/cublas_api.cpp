// cublas_api.cpp: dlopen of libcublas and one timed bf16 GEMM as a reference rate.
#include "cublas_api.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <type_traits>

#include "../bf16.hpp"
#include "../log.hpp"
#include "../stats.hpp"
#include "device_memory.hpp"

namespace smla::cuda {

namespace {

constexpr const char* kHint =
    " (SMLA_CUBLAS_LIBRARY names the file to use; the pip package nvidia-cublas ships libcublas.so.13)";

std::string status_text(const Cublas& api, int s) {
  const char* name = api.StatusName ? api.StatusName(s) : nullptr;
  const char* text = api.StatusString ? api.StatusString(s) : nullptr;
  return (name ? std::string(name) : "cuBLAS status " + std::to_string(s)) + (text ? std::string(": ") + text : "");
}

void check_cublas(const Cublas& api, int s, const char* call, int line) {
  if (s != Cublas::kStatusSuccess) throw Error(Status::DriverError, status_text(api, s), __FILE__, line, call);
}
#define SMLA_CUBLAS(api, call) check_cublas((api), (call), #call, __LINE__)

/// Makes device 0's primary context current when the thread has none. It is retained once per
/// process and never released, as the CUDA runtime inside cuBLAS keeps it too: releasing it
/// between two calls could destroy the context under the runtime's cached state.
void ensure_current_context() {
  const auto& d = driver();
  CUcontext c = nullptr;
  SMLA_CU(d.CtxGetCurrent(&c));
  if (c) return;
  static CUcontext primary = nullptr;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (!primary) {
    CUdevice dev = 0;
    SMLA_CU(d.DeviceGet(&dev, 0));
    SMLA_CU(d.DevicePrimaryCtxRetain(&primary, dev));
  }
  SMLA_CU(d.CtxSetCurrent(primary));
}

class HandleScope {
 public:
  explicit HandleScope(const Cublas& api) : api_(api) { SMLA_CUBLAS(api_, api_.Create(&h_)); }
  ~HandleScope() {
    if (h_) api_.Destroy(h_);
  }
  HandleScope(const HandleScope&) = delete;
  HandleScope& operator=(const HandleScope&) = delete;
  Cublas::Handle get() const { return h_; }

 private:
  const Cublas& api_;
  Cublas::Handle h_ = nullptr;
};

/// Random bf16 of magnitude in [2^-7, 2^-1) with a random sign: never zero, so the products
/// toggle as many bits as real data does (a GEMM of zeros runs measurably faster). Uploaded in
/// chunks; `keep(index, bits)` sees every element, for the host check.
template <class Keep>
void fill_random(void* dst, size_t count, uint64_t seed, Keep&& keep) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  std::vector<uint16_t> chunk(std::min<size_t>(count, size_t(1) << 24));
  for (size_t done = 0; done < count;) {
    const size_t m = std::min(chunk.size(), count - done);
    for (size_t i = 0; i < m; ++i) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;  // xorshift64
      const uint16_t sign = uint16_t((s >> 63) << 15);
      const uint16_t exponent = uint16_t(120 + (s >> 8) % 6) << 7;
      const uint16_t bits = sign | exponent | uint16_t(s & 0x7F);
      chunk[i] = bits;
      keep(done + i, bits);
    }
    SMLA_CU(driver().MemcpyHtoD(reinterpret_cast<CUdeviceptr>(dst) + done * 2, chunk.data(), m * 2));
    done += m;
  }
}

GemmRate measure(const Cublas& api, int n, CUstream stream, int repeats) {
  ensure_current_context();
  const size_t elems = size_t(n) * size_t(n);
  DeviceBuffer a(elems * 2), b(elems * 2), c(elems * 2);
  // Column-major, as cuBLAS reads them: A(i,k) = a[i + k n], B(k,j) = b[k + j n], C(i,j) = c[i + j n].
  // Kept for the check: row 0 of A and columns 0..3 of B.
  constexpr int kChecked = 4;
  const int cols = std::min(n, kChecked);
  std::vector<float> a_row0(n), b_cols(size_t(cols) * n);
  fill_random(a.get(), elems, 1, [&](size_t i, uint16_t v) {
    if (i % size_t(n) == 0) a_row0[i / n] = bf16_to_float(v);
  });
  fill_random(b.get(), elems, 2, [&](size_t i, uint16_t v) {
    if (i < b_cols.size()) b_cols[i] = bf16_to_float(v);
  });
  c.fill(0xFF);  // NaN: an element the GEMM did not write fails the check
  // The uploads and the memset run on the legacy stream, which a non-blocking `stream` does not
  // wait for: finish them before the first product.
  SMLA_CU(driver().CtxSynchronize());

  HandleScope h(api);
  SMLA_CUBLAS(api, api.SetStream(h.get(), stream));
  const float alpha = 1.0f, beta = 0.0f;
  auto gemm = [&] {
    SMLA_CUBLAS(api, api.GemmEx(h.get(), Cublas::kOpN, Cublas::kOpN, n, n, n, &alpha, a.get(), Cublas::kBf16, n,
                                b.get(), Cublas::kBf16, n, &beta, c.get(), Cublas::kBf16, n, Cublas::kCompute32F,
                                Cublas::kGemmDefault));
  };
  for (int i = 0; i < 3; ++i) gemm();  // heuristics, kernel loading, clocks up
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    Event e0, e1;
    e0.record(stream);
    gemm();
    e1.record(stream);
    times.push_back(e1.since(e0));
  }
  SMLA_CU(driver().StreamSynchronize(stream));

  for (int j = 0; j < cols; ++j) {
    uint16_t got_bits = 0;
    SMLA_CU(driver().MemcpyDtoH(&got_bits, reinterpret_cast<CUdeviceptr>(c.get()) + size_t(j) * n * 2, 2));
    double want = 0, mag = 0;
    for (int k = 0; k < n; ++k) {
      const double p = double(a_row0[k]) * b_cols[size_t(j) * n + k];
      want += p;
      mag += std::fabs(p);
    }
    // bf16 output rounding (2^-9 relative) plus fp32 accumulation, with room to spare; a wrong
    // element differs by about sqrt(n) times a product, far more.
    const double got = bf16_to_float(got_bits);
    if (!std::isfinite(got) || std::fabs(got - want) > 1e-2 * std::fabs(want) + 1e-3 * mag)
      SMLA_THROW(Status::DriverError, "cuBLAS computed C(0," + std::to_string(j) + ") = " + std::to_string(got) +
                                          ", the host's dot product is " + std::to_string(want));
  }

  GemmRate r;
  r.n = n;
  r.repeats = repeats;
  r.ms = median(times);
  r.tflops = 2.0 * double(n) * n * n / (r.ms * 1e-3) / 1e12;
  r.library = api.path;
  return r;
}

}  // namespace

std::vector<std::string> cublas_candidates() {
  const char* env = std::getenv("SMLA_CUBLAS_LIBRARY");
  if (env && *env) return {env};
  return {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
}

std::shared_ptr<const Cublas> open_cublas(const std::vector<std::string>& names) {
  auto api = std::make_shared<Cublas>();
  void* h = nullptr;
  std::string tried;
  for (const auto& name : names) {
    if (name.empty()) continue;
    if ((h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL))) {
      api->path = name;
      break;
    }
    const char* err = dlerror();
    const std::string e = err ? err : "?";
    // dlerror usually starts with the file's name already; name it once either way.
    tried += (tried.empty() ? "" : "; ") + (e.rfind(name, 0) == 0 ? e : "'" + name + "': " + e);
  }
  if (!h) {
    api->why = "cuBLAS could not be opened: " + (tried.empty() ? std::string("no file named") : tried) + kHint;
    return api;
  }
  auto sym = [&](auto& member, const char* name, bool required) {
    member = reinterpret_cast<std::remove_reference_t<decltype(member)>>(dlsym(h, name));
    if (!member && required && api->why.empty()) api->why = "cuBLAS at '" + api->path + "' has no symbol " + name;
  };
  sym(api->Create, "cublasCreate_v2", true);
  sym(api->Destroy, "cublasDestroy_v2", true);
  sym(api->SetStream, "cublasSetStream_v2", true);
  sym(api->GemmEx, "cublasGemmEx", true);
  sym(api->StatusName, "cublasGetStatusName", false);
  sym(api->StatusString, "cublasGetStatusString", false);
  // Report the file that opened, not the soname asked for (the loader's search decided which).
  Dl_info info;
  if (api->Create && dladdr(reinterpret_cast<void*>(api->Create), &info) && info.dli_fname && *info.dli_fname)
    api->path = info.dli_fname;
  api->ok = api->why.empty();
  return api;
}

std::shared_ptr<const Cublas> cublas() {
  static std::shared_ptr<const Cublas> lib;
  static std::once_flag once;
  std::call_once(once, [] { lib = open_cublas(cublas_candidates()); });
  return lib;
}

std::optional<GemmRate> dense_gemm_rate(int n, CUstream stream, std::string* why, int repeats) {
  std::string local;
  std::string& reason = why ? *why : local;
  if (n < 1 || repeats < 1) {
    reason = "the dense GEMM needs n >= 1 and repeats >= 1 (got n=" + std::to_string(n) +
             ", repeats=" + std::to_string(repeats) + ")";
    return std::nullopt;
  }
  const auto api = cublas();
  if (!api->ok) {
    reason = api->why;
    return std::nullopt;
  }
  if (!driver().ok) {
    reason = "no usable CUDA driver: " + driver().why;
    return std::nullopt;
  }
  try {
    GemmRate r = measure(*api, n, stream, repeats);
    log().debug("dense GEMM {}^3 bf16 via {}: {:.3f} ms, {:.1f} TFLOP/s", n, r.library, r.ms, r.tflops);
    return r;
  } catch (const Error& e) {
    reason = "cuBLAS GEMM (" + api->path + ") failed: " + e.message() + (e.call().empty() ? "" : " in " + e.call());
  } catch (const std::exception& e) {
    reason = std::string("cuBLAS GEMM failed: ") + e.what();
  }
  return std::nullopt;
}

std::optional<double> dense_gemm_tflops(int n, CUstream stream, std::string* why) {
  const auto r = dense_gemm_rate(n, stream, why);
  return r ? std::optional<double>(r->tflops) : std::nullopt;
}

}  // namespace smla::cuda
