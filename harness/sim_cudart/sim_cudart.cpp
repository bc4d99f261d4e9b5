// A CUDA runtime that serves host memory: libcudart.so.13 for machines
// without a GPU. Programs linked against it reference
// `cudaMalloc@libcudart.so.13` exactly as against the real runtime, so the
// interposer is exercised through the same dynamic-linking path in CI.
//
// Behaviour that tests rely on:
//   * every allocation is 256-byte aligned host memory, zero-filled;
//   * a request above ALLOCSCOPE_SIM_MEMORY_LIMIT bytes (default 1 TiB) in
//     total fails with cudaErrorMemoryAllocation, like an out-of-memory GPU;
//   * freeing a pointer this runtime did not hand out (or twice) returns
//     cudaErrorInvalidValue and changes nothing;
//   * cudaMallocHost is implemented by calling cudaHostAlloc through the PLT,
//     as a runtime may call itself internally;
//   * ALLOCSCOPE_SIM_DEVICES devices (default 2); each has one context, and
//     cuCtxGetCurrent (a driver entry point, served here too) returns the
//     current thread's, as the real driver does for the primary context;
//   * a failed allocation writes NULL to the out-parameter, like the real one,
//     and is remembered for cudaGetLastError (per thread, cleared on read).
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "cuda_decls.h"

#define SIM_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

enum class Pool { device, managed, host };

struct Allocation {
    size_t size;
    Pool pool;
};

// Sharded by address so that threads allocating at once do not queue on one
// lock: the interposer's benchmarks run through this runtime.
struct Shard {
    std::mutex mutex;
    std::unordered_map<uintptr_t, Allocation> live;
};

struct Runtime {
    static constexpr size_t kShards = 64;
    Shard shards[kShards];
    std::atomic<uint64_t> in_use{0};
    uint64_t limit = uint64_t{1} << 40;
    int devices = 2;

    Shard& shard_for(uintptr_t p) { return shards[(p >> 8) * 0x9E3779B97F4A7C15ull >> 58]; }
};

Runtime& runtime() {
    static Runtime* r = [] {
        auto* rt = new Runtime();  // never destroyed: frees may come during exit
        if (const char* v = std::getenv("ALLOCSCOPE_SIM_MEMORY_LIMIT")) {
            rt->limit = std::strtoull(v, nullptr, 10);
        }
        if (const char* v = std::getenv("ALLOCSCOPE_SIM_DEVICES")) {
            rt->devices = std::max(1, std::atoi(v));
        }
        return rt;
    }();
    return *r;
}

thread_local int t_device = 0;
thread_local cudaError_t t_last_error = cudaSuccess;

cudaError_t remember(cudaError_t err) {
    if (err != cudaSuccess) t_last_error = err;
    return err;
}

cudaError_t allocate(void** out, size_t size, Pool pool) {
    if (!out) return cudaErrorInvalidValue;
    *out = nullptr;
    Runtime& r = runtime();
    if (size > r.limit || r.in_use.fetch_add(size) > r.limit - size) {
        if (size <= r.limit) r.in_use.fetch_sub(size);
        return remember(cudaErrorMemoryAllocation);
    }
    size_t rounded = ((size == 0 ? 1 : size) + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, rounded);
    if (!p) {
        r.in_use.fetch_sub(size);
        return remember(cudaErrorMemoryAllocation);
    }
    std::memset(p, 0, rounded);
    auto key = reinterpret_cast<uintptr_t>(p);
    Shard& sh = r.shard_for(key);
    std::lock_guard lock(sh.mutex);
    sh.live[key] = {size, pool};
    *out = p;
    return cudaSuccess;
}

cudaError_t release(void* p, bool host) {
    if (!p) return cudaSuccess;
    Runtime& r = runtime();
    auto key = reinterpret_cast<uintptr_t>(p);
    Shard& sh = r.shard_for(key);
    {
        std::lock_guard lock(sh.mutex);
        auto it = sh.live.find(key);
        if (it == sh.live.end() || (it->second.pool == Pool::host) != host) {
            return remember(cudaErrorInvalidValue);
        }
        r.in_use.fetch_sub(it->second.size);
        sh.live.erase(it);
    }
    std::free(p);
    return cudaSuccess;
}

}  // namespace

SIM_EXPORT cudaError_t cudaMalloc(void** devPtr, size_t size) {
    return allocate(devPtr, size, Pool::device);
}

SIM_EXPORT cudaError_t cudaFree(void* devPtr) {
    return release(devPtr, false);
}

#define SIM_ASYNC(MALLOC, FREE, FROM_POOL)                                                   \
    SIM_EXPORT cudaError_t MALLOC(void** devPtr, size_t size, cudaStream_t) {                \
        return allocate(devPtr, size, Pool::device);                                         \
    }                                                                                        \
    SIM_EXPORT cudaError_t FREE(void* devPtr, cudaStream_t) {                                \
        return release(devPtr, false);                                                       \
    }                                                                                        \
    SIM_EXPORT cudaError_t FROM_POOL(void** ptr, size_t size, cudaMemPool_t, cudaStream_t) { \
        return allocate(ptr, size, Pool::device);                                            \
    }

SIM_ASYNC(cudaMallocAsync, cudaFreeAsync, cudaMallocFromPoolAsync)
SIM_ASYNC(cudaMallocAsync_ptsz, cudaFreeAsync_ptsz, cudaMallocFromPoolAsync_ptsz)

SIM_EXPORT cudaError_t cudaMallocManaged(void** devPtr, size_t size, unsigned int) {
    return allocate(devPtr, size, Pool::managed);
}

SIM_EXPORT cudaError_t cudaMallocPitch(void** devPtr, size_t* pitch, size_t width, size_t height) {
    if (!pitch) return cudaErrorInvalidValue;
    size_t p = (width + 511) / 512 * 512;
    cudaError_t rc = allocate(devPtr, p * height, Pool::device);
    if (rc == cudaSuccess) *pitch = p;
    return rc;
}

SIM_EXPORT cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int) {
    return allocate(pHost, size, Pool::host);
}

SIM_EXPORT cudaError_t cudaMallocHost(void** ptr, size_t size) {
    return cudaHostAlloc(ptr, size, 0);
}

SIM_EXPORT cudaError_t cudaFreeHost(void* ptr) {
    return release(ptr, true);
}

SIM_EXPORT cudaError_t cudaGetDevice(int* device) {
    if (!device) return cudaErrorInvalidValue;
    *device = t_device;
    return cudaSuccess;
}

SIM_EXPORT cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= runtime().devices) return cudaErrorInvalidValue;
    t_device = device;
    return cudaSuccess;
}

SIM_EXPORT cudaError_t cudaGetDeviceCount(int* n) {
    if (!n) return cudaErrorInvalidValue;
    *n = runtime().devices;
    return cudaSuccess;
}

// CUresult cuCtxGetCurrent(CUcontext*): the primary context of the current
// device (one static object per device).
SIM_EXPORT int cuCtxGetCurrent(void** context) {
    static char contexts[64];
    if (!context) return 1;  // CUDA_ERROR_INVALID_VALUE
    *context = &contexts[t_device % 64];
    return 0;
}

SIM_EXPORT cudaError_t cudaDeviceSynchronize() {
    return cudaSuccess;
}

SIM_EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t) {
    return cudaSuccess;
}

// Streams are distinct opaque handles; work on them completes immediately.
SIM_EXPORT cudaError_t cudaStreamCreate(cudaStream_t* stream) {
    if (!stream) return remember(cudaErrorInvalidValue);
    *stream = reinterpret_cast<cudaStream_t>(new char);
    return cudaSuccess;
}

SIM_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    if (!stream) return remember(cudaErrorInvalidValue);
    delete reinterpret_cast<char*>(stream);
    return cudaSuccess;
}

SIM_EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
    static int default_pool;  // an opaque, stable handle
    if (!pool || device < 0 || device >= runtime().devices) return cudaErrorInvalidValue;
    *pool = reinterpret_cast<cudaMemPool_t>(&default_pool);
    return cudaSuccess;
}

SIM_EXPORT cudaError_t cudaGetLastError() {
    cudaError_t err = t_last_error;
    t_last_error = cudaSuccess;
    return err;
}

SIM_EXPORT const char* cudaGetErrorString(cudaError_t error) {
    switch (error) {
        case cudaSuccess:
            return "no error";
        case cudaErrorInvalidValue:
            return "invalid argument";
        case cudaErrorMemoryAllocation:
            return "out of memory";
        default:
            return "unrecognized error code";
    }
}
