// device_memory.hpp: RAII device buffers, streams and events over the dlopen'ed driver, for
// tools and tests (the library itself never allocates in run()).
#pragma once
#include <cstddef>
#include <map>
#include <mutex>
#include <vector>

#include "cuda_api.hpp"

namespace smla::cuda {

/// Makes `device`'s primary context current unless the current context is already on `device` (a caller's own context
/// is kept): for a tool whose buffers and stream must be on its plan's device (Problem::device). Each device's primary
/// context is retained once, never released (like the runtime's).
inline void ensure_context_on(int device) {
  CUcontext c = nullptr;
  SMLA_CU(driver().CtxGetCurrent(&c));
  if (c) {
    CUdevice cur = 0;
    SMLA_CU(driver().CtxGetDevice(&cur));
    if (cur == device) return;
  }
  static std::mutex mu;
  static std::map<int, CUcontext> primary;
  CUcontext p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = primary.find(device);
    if (it == primary.end()) {
      CUdevice dev = 0;
      SMLA_CU(driver().DeviceGet(&dev, device));
      SMLA_CU(driver().DevicePrimaryCtxRetain(&p, dev));
      it = primary.emplace(device, p).first;
    }
    p = it->second;
  }
  SMLA_CU(driver().CtxSetCurrent(p));
}

/// Gives a thread with no current context device 0's primary context, as the CUDA runtime would:
/// plan() and run() put the caller's context back as they found it, so a tool's first buffer can
/// no longer count on them having left one. A current context, whichever, is kept.
inline void ensure_context() {
  CUcontext c = nullptr;
  SMLA_CU(driver().CtxGetCurrent(&c));
  if (!c) ensure_context_on(0);
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (!bytes) return;
    ensure_context();
    SMLA_CU(driver().MemAlloc(&ptr_, bytes));
  }
  ~DeviceBuffer() {
    if (ptr_) driver().MemFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = 0; o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return reinterpret_cast<void*>(ptr_); }
  size_t bytes() const { return bytes_; }
  // cuMemcpyHtoD from pageable memory and cuMemset may return before the device has finished them,
  // on the legacy stream, which the non-blocking streams used here (and by most callers) do not wait
  // for: both wait for the device, so a kernel launched next on any stream sees the data.
  void upload(const void* src, size_t n) {
    SMLA_CU(driver().MemcpyHtoD(ptr_, src, n));
    SMLA_CU(driver().CtxSynchronize());
  }
  template <class T>
  void upload(const std::vector<T>& v) { upload(v.data(), v.size() * sizeof(T)); }
  void download(void* dst, size_t n) const { SMLA_CU(driver().MemcpyDtoH(dst, ptr_, n)); }
  template <class T>
  std::vector<T> download_vec(size_t count) const {
    std::vector<T> v(count);
    download(v.data(), count * sizeof(T));
    return v;
  }
  /// Fills with a byte (0xFF makes bf16/fp32 NaN: poison for "was every element written").
  void fill(unsigned char byte) {
    SMLA_CU(driver().MemsetD8(ptr_, byte, bytes_));
    SMLA_CU(driver().CtxSynchronize());
  }

 private:
  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
};

class Stream {
 public:
  Stream() {
    ensure_context();
    SMLA_CU(driver().StreamCreate(&s_, CU_STREAM_NON_BLOCKING));
  }
  ~Stream() { driver().StreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  CUstream get() const { return s_; }
  void sync() const { SMLA_CU(driver().StreamSynchronize(s_)); }

 private:
  CUstream s_ = nullptr;
};

class Event {
 public:
  Event() {
    ensure_context();
    SMLA_CU(driver().EventCreate(&e_, CU_EVENT_DEFAULT));
  }
  ~Event() { driver().EventDestroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(CUstream s) { SMLA_CU(driver().EventRecord(e_, s)); }
  /// Milliseconds from `start` to this event (waits for this event).
  float since(const Event& start) const {
    SMLA_CU(driver().EventSynchronize(e_));
    float ms = 0;
    SMLA_CU(driver().EventElapsedTime(&ms, start.e_, e_));
    return ms;
  }

 private:
  CUevent e_ = nullptr;
};

}  // namespace smla::cuda
