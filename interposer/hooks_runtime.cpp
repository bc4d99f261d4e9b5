// CUDA runtime API hooks. Each is defined against the runtime's own prototype
// (cuda_api/cuda_decls.h) and exported unversioned (exports.map): glibc binds a
// reference to `cudaMalloc@libcudart.so.13` to an unversioned definition in a
// preloaded object, while a differently versioned one would be skipped.
//
// Shape of every hook (hook_forward.h): resolve the real function, guard,
// call it, record, return its result and out-parameters untouched.
// cudaFree(nullptr) and the like are forwarded unrecorded: they allocate
// nothing.
//
// The runtime's driver entry point lookups (cudaGetDriverEntryPoint and
// friends) are hooked here too: what they hand out is wrapped by the driver
// hooks (hooks_driver.cpp).
#include <atomic>
#include <cstdint>
#include <cstdio>

#include "cuda_decls.h"
#include "cuda_driver_decls.h"
#include "driver_wrap.h"
#include "hook_forward.h"
#include "real_cuda.h"
#include "recorder.h"

#define ALLOCSCOPE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using allocscope::Api;
using allocscope::Level;
using allocscope::MemoryKind;
using allocscope::hooks::as_int;
using allocscope::hooks::forward_alloc;
using allocscope::hooks::forward_free;
using allocscope::recorder::AllocInfo;
using allocscope::recorder::HookGuard;

template <typename Fn>
Fn cached_real(std::atomic<Fn>& cache, const char* name) noexcept {
    Fn fn = allocscope::cached_function(cache, &allocscope::resolve_real, name);
    if (!fn) {
        static std::atomic<bool> warned{false};
        if (!warned.exchange(true)) {
            std::fprintf(stderr, "allocscope: %s called but no CUDA runtime is loaded\n", name);
        }
    }
    return fn;
}

// The real function of `name`, resolved on first use and cached.
#define REAL(name)                                            \
    ([]() noexcept {                                          \
        static std::atomic<decltype(&::name)> cache{nullptr}; \
        return cached_real(cache, #name);                     \
    }())

// The runtime's side of the hooks' shape (hook_forward.h).
struct RuntimeHooks {
    using Result = cudaError_t;
    static constexpr cudaError_t kSuccess = cudaSuccess;
    static constexpr cudaError_t kNotFound = cudaErrorSharedObjectSymbolNotFound;
    static bool recording(const HookGuard& guard) noexcept { return guard.recording(); }
};

AllocInfo device_alloc(Api api, size_t size, cudaStream_t stream) {
    return {api,  Level::segment, MemoryKind::device,
            size, as_int(stream), allocscope::recorder::current_device()};
}

AllocInfo host_alloc(Api api, size_t size) {
    return {api, Level::segment, MemoryKind::host_pinned, size, 0, -1};
}

}  // namespace

ALLOCSCOPE_EXPORT cudaError_t cudaMalloc(void** devPtr, size_t size) {
    return forward_alloc<RuntimeHooks>(
        REAL(cudaMalloc), [&](cudaError_t) { return device_alloc(Api::cudaMalloc, size, nullptr); },
        devPtr, size);
}

ALLOCSCOPE_EXPORT cudaError_t cudaFree(void* devPtr) {
    return forward_free<RuntimeHooks>(REAL(cudaFree), Api::cudaFree, devPtr, nullptr, devPtr);
}

#define ALLOCSCOPE_ASYNC_HOOKS(MALLOC, FREE, FROM_POOL)                                           \
    ALLOCSCOPE_EXPORT cudaError_t MALLOC(void** devPtr, size_t size, cudaStream_t stream) {       \
        return forward_alloc<RuntimeHooks>(                                                       \
            REAL(MALLOC), [&](cudaError_t) { return device_alloc(Api::MALLOC, size, stream); },   \
            devPtr, size, stream);                                                                \
    }                                                                                             \
    ALLOCSCOPE_EXPORT cudaError_t FREE(void* devPtr, cudaStream_t stream) {                       \
        return forward_free<RuntimeHooks>(REAL(FREE), Api::FREE, devPtr, stream, devPtr, stream); \
    }                                                                                             \
    ALLOCSCOPE_EXPORT cudaError_t FROM_POOL(void** ptr, size_t size, cudaMemPool_t pool,          \
                                            cudaStream_t stream) {                                \
        return forward_alloc<RuntimeHooks>(                                                       \
            REAL(FROM_POOL),                                                                      \
            [&](cudaError_t) { return device_alloc(Api::FROM_POOL, size, stream); }, ptr, size,   \
            pool, stream);                                                                        \
    }

ALLOCSCOPE_ASYNC_HOOKS(cudaMallocAsync, cudaFreeAsync, cudaMallocFromPoolAsync)
ALLOCSCOPE_ASYNC_HOOKS(cudaMallocAsync_ptsz, cudaFreeAsync_ptsz, cudaMallocFromPoolAsync_ptsz)

ALLOCSCOPE_EXPORT cudaError_t cudaMallocManaged(void** devPtr, size_t size, unsigned int flags) {
    return forward_alloc<RuntimeHooks>(
        REAL(cudaMallocManaged),
        [&](cudaError_t) {
            AllocInfo info = device_alloc(Api::cudaMallocManaged, size, nullptr);
            info.memory = MemoryKind::managed;
            return info;
        },
        devPtr, size, flags);
}

ALLOCSCOPE_EXPORT cudaError_t cudaMallocPitch(void** devPtr, size_t* pitch, size_t width,
                                              size_t height) {
    return forward_alloc<RuntimeHooks>(
        REAL(cudaMallocPitch),
        [&](cudaError_t rc) {
            // Bytes actually reserved are pitch * height; on failure, the request.
            size_t bytes = rc == cudaSuccess && pitch ? *pitch * height : width * height;
            return device_alloc(Api::cudaMallocPitch, bytes, nullptr);
        },
        devPtr, pitch, width, height);
}

ALLOCSCOPE_EXPORT cudaError_t cudaMallocHost(void** ptr, size_t size) {
    return forward_alloc<RuntimeHooks>(
        REAL(cudaMallocHost), [&](cudaError_t) { return host_alloc(Api::cudaMallocHost, size); },
        ptr, size);
}

ALLOCSCOPE_EXPORT cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
    return forward_alloc<RuntimeHooks>(
        REAL(cudaHostAlloc), [&](cudaError_t) { return host_alloc(Api::cudaHostAlloc, size); },
        pHost, size, flags);
}

ALLOCSCOPE_EXPORT cudaError_t cudaFreeHost(void* ptr) {
    return forward_free<RuntimeHooks>(REAL(cudaFreeHost), Api::cudaFreeHost, ptr, nullptr, ptr);
}

// --- the runtime's driver entry point lookups ------------------------------------------

namespace {

// cudaGetDriverEntryPoint hands out the ABI of the runtime's own version.
constexpr int kRuntimeEntryVersion = 12000;
// cudaEnablePerThreadDefaultStream, and the default of the _ptsz variants.
constexpr unsigned long long kRuntimePerThread = 2;

// The real lookup `real` ran and succeeded: wrap what it handed out.
void wrap_runtime_result(const char* symbol, void** fn, int version, unsigned long long flags,
                         bool ptsz) {
    if (!fn) return;
    const bool per_thread = (flags & kRuntimePerThread) != 0 || (ptsz && flags == 0);
    *fn = allocscope::driver::wrap_entry(
        symbol, version, per_thread ? kCuGetProcAddressPerThreadDefaultStream : 0, *fn);
}

}  // namespace

// The lookups: resolve the runtime's own, call it, wrap what it returns.
// PARAMS is the parameter list between `funcPtr` and `flags` (the version,
// or nothing), VERSION the ABI version the entry point is asked for.
#define ALLOCSCOPE_ENTRY_POINT(NAME, PTSZ, PARAMS, ARGS, VERSION)                         \
    ALLOCSCOPE_EXPORT cudaError_t NAME(const char* symbol, void** fn PARAMS,              \
                                       unsigned long long flags,                          \
                                       enum cudaDriverEntryPointQueryResult* status) {    \
        static std::atomic<decltype(&::NAME)> cache{nullptr};                             \
        auto real = allocscope::cached_function(cache, &allocscope::resolve_real, #NAME); \
        if (!real) return cudaErrorSharedObjectSymbolNotFound;                            \
        cudaError_t rc = real(symbol, fn ARGS, flags, status);                            \
        if (rc == cudaSuccess) wrap_runtime_result(symbol, fn, VERSION, flags, PTSZ);     \
        return rc;                                                                        \
    }
#define ALLOCSCOPE_COMMA ,

// Deprecated in CUDA 12.5 in favour of ...ByVersion, still exported and used.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
ALLOCSCOPE_ENTRY_POINT(cudaGetDriverEntryPoint, false, , , kRuntimeEntryVersion)
ALLOCSCOPE_ENTRY_POINT(cudaGetDriverEntryPoint_ptsz, true, , , kRuntimeEntryVersion)
#pragma GCC diagnostic pop
ALLOCSCOPE_ENTRY_POINT(cudaGetDriverEntryPointByVersion, false,
                       ALLOCSCOPE_COMMA unsigned int version, ALLOCSCOPE_COMMA version,
                       static_cast<int>(version))
ALLOCSCOPE_ENTRY_POINT(cudaGetDriverEntryPointByVersion_ptsz, true,
                       ALLOCSCOPE_COMMA unsigned int version, ALLOCSCOPE_COMMA version,
                       static_cast<int>(version))
