// fake_nccl.cpp: a stand-in libnccl.so.2 for the communicator tests of test_driver_fork (runtime/nccl_api.cpp), run
// over the stub driver (tests/stub/libcuda_stub.c): CI has neither a GPU nor NCCL's transports. It moves no data and
// records what it was asked, and which CUDA context was current on the calling thread each time (read through the
// driver the process opened, $SMLA_LIBCUDA). Built twice: as NCCL >= 2.4, and (FAKE_NCCL_NO_ABORT) as an NCCL
// without ncclCommAbort. SMLA_FAKE_NCCL_INIT_FAIL=1 makes ncclCommInitRank fail as a rank without peers would.
#include <nccl.h>

#include <cstdlib>
#include <cstring>

#include "stub_symbol.hpp"

namespace {

struct Seen {
  int calls = 0;
  void* ctx = nullptr;  // the current context at the last call
};
Seen g_init, g_abort, g_destroy, g_reduce;
int g_rank = -1, g_nranks = -1;
unsigned char g_id_seen[8];
struct {
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  int type = -1, op = -1;
  void* comm = nullptr;
  void* stream = nullptr;
} g_last;
int g_comm_object;  // the only communicator this fake hands out is its address
const char* g_last_error = "";

ncclComm_t the_comm() { return reinterpret_cast<ncclComm_t>(&g_comm_object); }

// The calling thread's current context, as the driver the process loaded ($SMLA_LIBCUDA) says; (void*)-1 if it
// cannot be asked.
void* current_ctx() {
  const char* lib = std::getenv("SMLA_LIBCUDA");
  const auto get = lib ? smla::test::stub_symbol<int (*)(void**)>(lib, "cuCtxGetCurrent") : nullptr;
  void* ctx = nullptr;
  return get && get(&ctx) == 0 ? ctx : reinterpret_cast<void*>(-1);
}

void see(Seen& s) {
  ++s.calls;
  s.ctx = current_ctx();
}

}  // namespace

#define FAKE extern "C" __attribute__((visibility("default")))

FAKE ncclResult_t ncclGetVersion(int* version) {
  *version = 22105;  // 2.21.5
  return ncclSuccess;
}

FAKE ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  for (size_t i = 0; i < sizeof(id->internal); ++i) id->internal[i] = static_cast<char>(0x40 + i % 32);
  return ncclSuccess;
}

FAKE ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  see(g_init);
  g_rank = rank, g_nranks = nranks;
  std::memcpy(g_id_seen, id.internal, sizeof g_id_seen);
  const char* fail = std::getenv("SMLA_FAKE_NCCL_INIT_FAIL");
  if (fail && std::strcmp(fail, "1") == 0) {
    g_last_error = "fake NCCL: no peer joined (SMLA_FAKE_NCCL_INIT_FAIL)";
    return ncclSystemError;
  }
  *comm = the_comm();
  return ncclSuccess;
}

FAKE ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                                ncclComm_t comm, cudaStream_t stream) {
  see(g_reduce);
  g_last.send = send, g_last.recv = recv, g_last.count = count, g_last.type = int(type), g_last.op = int(op);
  g_last.comm = comm, g_last.stream = stream;
  return comm == the_comm() ? ncclSuccess : ncclInvalidArgument;
}

FAKE ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  see(g_destroy);
  return comm == the_comm() ? ncclSuccess : ncclInvalidArgument;
}

#ifndef FAKE_NCCL_NO_ABORT
FAKE ncclResult_t ncclCommAbort(ncclComm_t comm) {
  see(g_abort);
  return comm == the_comm() ? ncclSuccess : ncclInvalidArgument;
}
#endif

FAKE const char* ncclGetErrorString(ncclResult_t r) {
  return r == ncclSystemError ? "fake system error" : r == ncclInvalidArgument ? "fake invalid argument" : "fake error";
}

FAKE const char* ncclGetLastError(ncclComm_t) { return g_last_error; }

// What the fake saw. `what` is "init", "abort", "destroy" or "reduce": its calls, and the context current at the last.
FAKE int smla_fake_nccl_calls(const char* what, void** ctx) {
  const Seen* s = std::strcmp(what, "init") == 0      ? &g_init
                  : std::strcmp(what, "abort") == 0   ? &g_abort
                  : std::strcmp(what, "destroy") == 0 ? &g_destroy
                  : std::strcmp(what, "reduce") == 0  ? &g_reduce
                                                      : nullptr;
  if (!s) return -1;
  if (ctx) *ctx = s->ctx;
  return s->calls;
}

// The last ncclCommInitRank's rank and nranks, and whether it was handed the id ncclGetUniqueId makes.
FAKE void smla_fake_nccl_init_args(int* rank, int* nranks, int* id_is_ours) {
  ncclUniqueId ours;
  ncclGetUniqueId(&ours);
  *rank = g_rank, *nranks = g_nranks;
  *id_is_ours = std::memcmp(g_id_seen, ours.internal, sizeof g_id_seen) == 0;
}

// The last ncclAllReduce's arguments: send, recv, comm, stream; then count, datatype, op; whether comm was ours.
FAKE int smla_fake_nccl_last_reduce(const void** send, void** recv, void** stream, size_t* count, int* type, int* op) {
  *send = g_last.send, *recv = g_last.recv, *stream = g_last.stream;
  *count = g_last.count, *type = g_last.type, *op = g_last.op;
  return g_last.comm == the_comm();
}
