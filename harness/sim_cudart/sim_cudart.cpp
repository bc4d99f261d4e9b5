// A CUDA runtime that serves host memory: libcudart.so.13 for machines
// without a GPU. Programs linked against it reference
// `cudaMalloc@libcudart.so.13` exactly as against the real runtime, so the
// interposer is exercised through the same dynamic-linking path in CI.
//
// Behaviour that tests rely on:
//   * memory comes from sim::Memory (sim_memory.h): zero-filled, 256-byte
//     aligned, limited by ALLOCSCOPE_SIM_MEMORY_LIMIT, a bad free changes
//     nothing and returns cudaErrorInvalidValue; a child forked while other
//     threads allocate can allocate too;
//   * device and managed memory come from the driver, libsimcuda.so next to
//     this library (sim_cuda.cpp), reached like the real runtime reaches
//     libcuda.so.1: dlopen RTLD_LOCAL, dlsym("cuGetProcAddress_v2"), then
//     cuGetProcAddress for each entry point. Without it (not built), they
//     come from this library's own sim::Memory. Pinned host memory is this
//     library's;
//   * cudaGetDriverEntryPoint[ByVersion][_ptsz] hand out the driver's
//     entry points through its cuGetProcAddress_v2;
//   * cudaMallocHost is implemented by calling cudaHostAlloc through the PLT,
//     as a runtime may call itself internally;
//   * ALLOCSCOPE_SIM_DEVICES devices (default 2); each has one context, and
//     cuCtxGetCurrent (a driver entry point, served here too) returns the
//     current thread's, as the real driver does for the primary context;
//   * a failed allocation writes NULL to the out-parameter, like the real one,
//     and is remembered for cudaGetLastError (per thread, cleared on read);
//   * ALLOCSCOPE_SIM_REFUSE_FREE=N: the N-th cudaFree of the process (from 1)
//     frees nothing and fails with cudaErrorLaunchFailure, as the real
//     runtime refuses frees after a kernel fault.
#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>

#include "cuda_decls.h"
#include "cuda_driver_decls.h"
#include "sim_memory.h"

#define SIM_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

enum class Pool { device, managed, host };

struct Runtime {
    int devices = 2;
    // The driver's entry points, through its cuGetProcAddress_v2.
    cuMemAlloc_v2_fn mem_alloc = nullptr;
    cuMemFree_v2_fn mem_free = nullptr;
    cuMemAllocManaged_fn mem_alloc_managed = nullptr;
    cuMemAllocAsync_fn mem_alloc_async = nullptr;
    cuMemFreeAsync_fn mem_free_async = nullptr;
    cuMemAllocFromPoolAsync_fn mem_alloc_from_pool = nullptr;
    cuGetProcAddress_v2_fn get_proc = nullptr;
};

// libsimcuda.so from this library's directory, opened like libcuda.so.1.
void connect_driver(Runtime& rt) {
    Dl_info self{};
    if (dladdr(reinterpret_cast<void*>(&connect_driver), &self) == 0 || !self.dli_fname) return;
    std::string path = self.dli_fname;
    path = path.substr(0, path.find_last_of('/') + 1) + "libsimcuda.so";
    void* driver = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!driver) return;
    rt.get_proc = reinterpret_cast<cuGetProcAddress_v2_fn>(dlsym(driver, "cuGetProcAddress_v2"));
    if (!rt.get_proc) return;
    auto get = [&](const char* name, auto& fn) {
        void* p = nullptr;
        int status = 0;
        if (rt.get_proc(name, &p, 13000, 0, &status) == kCuSuccess)
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    get("cuMemAlloc", rt.mem_alloc);
    get("cuMemFree", rt.mem_free);
    get("cuMemAllocManaged", rt.mem_alloc_managed);
    get("cuMemAllocAsync", rt.mem_alloc_async);
    get("cuMemFreeAsync", rt.mem_free_async);
    get("cuMemAllocFromPoolAsync", rt.mem_alloc_from_pool);
}

Runtime& runtime() {
    static Runtime* r = [] {
        auto* rt = new Runtime();  // never destroyed: frees may come during exit
        if (const char* v = std::getenv("ALLOCSCOPE_SIM_DEVICES")) {
            rt->devices = std::max(1, std::atoi(v));
        }
        connect_driver(*rt);
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

cudaError_t from_status(sim::Status s) {
    switch (s) {
        case sim::Status::ok:
            return cudaSuccess;
        case sim::Status::out_of_memory:
            return cudaErrorMemoryAllocation;
        case sim::Status::invalid:
            break;
    }
    return cudaErrorInvalidValue;
}

// Driver results map onto the runtime's: the codes used here are equal.
cudaError_t from_driver(CUresult_t rc) {
    return static_cast<cudaError_t>(rc);
}

cudaError_t allocate(void** out, size_t size, Pool pool) {
    if (!out) return cudaErrorInvalidValue;
    const Runtime& rt = runtime();
    auto* dptr = reinterpret_cast<CUdeviceptr_t*>(out);
    if (pool == Pool::device && rt.mem_alloc)
        return remember(from_driver(rt.mem_alloc(dptr, size)));
    if (pool == Pool::managed && rt.mem_alloc_managed)
        return remember(from_driver(rt.mem_alloc_managed(dptr, size, 1)));
    return remember(from_status(sim::Memory::instance().allocate(out, size, int(pool))));
}

cudaError_t release(void* p, Pool pool) {
    if (!p) return cudaSuccess;
    const Runtime& rt = runtime();
    if (pool != Pool::host && rt.mem_free) {
        // The driver frees device and managed memory alike.
        return remember(from_driver(rt.mem_free(reinterpret_cast<CUdeviceptr_t>(p))));
    }
    if (pool != Pool::host) {
        // Without the driver, either kind of device memory may be freed.
        sim::Status s = sim::Memory::instance().release(p, int(Pool::device));
        if (s == sim::Status::invalid) s = sim::Memory::instance().release(p, int(Pool::managed));
        return remember(from_status(s));
    }
    return remember(from_status(sim::Memory::instance().release(p, int(pool))));
}

}  // namespace

SIM_EXPORT cudaError_t cudaMalloc(void** devPtr, size_t size) {
    return allocate(devPtr, size, Pool::device);
}

namespace {

bool refuse_this_free() {
    static const long refused = [] {
        const char* v = std::getenv("ALLOCSCOPE_SIM_REFUSE_FREE");
        return v ? std::strtol(v, nullptr, 10) : 0L;
    }();
    static std::atomic<long> calls{0};
    return refused > 0 && calls.fetch_add(1, std::memory_order_relaxed) + 1 == refused;
}

}  // namespace

SIM_EXPORT cudaError_t cudaFree(void* devPtr) {
    if (refuse_this_free()) return remember(cudaErrorLaunchFailure);
    return release(devPtr, Pool::device);
}

namespace {

// The stream-ordered calls go to the driver's stream-ordered entry points.
cudaError_t allocate_async(void** out, size_t size, cudaMemPool_t pool, bool from_pool,
                           cudaStream_t stream) {
    const Runtime& rt = runtime();
    if (!out || !rt.mem_alloc_async || !rt.mem_alloc_from_pool)
        return allocate(out, size, Pool::device);
    auto* dptr = reinterpret_cast<CUdeviceptr_t*>(out);
    auto* s = reinterpret_cast<CUstream_t>(stream);
    return remember(from_driver(
        from_pool ? rt.mem_alloc_from_pool(dptr, size, reinterpret_cast<CUmemoryPool_t>(pool), s)
                  : rt.mem_alloc_async(dptr, size, s)));
}

cudaError_t release_async(void* p, cudaStream_t stream) {
    const Runtime& rt = runtime();
    if (!p || !rt.mem_free_async) return release(p, Pool::device);
    return remember(from_driver(rt.mem_free_async(reinterpret_cast<CUdeviceptr_t>(p),
                                                  reinterpret_cast<CUstream_t>(stream))));
}

}  // namespace

#define SIM_ASYNC(MALLOC, FREE, FROM_POOL)                                           \
    SIM_EXPORT cudaError_t MALLOC(void** devPtr, size_t size, cudaStream_t stream) { \
        return allocate_async(devPtr, size, nullptr, false, stream);                 \
    }                                                                                \
    SIM_EXPORT cudaError_t FREE(void* devPtr, cudaStream_t stream) {                 \
        return release_async(devPtr, stream);                                        \
    }                                                                                \
    SIM_EXPORT cudaError_t FROM_POOL(void** ptr, size_t size, cudaMemPool_t pool,    \
                                     cudaStream_t stream) {                          \
        return allocate_async(ptr, size, pool, true, stream);                        \
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
    return release(ptr, Pool::host);
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
        case cudaErrorLaunchFailure:
            return "unspecified launch failure";
        default:
            return "unrecognized error code";
    }
}

// The driver's entry points, as the real runtime hands them out: through the
// driver's cuGetProcAddress_v2 with the runtime's version (or the one asked
// for), per-thread-default-stream variants for cudaEnablePerThreadDefaultStream
// and for the _ptsz forms' default.
namespace {

constexpr unsigned long long kPerThread = 2;  // cudaEnablePerThreadDefaultStream

cudaError_t entry_point(const char* symbol, void** fn, unsigned int version,
                        unsigned long long flags, cudaDriverEntryPointQueryResult* status,
                        bool ptsz) {
    if (!symbol || !fn) return remember(cudaErrorInvalidValue);
    const Runtime& rt = runtime();
    *fn = nullptr;
    int driver_status = 1;
    const bool per_thread = (flags & kPerThread) != 0 || (ptsz && flags == 0);
    if (rt.get_proc) {
        rt.get_proc(symbol, fn, static_cast<int>(version),
                    per_thread ? kCuGetProcAddressPerThreadDefaultStream : 0, &driver_status);
    }
    if (status) {
        *status = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    }
    return cudaSuccess;
}

}  // namespace

SIM_EXPORT cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** fn,
                                               unsigned long long flags,
                                               cudaDriverEntryPointQueryResult* status) {
    return entry_point(symbol, fn, 13000, flags, status, false);
}
SIM_EXPORT cudaError_t cudaGetDriverEntryPoint_ptsz(const char* symbol, void** fn,
                                                    unsigned long long flags,
                                                    cudaDriverEntryPointQueryResult* status) {
    return entry_point(symbol, fn, 13000, flags, status, true);
}
SIM_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn,
                                                        unsigned int version,
                                                        unsigned long long flags,
                                                        cudaDriverEntryPointQueryResult* status) {
    return entry_point(symbol, fn, version, flags, status, false);
}
SIM_EXPORT cudaError_t cudaGetDriverEntryPointByVersion_ptsz(
    const char* symbol, void** fn, unsigned int version, unsigned long long flags,
    cudaDriverEntryPointQueryResult* status) {
    return entry_point(symbol, fn, version, flags, status, true);
}
