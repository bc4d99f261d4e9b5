// CUDA runtime API hooks. Each is defined against the runtime's own prototype
// (cuda_decls.h) and exported unversioned (exports.map): glibc binds a
// reference to `cudaMalloc@libcudart.so.13` to an unversioned definition in a
// preloaded object, while a differently versioned one would be skipped.
//
// Shape of every hook: resolve the real function, guard, call it, record,
// return its result and out-parameters untouched. cudaFree(nullptr) and the
// like are forwarded unrecorded: they allocate nothing.
#include <atomic>
#include <cstdint>
#include <cstdio>

#include "cuda_decls.h"
#include "real_cuda.h"
#include "recorder.h"

#define ALLOCSCOPE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using allocscope::Api;
using allocscope::Level;
using allocscope::MemoryKind;
using allocscope::recorder::AllocInfo;
using allocscope::recorder::HookGuard;
using allocscope::recorder::PendingFree;

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

constexpr cudaError_t kNoRuntime = cudaErrorSharedObjectSymbolNotFound;

uint64_t as_int(const void* p) {
    return reinterpret_cast<uint64_t>(p);
}
void* out_ptr(cudaError_t rc, void** p) {
    return rc == cudaSuccess && p ? *p : nullptr;
}

AllocInfo device_alloc(Api api, size_t size, cudaStream_t stream) {
    return {api,  Level::segment, MemoryKind::device,
            size, as_int(stream), allocscope::recorder::current_device()};
}

AllocInfo host_alloc(Api api, size_t size) {
    return {api, Level::segment, MemoryKind::host_pinned, size, 0, -1};
}

// The shape of every allocation hook: `describe(rc)` says what to record once
// the real call has returned (for cudaMallocPitch the size depends on it).
template <typename Real, typename Describe, typename... Args>
cudaError_t forward_alloc(Real real, Describe describe, void** out, Args... args) {
    if (!real) return kNoRuntime;
    HookGuard guard;
    cudaError_t rc = real(out, args...);
    if (guard.recording()) allocscope::recorder::record_alloc(describe(rc), out_ptr(rc, out), rc);
    return rc;
}

template <typename Real, typename... Args>
cudaError_t forward_free(Real real, Api api, void* ptr, cudaStream_t stream, Args... args) {
    if (!real) return kNoRuntime;
    HookGuard guard;
    if (!guard.recording() || ptr == nullptr) return real(ptr, args...);
    PendingFree pending;
    allocscope::recorder::begin_free(pending, api, Level::segment, ptr, as_int(stream));
    cudaError_t rc = real(ptr, args...);
    allocscope::recorder::end_free(pending, rc);
    return rc;
}

}  // namespace

ALLOCSCOPE_EXPORT cudaError_t cudaMalloc(void** devPtr, size_t size) {
    return forward_alloc(
        REAL(cudaMalloc), [&](cudaError_t) { return device_alloc(Api::cudaMalloc, size, nullptr); },
        devPtr, size);
}

ALLOCSCOPE_EXPORT cudaError_t cudaFree(void* devPtr) {
    return forward_free(REAL(cudaFree), Api::cudaFree, devPtr, nullptr);
}

#define ALLOCSCOPE_ASYNC_HOOKS(MALLOC, FREE, FROM_POOL)                                         \
    ALLOCSCOPE_EXPORT cudaError_t MALLOC(void** devPtr, size_t size, cudaStream_t stream) {     \
        return forward_alloc(                                                                   \
            REAL(MALLOC), [&](cudaError_t) { return device_alloc(Api::MALLOC, size, stream); }, \
            devPtr, size, stream);                                                              \
    }                                                                                           \
    ALLOCSCOPE_EXPORT cudaError_t FREE(void* devPtr, cudaStream_t stream) {                     \
        return forward_free(REAL(FREE), Api::FREE, devPtr, stream, stream);                     \
    }                                                                                           \
    ALLOCSCOPE_EXPORT cudaError_t FROM_POOL(void** ptr, size_t size, cudaMemPool_t pool,        \
                                            cudaStream_t stream) {                              \
        return forward_alloc(                                                                   \
            REAL(FROM_POOL),                                                                    \
            [&](cudaError_t) { return device_alloc(Api::FROM_POOL, size, stream); }, ptr, size, \
            pool, stream);                                                                      \
    }

ALLOCSCOPE_ASYNC_HOOKS(cudaMallocAsync, cudaFreeAsync, cudaMallocFromPoolAsync)
ALLOCSCOPE_ASYNC_HOOKS(cudaMallocAsync_ptsz, cudaFreeAsync_ptsz, cudaMallocFromPoolAsync_ptsz)

ALLOCSCOPE_EXPORT cudaError_t cudaMallocManaged(void** devPtr, size_t size, unsigned int flags) {
    return forward_alloc(
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
    return forward_alloc(
        REAL(cudaMallocPitch),
        [&](cudaError_t rc) {
            // Bytes actually reserved are pitch * height; on failure, the request.
            size_t bytes = rc == cudaSuccess && pitch ? *pitch * height : width * height;
            return device_alloc(Api::cudaMallocPitch, bytes, nullptr);
        },
        devPtr, pitch, width, height);
}

ALLOCSCOPE_EXPORT cudaError_t cudaMallocHost(void** ptr, size_t size) {
    return forward_alloc(
        REAL(cudaMallocHost), [&](cudaError_t) { return host_alloc(Api::cudaMallocHost, size); },
        ptr, size);
}

ALLOCSCOPE_EXPORT cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
    return forward_alloc(
        REAL(cudaHostAlloc), [&](cudaError_t) { return host_alloc(Api::cudaHostAlloc, size); },
        pHost, size, flags);
}

ALLOCSCOPE_EXPORT cudaError_t cudaFreeHost(void* ptr) {
    return forward_free(REAL(cudaFreeHost), Api::cudaFreeHost, ptr, nullptr);
}
