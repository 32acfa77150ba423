// Collectives across processes on device memory (backend.hpp's collective_* calls) through NCCL
// from the CUDA toolkit: rank 0 makes an ncclUniqueId, the core hands it to every rank over MPI,
// each rank joins with ncclCommInitRank on its device. The operations are enqueued on the device's
// stream, so gradient buckets reduce while later kernels run; collective_wait polls an event
// against the timeout and aborts the communicator (ncclCommAbort) when a rank stops answering.
// Built without NCCL (the AMDGPU plugin: Debian has no RCCL) there are no device collectives and
// the core stages tensors through host memory and MPI.
#include <chrono>
#include <cstring>
#include <thread>

#include "src/backends/cuda/cuda_backend.hpp"

#if FLUX_NCCL
#include <nccl.h>
#endif

namespace flux::cuda_backend {

#if FLUX_NCCL
namespace {
void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) detail::fail("[CUDA] ", what, " failed: ", ncclGetErrorString(r));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8:
    case DType::boolean: return ncclUint8;
  }
  detail::fail("[CUDA] no NCCL type for dtype ", dtype_name(t));
}

ncclComm_t as_comm(void* c) { return static_cast<ncclComm_t>(c); }
}  // namespace

size_t collective_id_bytes() { return sizeof(ncclUniqueId); }

void collective_unique_id(void* id) {
  ncclUniqueId u;
  check_nccl(ncclGetUniqueId(&u), "ncclGetUniqueId");
  std::memcpy(id, &u, sizeof(u));
}

void* collective_join(const void* id, int ranks, int rank) {
  ncclUniqueId u;
  std::memcpy(&u, id, sizeof(u));
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, ranks, u, rank), "ncclCommInitRank");
  return comm;
}

void collective_allreduce_sum(void* comm, Stream s, DType t, void* data, int64_t n) {
  check_nccl(ncclAllReduce(data, data, size_t(n), nccl_type(t), ncclSum, as_comm(comm), s), "ncclAllReduce");
}

void collective_broadcast(void* comm, Stream s, void* data, size_t bytes, int root) {
  check_nccl(ncclBroadcast(data, data, bytes, ncclUint8, root, as_comm(comm), s), "ncclBroadcast");
}

void collective_allgather(void* comm, Stream s, const void* send, void* recv, size_t bytes) {
  check_nccl(ncclAllGather(send, recv, bytes, ncclUint8, as_comm(comm), s), "ncclAllGather");
}

bool collective_wait(void* comm, Stream s, double timeout) {
  cudaEvent_t done = nullptr;
  check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  check(cudaEventRecord(done, s), "cudaEventRecord");
  auto start = std::chrono::steady_clock::now();
  for (;;) {
    cudaError_t e = cudaEventQuery(done);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) {
      (void)cudaEventDestroy(done);
      check(e, "a device collective");
    }
    ncclResult_t async = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(as_comm(comm), &async), "ncclCommGetAsyncError");
    if (async != ncclSuccess && async != ncclInProgress) {
      (void)cudaEventDestroy(done);
      check_nccl(async, "a device collective");
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout) {
      (void)ncclCommAbort(as_comm(comm));
      return false;  // the event is left: the aborted stream may never reach it
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  (void)cudaEventDestroy(done);
  return true;
}

#else

size_t collective_id_bytes() { return 0; }
void collective_unique_id(void*) {}
void* collective_join(const void*, int, int) {
  detail::fail("[" FLUX_GPU_BACKEND_NAME "] no device collectives: built without NCCL");
}
void collective_allreduce_sum(void*, Stream, DType, void*, int64_t) {}
void collective_broadcast(void*, Stream, void*, size_t, int) {}
void collective_allgather(void*, Stream, const void*, void*, size_t) {}
bool collective_wait(void*, Stream, double) { return true; }

#endif

}  // namespace flux::cuda_backend
