// nccl_api.hpp: the few NCCL calls sequence parallelism needs, through dlopen of libnccl.so.2.
//
// Like the CUDA driver (cuda/cuda_api.hpp), nothing links against NCCL: the library loads on a
// machine without it, and only a communicator's constructor reports that NCCL is missing.
// nccl.h stays inside nccl_api.cpp so users of this header need no NCCL headers.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

namespace smla::nccl {

/// ncclUniqueId's bytes (checked against nccl.h in nccl_api.cpp): plain data, so it can cross
/// a pipe or a socket between the processes of one job.
struct UniqueId {
  char bytes[128];
};

/// The function table of one opened libnccl (defined in nccl_api.cpp).
struct Api;

/// libnccl opened once per process: $SMLA_LIBNCCL if set, else libnccl.so.2. Never null; check
/// available() before use.
std::shared_ptr<const Api> library();
/// Opens `path` on its own, not cached (tests point it at a missing file).
std::shared_ptr<const Api> open_library(const std::string& path);
/// True when `api` loaded every symbol; else `why` says what is missing.
bool available(const Api& api, std::string* why);
/// NCCL's version code as messages print it, "2.8.4" (2804) or "2.28.3" (22803: 2.9 changed the code's layout).
std::string version_text(int code);

/// Turns NVLink multicast (NVLS) off for every communicator this process creates:
/// NCCL_NVLS_ENABLE=0 unless it is already "0". On a shared host multicast can take the GPUs out
/// of service, so a different value is overridden, not honoured.
void disable_nvlink_multicast();

/// A new unique id (rank 0 makes it, every rank passes it to Communicator). Throws smla::Error.
UniqueId unique_id(const Api& api);

/// One rank's NCCL communicator on one CUDA device. The constructor blocks until all `nranks`
/// ranks have joined (as ncclCommInitRank does).
class Communicator {
 public:
  /// Throws smla::Error: NoBackend naming libnccl.so.2 when NCCL is missing, NoBackend when
  /// there is no CUDA driver, DriverError when an NCCL call fails.
  Communicator(std::shared_ptr<const Api> api, const UniqueId& id, int rank, int nranks, int device);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  /// In-place sum of `count` floats of device memory over all ranks, enqueued on `stream`
  /// (a CUstream; null for the legacy default stream).
  void all_reduce_sum(float* device_buf, size_t count, void* stream);
  int rank() const { return rank_; }
  int size() const { return nranks_; }
  int device() const { return device_; }
  /// Ends the communicator at once (ncclCommAbort): NCCL work of this rank in flight is abandoned, and destroying it
  /// waits for nothing (ncclCommDestroy waited for the collective a failed rank never finished). The other ranks'
  /// collectives do not end with it: the application aborts them too (smla-seqpar's parent ends the other ranks).
  /// Later all_reduce_sum calls throw.
  void abort();

 private:
  std::shared_ptr<const Api> api_;
  void* comm_ = nullptr;  // ncclComm_t
  void* ctx_ = nullptr;   // CUcontext: `device`'s primary context, current only inside our calls
  int rank_ = 0, nranks_ = 0, device_ = 0;
  bool retained_ctx_ = false;
  bool aborted_ = false;
};

}  // namespace smla::nccl
