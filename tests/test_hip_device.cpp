// test_hip_device.cpp: the HIP backend and the caller's current device, with the stub runtime of
// tests/stub/libamdhip64_stub.cpp (two gfx942 devices) as SMLA_LIBHIP: CI has no AMD GPU. As the CUDA backend keeps the
// caller's current context (ApiCuda.TheCallersCurrentContextIsLeftAsItWas), the HIP backend makes a plan's device
// current for its own calls only: a framework thread (PyTorch-ROCm) allocates on the device it had current.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "runtime/hip/hip_api.hpp"
#include "runtime/hip/hip_backend.hpp"
#include "runtime/hip/kernels_hip.hpp"
#include "runtime/hip/rocprim_sort.hpp"
#include "runtime/phases.hpp"
#include "tests/stub/stub_symbol.hpp"

namespace smla::test {
namespace {

// Before anything opens the HIP runtime (once a process): the stub.
const bool g_stub_named = [] { return ::setenv("SMLA_LIBHIP", SMLA_STUB_LIBHIP, 1) == 0; }();

// One of the stub's smla_stub_hip_* functions; null when the stub is not the HIP runtime loaded.
template <class F>
F stub_function(const char* name) {
  return test::stub_symbol<F>(SMLA_STUB_LIBHIP, name);
}

// What the stub saw (smla_stub_hip_*): the device current at the last call of a kind; -2 when the stub is not loaded.
int stub(const char* counter) {
  const auto fn = stub_function<int (*)()>(counter);
  return fn ? fn() : -2;
}

int current_device() {
  int d = -1;
  SMLA_HIP_CHECK(hip::Api::require(), hipGetDevice(&d));
  return d;
}

// The stub's memory of device `ordinal` (as the CUDA stub's: bits 32-35).
const void* device_ptr(int ordinal) { return reinterpret_cast<const void*>(0xd00000000000ull | (uint64_t(ordinal) << 32)); }

TEST(HipDevice, LoadLaunchAndReadBackKeepTheCallersDevice) {
  ASSERT_TRUE(g_stub_named);
  hip::HipBackend be;
  std::string why;
  ASSERT_TRUE(be.usable(&why)) << "the stub HIP runtime did not open: " << why;
  ASSERT_EQ(be.device_count(), 2);
  ASSERT_EQ(current_device(), 0);
  const KernelSpec spec = make_spec("delta", "smla_delta", {}, grid_xy(1), 256);

  auto k = be.load(spec, {0}, 1);  // plan() for device 1 from a thread on device 0
  EXPECT_EQ(stub("smla_stub_hip_load_device"), 1) << "the module was not loaded on device 1";
  EXPECT_EQ(current_device(), 0) << "load() left device 1 current";

  SMLA_HIP_CHECK(hip::Api::require(), hipSetDevice(0));
  const SmlaParams p{};
  be.launch(*k, spec, p, nullptr);  // the null stream: device 1's
  EXPECT_EQ(stub("smla_stub_hip_launch_device"), 1) << "the kernel was not launched on device 1";
  EXPECT_EQ(current_device(), 0) << "launch() left device 1 current";

  // index_report(): the workspace is device 1's, and so is the null stream that ran the plan.
  SMLA_HIP_CHECK(hip::Api::require(), hipSetDevice(0));
  int rep[4] = {1, 1, 1, 1};
  be.read_back(rep, device_ptr(1), sizeof rep, nullptr);
  EXPECT_EQ(stub("smla_stub_hip_sync_device"), 1) << "read_back() waited for another device's null stream";
  EXPECT_EQ(rep[0], 0);
  EXPECT_EQ(current_device(), 0) << "read_back() left device 1 current";
  // And device 0's workspace read from a thread on device 1: device 0 (a device too) is waited for and copied from.
  SMLA_HIP_CHECK(hip::Api::require(), hipSetDevice(1));
  be.read_back(rep, device_ptr(0), sizeof rep, nullptr);
  EXPECT_EQ(stub("smla_stub_hip_sync_device"), 0) << "read_back() waited for the caller's device, not the workspace's";
  EXPECT_EQ(stub("smla_stub_hip_copy_device"), 0) << "read_back() copied on the caller's device";
  EXPECT_EQ(current_device(), 1) << "read_back() left device 0 current";
  SMLA_HIP_CHECK(hip::Api::require(), hipSetDevice(0));

  // The module's unload (its last holder gone): after device 1's work, on device 1, and device 0 current again.
  k.reset();
  EXPECT_EQ(stub("smla_stub_hip_unload_device"), 1) << "the module was not unloaded on device 1";
  EXPECT_EQ(stub("smla_stub_hip_devsync_device"), 1) << "device 1's work was not waited for";
  EXPECT_EQ(stub("smla_stub_hip_devsync_then_unload"), 1) << "the unload did not come right after the wait";
  EXPECT_EQ(current_device(), 0) << "the unload left device 1 current";
}

// A child forked from a process that had initialised HIP (a DataLoader-style worker of a PyTorch-ROCm job) cannot use
// the runtime it inherited: the backend says so, and a plan made before the fork refuses to launch or load there
// rather than fail in the runtime with no cause named (or hang). The parent goes on as before.
TEST(HipDevice, AForkedChildIsToldHipIsNotItsToUse) {
  hip::HipBackend be;
  std::string why;
  ASSERT_TRUE(be.usable(&why)) << "the stub HIP runtime did not open: " << why;
  const KernelSpec spec = make_spec("delta", "smla_delta", {}, grid_xy(1), 256);
  auto k = be.load(spec, {0}, 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int bad = 0;
    std::string w;
    if (hip::HipBackend().usable(&w) || w.find("forked from one that had initialised HIP") == std::string::npos) bad |= 1;
    try {
      be.launch(*k, spec, SmlaParams{}, nullptr);
      bad |= 2;
    } catch (const Error& e) {
      if (e.status() != Status::NoBackend || e.message().find("spawn, not fork") == std::string::npos) bad |= 2;
    }
    try {
      be.load(spec, {0}, 0);
      bad |= 4;
    } catch (const Error& e) {
      if (e.status() != Status::NoBackend) bad |= 4;
    }
    if (!hip::hip_forked_after_init()) bad |= 8;
    _exit(bad);
  }
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st)) << "the child died";
  EXPECT_EQ(WEXITSTATUS(st), 0) << "bits: 1 usable() in the child, 2 launch(), 4 load(), 8 hip_forked_after_init()";
  EXPECT_TRUE(be.usable(&why)) << why;  // the parent is unchanged
  EXPECT_FALSE(hip::hip_forked_after_init());
  EXPECT_NO_THROW(be.launch(*k, spec, SmlaParams{}, nullptr));
}

// A config over the device's LDS is refused at plan time before any module is loaded: loading it first made the
// refusal destroy a module, whose unload waits for the whole device (hipDeviceSynchronize) inside plan().
TEST(HipDevice, AConfigOverTheLdsLimitLoadsNothing) {
  hip::HipBackend be;
  std::string why;
  ASSERT_TRUE(be.usable(&why)) << why;
  KernelSpec spec = make_spec("dq", "smla_dq", {}, grid_xy(1), 256);
  spec.smem_bytes = 65537;  // the stub's devices allow 65536
  const int loads = stub("smla_stub_hip_loads"), syncs = stub("smla_stub_hip_devsync_device");
  try {
    be.load(spec, {0}, 0);
    ADD_FAILURE() << "a config over the LDS limit was loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::Unsupported);
    EXPECT_NE(e.message().find("65537 bytes of LDS"), std::string::npos) << e.message();
  }
  EXPECT_EQ(stub("smla_stub_hip_loads"), loads) << "a module was loaded for a config refused anyway";
  EXPECT_EQ(stub("smla_stub_hip_devsync_device"), syncs);
  spec.smem_bytes = 65536;  // the limit itself is allowed
  EXPECT_NO_THROW(be.load(spec, {0}, 0));
  EXPECT_EQ(stub("smla_stub_hip_loads"), loads + 1);
}

// A runtime that finds no GPU (a count of 0, no error) leaves the backend unusable, saying so. In a process of its own
// (the backend asks the runtime once a process).
TEST(HipDeviceDeathTest, ARuntimeThatFindsNoGpuIsUnusable) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        ::setenv("SMLA_STUB_HIP_NO_DEVICE", "1", 1);
        std::string why;
        const bool usable = hip::HipBackend().usable(&why);
        std::fprintf(stderr, "usable=%d: %s\n", int(usable), why.c_str());
        std::exit(usable ? 1 : 0);
      },
      ::testing::ExitedWithCode(0), "usable=0: HIP backend unusable: no AMD GPU found \\(hipGetDeviceCount returned 0\\)");
}

// HIP's csr sort (rocPRIM: a library call, not a compiled kernel) reads the pairs smla_csr_keys wrote, in buffer
// 1 - csr_final, and writes buffer csr_final, where rowptr and gather read; csr_hist is its scratch, of the size the plan
// reserved. With the buffers swapped every AMD run would sum dkv from unsorted slots. Checked through a stand-in library
// that records what it is handed (tests/stub/fake_rocprim.cpp), in a process of its own: the library is opened once.
// The child's check: 0 when the sort was handed the right buffers, sizes and scratch, for either csr_final.
int csr_sort_check() {
  std::string why;
  const hip::RocprimSort* sort = hip::RocprimSort::get(&why, SMLA_FAKE_ROCPRIM);
  if (!sort || sort->path() != SMLA_FAKE_ROCPRIM) {
    std::fprintf(stderr, "the stand-in sort was not the one opened: %s\n", why.c_str());
    return 2;
  }
  const auto last =
      test::stub_symbol<int (*)(const void**, int*, void**, size_t*)>(SMLA_FAKE_ROCPRIM, "smla_fake_rocprim_last");
  if (!last) return 3;
  hip::HipBackend be;
  KernelSpec spec = make_spec(kRocprimStem, "rocprim::radix_sort_pairs", {}, grid_xy(1), 1);
  spec.scratch_bytes = 256;
  auto k = be.load(spec, {}, 0);
  auto at = [](uintptr_t a) { return reinterpret_cast<int*>(a); };
  SmlaParams p{};
  p.T = 4, p.r_chunk = 8, p.num_kv = 100;
  p.csr_keys[0] = at(0x1000), p.csr_keys[1] = at(0x2000), p.csr_vals[0] = at(0x3000), p.csr_vals[1] = at(0x4000);
  p.csr_hist = at(0x5000);
  int wrong = 0;
  for (int final_buffer : {1, 0}) {
    p.csr_final = final_buffer;
    be.launch(*k, spec, p, nullptr);
    const void* buf[4];
    int ints[3];
    void* temp = nullptr;
    size_t temp_bytes = 0;
    last(buf, ints, &temp, &temp_bytes);
    const int in = 1 - final_buffer, out = final_buffer;
    if (buf[0] != p.csr_keys[in] || buf[1] != p.csr_keys[out] || buf[2] != p.csr_vals[in] ||
        buf[3] != p.csr_vals[out]) {
      std::fprintf(stderr, "csr_final %d: the sort was handed other buffers\n", final_buffer);
      ++wrong;
    }
    if (ints[0] != 32 || ints[1] != 0 || ints[2] != hip::radix_bits_for(100) || temp != p.csr_hist ||
        temp_bytes != 256) {
      std::fprintf(stderr, "csr_final %d: n %d, bits [%d, %d), scratch %zu bytes\n", final_buffer, ints[0],
                   ints[1], ints[2], temp_bytes);
      ++wrong;
    }
  }
  std::fprintf(stderr, "wrong=%d\n", wrong);
  return wrong ? 1 : 0;
}

TEST(HipDeviceDeathTest, TheCsrSortReadsTheKeysAndWritesTheFinalBuffer) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(csr_sort_check()), ::testing::ExitedWithCode(0), "wrong=0");
}

// A module the runtime refuses leaves no error pending on the thread either (load() says it in its exception).
TEST(HipDevice, ARefusedModuleLeavesNoErrorPending) {
  hip::HipBackend be;
  std::string why;
  ASSERT_TRUE(be.usable(&why)) << why;
  const KernelSpec spec = make_spec("delta", "smla_delta", {}, grid_xy(1), 256);
  const std::vector<uint8_t> bad{'B', 'A', 'D', 0};
  EXPECT_THROW(be.load(spec, bad, 0), Error);
  EXPECT_EQ(stub("smla_stub_hip_pending"), 0) << "the refused load's error is still pending on this thread";
}

// A failed launch leaves no error pending on the thread: on ROCm >= 7 a pending error fails the next rocPRIM sort of a
// corrected run, and the host framework's next launch check (load() already cleared it after its own failures).
TEST(HipDevice, AFailedLaunchLeavesNoErrorPending) {
  hip::HipBackend be;
  std::string why;
  ASSERT_TRUE(be.usable(&why)) << why;
  const KernelSpec spec = make_spec("delta", "smla_delta", {}, grid_xy(1), 256);
  auto k = be.load(spec, {0}, 0);
  const auto failing = stub_function<void* (*)()>("smla_stub_hip_failing_stream");
  ASSERT_NE(failing, nullptr) << "the stub HIP runtime is not the one loaded";
  EXPECT_THROW(be.launch(*k, spec, SmlaParams{}, failing()), Error);
  EXPECT_EQ(stub("smla_stub_hip_pending"), 0) << "the failed launch's error is still pending on this thread";
}

// A tensor on another device than the plan's is refused by name, as on CUDA (check_ptr reads other_device): the HIP
// backend never said where device memory was, so a plan of device 1 took device 0's memory into its kernels (a memory
// access fault without peer access).
TEST(HipDevice, AnotherDevicesMemoryIsToldApart) {
  hip::HipBackend be;
  std::string why;
  ASSERT_TRUE(be.usable(&why)) << why;
  const PointerInfo mine = be.pointer_info(device_ptr(1), 1);
  EXPECT_EQ(mine.kind, PointerKind::Device);
  EXPECT_EQ(mine.other_device, -1);
  const PointerInfo other = be.pointer_info(device_ptr(0), 1);
  EXPECT_EQ(other.kind, PointerKind::Device);
  EXPECT_EQ(other.other_device, 0);
  int host = 0;
  EXPECT_EQ(be.pointer_info(&host, 1).kind, PointerKind::Host);
  // Managed memory serves every device: device 0's taken by a plan of device 1.
  const void* managed0 = reinterpret_cast<const void*>(reinterpret_cast<uint64_t>(device_ptr(0)) | (1ull << 31));
  const PointerInfo managed = be.pointer_info(managed0, 1);
  EXPECT_EQ(managed.kind, PointerKind::Device);
  EXPECT_EQ(managed.other_device, -1);
}

// Only hipErrorInvalidValue means memory the runtime does not know (ROCm 5's host memory); another error of
// hipPointerGetAttributes is the runtime's, said as such (it was taken for host memory, and run() then refused a device
// pointer as "a host pointer"), and leaves nothing pending on the thread.
TEST(HipDevice, APointerQueryThatFailsIsNotTakenForHostMemory) {
  hip::HipBackend be;
  std::string why;
  ASSERT_TRUE(be.usable(&why)) << why;
  const auto broken = stub_function<void* (*)()>("smla_stub_hip_broken_pointer");
  ASSERT_NE(broken, nullptr) << "the stub HIP runtime is not the one loaded";
  try {
    const PointerInfo got = be.pointer_info(broken(), 0);
    ADD_FAILURE() << "a failed hipPointerGetAttributes gave kind " << int(got.kind);
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::DriverError) << e.what();
    EXPECT_NE(std::string(e.what()).find("hipPointerGetAttributes failed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(stub("smla_stub_hip_pending"), 0) << "the failed query's error is still pending on this thread";
  int host = 0;
  EXPECT_EQ(be.pointer_info(&host, 0).kind, PointerKind::Host) << "hipErrorInvalidValue: memory HIP does not know";
  EXPECT_EQ(stub("smla_stub_hip_pending"), 0) << "the host-memory answer is still pending on this thread";
}

// After a failed launch, run() asks the backend whether the caller's stream is another device's (hipStreamGetDevice,
// which ROCm 5.2 lacks: there the answer is empty and the driver's error stands).
TEST(HipDevice, AnotherDevicesStreamIsNamed) {
  hip::HipBackend be;
  std::string why;
  ASSERT_TRUE(be.usable(&why)) << why;
  const auto stream = stub_function<void* (*)(int)>("smla_stub_hip_stream");
  ASSERT_NE(stream, nullptr) << "the stub HIP runtime is not the one loaded";
  EXPECT_EQ(be.foreign_stream(1, stream(0)),
            "the stream belongs to HIP device 0, and the plan is for device 1 (Problem::device): plan for the stream's "
            "device, or pass a stream of the plan's");
  EXPECT_EQ(be.foreign_stream(1, stream(1)), "");
  EXPECT_EQ(be.foreign_stream(1, nullptr), "");
  EXPECT_EQ(be.foreign_stream(1, reinterpret_cast<void*>(0x1230)), "") << "a handle the runtime does not know";
}

}  // namespace
}  // namespace smla::test
