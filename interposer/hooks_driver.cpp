// CUDA driver API hooks: the allocation entry points of libcuda, wherever a
// program gets them from.
//
//   * direct references (a program linked against libcuda.so.1): the
//     functions below are exported unversioned and interpose libcuda's;
//   * cuGetProcAddress / cuGetProcAddress_v2 and the runtime's
//     cudaGetDriverEntryPoint[ByVersion][_ptsz] (PyTorch's expandable
//     segments; hooked in hooks_runtime.cpp): the pointer handed out is
//     swapped for a wrapper;
//   * dlsym(handle, "cuGetProcAddress_v2") and friends: libraries that carry
//     a static copy of the runtime (NCCL, cuBLAS(Lt)) and libcudart itself
//     open libcuda with dlopen and look its entry points up by name. dlsym is
//     interposed by a trampoline (dlsym_trampoline.cpp) that only sends
//     the names below here.
//
// A wrapper is a (function, slot) pair: the slot holds the real pointer it
// forwards to, so two different real functions behind one name (the _ptsz
// variant handed out for per-thread default streams, say) each get their own
// wrapper. Wrappers record through the same recorder calls as the runtime
// hooks, under the same HookGuard: a runtime call that lands in the driver
// (cudaMalloc -> cuMemAlloc_v2) is recorded once, by the runtime hook.
//
// What is recorded (pools in core/replay.h):
//   cuMemAlloc_v2, cuMemAllocPitch_v2, cuMemAlloc[FromPool]Async, cuMemAllocManaged
//       device segments, freed by cuMemFree_v2 / cuMemFreeAsync;
//   cuMemMap        a device segment at the mapped VA (tagged, with a stack);
//   cuMemUnmap      one free event for the whole range (kFlagRange), which
//                   the writer's replay splits into one free per mapping
//                   that starts inside it (core/replay.h): the hooks keep
//                   no table of mappings;
//   cuMemCreate     a physical handle (pool "physical"; address = handle);
//   cuMemRelease    ...its release; not for the extra reference
//                   cuMemRetainAllocationHandle takes, nor for a handle from
//                   cuMemImportFromShareableHandle (another process's memory);
//   cuMemAddressReserve / cuMemAddressFree   a VA range (pool "va-reserved").
// So mapped bytes count once as device segments; the handles and ranges
// behind them are reported on their own.
//
// ALLOCSCOPE_DRIVER_HOOKS=0 (or ALLOCSCOPE_DISABLE=1) hands every entry point
// out unwrapped and makes the dlsym trampoline a plain jump.
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <string_view>

#include "config.h"
#include "cuda_decls.h"
#include "cuda_driver_decls.h"
#include "driver_wrap.h"
#include "hook_forward.h"
#include "real_cuda.h"
#include "recorder.h"

#define ALLOCSCOPE_EXPORT extern "C" __attribute__((visibility("default")))

// ALLOCSCOPE_DRIVER_HOOKS and ALLOCSCOPE_DISABLE as the recorder parsed them
// (recorder::config(), read on first use). When the configuration cannot be
// read (out of memory) entry points are handed out unwrapped, and the next
// call tries again.
bool allocscope::driver::wrapping_enabled() noexcept {
    enum : int { kUnknown, kOn, kOff };
    static constinit std::atomic<int> state{kUnknown};
    int s = state.load(std::memory_order_relaxed);
    if (s == kUnknown) {
        const Config* config = recorder::config();
        if (!config) return false;
        s = config->driver_hooks && !config->disabled ? kOn : kOff;
        state.store(s, std::memory_order_relaxed);
    }
    return s == kOn;
}

namespace {

using allocscope::Api;
using allocscope::Level;
using allocscope::MemoryKind;
using allocscope::driver::wrap_entry;
using allocscope::driver::wrapping_enabled;
using allocscope::hooks::as_int;
using allocscope::hooks::forward_alloc;
using allocscope::hooks::forward_free;
using allocscope::recorder::AllocInfo;
using allocscope::recorder::HookGuard;
using allocscope::recorder::PendingFree;

void* as_ptr(uint64_t v) {
    return reinterpret_cast<void*>(v);
}

AllocInfo device_segment(Api api, size_t size, CUstream_t stream, int32_t device) {
    return {api, Level::segment, MemoryKind::device, size, as_int(stream), device};
}

// Driver calls are recorded when not nested in another hook (a runtime call
// landing in the driver is the runtime hook's) and driver hooks are on (the
// exported entry points interpose even when they are off).
bool recording(const HookGuard& guard) noexcept {
    return guard.recording() && wrapping_enabled();
}

// The driver's side of the hooks' shape (hook_forward.h).
struct DriverHooks {
    using Result = CUresult_t;
    static constexpr CUresult_t kSuccess = kCuSuccess;
    static constexpr CUresult_t kNotFound = kCuErrorNotFound;
    static bool recording(const HookGuard& guard) noexcept { return ::recording(guard); }
};

// --- handle references: a cuMemRelease that frees nothing ----------------------------

// References that need a cuMemRelease of their own which frees nothing of
// this process's: the extra ones cuMemRetainAllocationHandle took (NCCL
// retains the handle behind an address and releases it twice when it
// frees) and handles imported from another process
// (cuMemImportFromShareableHandle: NCCL's peer buffers; the memory is the
// exporter's). A count per handle, not a live table: it decides whether a
// release is recorded at all, which the writer cannot know after the fact.
// Only these three rare calls take its lock; mapping and unmapping take none.
struct Retains {
    std::mutex mutex;
    std::map<CUmemHandle_t, uint64_t> count;
};

Retains& retains() {
    static Retains* r = new Retains();  // never destroyed: releases may come at exit
    return *r;
}

// --- bodies: what each entry point does around the real call ------------------------

struct Bodies {
    static CUresult_t mem_alloc(cuMemAlloc_v2_fn real, Api api, CUdeviceptr_t* p, size_t n) {
        return forward_alloc<DriverHooks>(
            real,
            [&](CUresult_t) {
                return device_segment(api, n, nullptr, allocscope::recorder::current_device());
            },
            p, n);
    }
    static CUresult_t mem_alloc_pitch(cuMemAllocPitch_v2_fn real, Api api, CUdeviceptr_t* p,
                                      size_t* pitch, size_t width, size_t height,
                                      unsigned int element) {
        return forward_alloc<DriverHooks>(
            real,
            [&](CUresult_t rc) {
                size_t bytes = rc == kCuSuccess && pitch ? *pitch * height : width * height;
                return device_segment(api, bytes, nullptr, allocscope::recorder::current_device());
            },
            p, pitch, width, height, element);
    }
    static CUresult_t mem_free(cuMemFree_v2_fn real, Api api, CUdeviceptr_t p) {
        return forward_free<DriverHooks>(real, api, as_ptr(p), nullptr, p);
    }
    static CUresult_t mem_alloc_async(cuMemAllocAsync_fn real, Api api, CUdeviceptr_t* p, size_t n,
                                      CUstream_t s) {
        return forward_alloc<DriverHooks>(
            real,
            [&](CUresult_t) {
                return device_segment(api, n, s, allocscope::recorder::current_device());
            },
            p, n, s);
    }
    static CUresult_t mem_free_async(cuMemFreeAsync_fn real, Api api, CUdeviceptr_t p,
                                     CUstream_t s) {
        return forward_free<DriverHooks>(real, api, as_ptr(p), s, p, s);
    }
    static CUresult_t mem_alloc_from_pool(cuMemAllocFromPoolAsync_fn real, Api api,
                                          CUdeviceptr_t* p, size_t n, CUmemoryPool_t pool,
                                          CUstream_t s) {
        return forward_alloc<DriverHooks>(
            real,
            [&](CUresult_t) {
                return device_segment(api, n, s, allocscope::recorder::current_device());
            },
            p, n, pool, s);
    }
    static CUresult_t mem_alloc_managed(cuMemAllocManaged_fn real, Api api, CUdeviceptr_t* p,
                                        size_t n, unsigned int flags) {
        return forward_alloc<DriverHooks>(
            real,
            [&](CUresult_t) {
                AllocInfo info =
                    device_segment(api, n, nullptr, allocscope::recorder::current_device());
                info.memory = MemoryKind::managed;
                return info;
            },
            p, n, flags);
    }
    static CUresult_t mem_create(cuMemCreate_fn real, Api api, CUmemHandle_t* handle, size_t n,
                                 const CUmemAllocationPropPrefix* prop, unsigned long long flags) {
        return forward_alloc<DriverHooks>(
            real,
            [&](CUresult_t) {
                const int32_t device =
                    prop && prop->location_type == 1 ? prop->location_id : int32_t{-1};
                return AllocInfo{api, Level::segment, MemoryKind::physical, n, 0, device};
            },
            handle, n, prop, flags);
    }
    static CUresult_t mem_release(cuMemRelease_fn real, Api api, CUmemHandle_t handle) {
        if (!real) return kCuErrorNotFound;
        {
            std::lock_guard lock(retains().mutex);
            auto it = retains().count.find(handle);
            if (it != retains().count.end()) {
                // Drops a retained reference: the handle lives on.
                CUresult_t rc = real(handle);
                if (rc == kCuSuccess && --it->second == 0) retains().count.erase(it);
                return rc;
            }
        }
        return forward_free<DriverHooks>(real, api, as_ptr(handle), nullptr, handle);
    }
    static void count_reference(CUmemHandle_t handle) {
        std::lock_guard lock(retains().mutex);
        try {
            ++retains().count[handle];
        } catch (...) {  // out of host memory: its release counts as an odd free
        }
    }
    static CUresult_t retain_handle(cuMemRetainAllocationHandle_fn real, Api, CUmemHandle_t* handle,
                                    void* addr) {
        if (!real) return kCuErrorNotFound;
        HookGuard guard;
        CUresult_t rc = real(handle, addr);
        if (rc == kCuSuccess && handle && recording(guard)) count_reference(*handle);
        return rc;
    }
    static CUresult_t import_handle(cuMemImportFromShareableHandle_fn real, Api,
                                    CUmemHandle_t* handle, void* os_handle, int type) {
        if (!real) return kCuErrorNotFound;
        HookGuard guard;
        CUresult_t rc = real(handle, os_handle, type);
        if (rc == kCuSuccess && handle && recording(guard)) count_reference(*handle);
        return rc;
    }
    static CUresult_t mem_map(cuMemMap_fn real, Api api, CUdeviceptr_t ptr, size_t n, size_t offset,
                              CUmemHandle_t handle, unsigned long long flags) {
        if (!real) return kCuErrorNotFound;
        HookGuard guard;
        CUresult_t rc = real(ptr, n, offset, handle, flags);
        if (recording(guard)) {
            allocscope::recorder::record_alloc(
                device_segment(api, n, nullptr, allocscope::recorder::current_device()),
                rc == kCuSuccess ? as_ptr(ptr) : nullptr, rc);
        }
        return rc;
    }
    // One event for the range; the writer's replay finds the mappings in it.
    static CUresult_t mem_unmap(cuMemUnmap_fn real, Api api, CUdeviceptr_t ptr, size_t n) {
        if (!real) return kCuErrorNotFound;
        HookGuard guard;
        if (!recording(guard)) return real(ptr, n);
        PendingFree pending;
        allocscope::recorder::begin_range_free(pending, api, Level::segment, as_ptr(ptr), n);
        CUresult_t rc = real(ptr, n);
        allocscope::recorder::end_free(pending, rc);
        return rc;
    }
    static CUresult_t address_reserve(cuMemAddressReserve_fn real, Api api, CUdeviceptr_t* p,
                                      size_t n, size_t alignment, CUdeviceptr_t addr,
                                      unsigned long long flags) {
        return forward_alloc<DriverHooks>(
            real,
            [&](CUresult_t) {
                return AllocInfo{api, Level::segment, MemoryKind::address_range, n, 0, -1};
            },
            p, n, alignment, addr, flags);
    }
    static CUresult_t address_free(cuMemAddressFree_fn real, Api api, CUdeviceptr_t p, size_t n) {
        return forward_free<DriverHooks>(real, api, as_ptr(p), nullptr, p, n);
    }
};

// --- wrapper slots ---------------------------------------------------------------

constexpr int kSlots = 4;

struct Slot {
    std::atomic<void*> real{nullptr};
    std::atomic<Api> api{Api::none};
};

// One family per wrapped signature: `Body` is the Bodies member it runs.
template <typename Fn, auto Body>
struct Family {
    static inline Slot slots[kSlots];

    template <int S, typename F>
    struct Tramp;
    template <int S, typename R, typename... A>
    struct Tramp<S, R (*)(A...)> {
        static R fn(A... a) {
            Slot& slot = slots[S];
            return Body(reinterpret_cast<Fn>(slot.real.load(std::memory_order_acquire)),
                        slot.api.load(std::memory_order_relaxed), a...);
        }
    };

    static Fn wrapper(int s) {
        static constexpr Fn table[kSlots] = {&Tramp<0, Fn>::fn, &Tramp<1, Fn>::fn,
                                             &Tramp<2, Fn>::fn, &Tramp<3, Fn>::fn};
        return table[s];
    }

    static bool owns(void* p) {
        for (int s = 0; s < kSlots; ++s)
            if (reinterpret_cast<void*>(wrapper(s)) == p) return true;
        return false;
    }

    // The wrapper forwarding to `real`, taking a free slot for a new one;
    // `real` itself when every slot is taken.
    static void* wrap(void* real, Api api) {
        for (int s = 0; s < kSlots; ++s) {
            void* cur = slots[s].real.load(std::memory_order_acquire);
            if (cur == nullptr) {
                slots[s].api.store(api, std::memory_order_relaxed);
                if (slots[s].real.compare_exchange_strong(cur, real, std::memory_order_acq_rel))
                    return reinterpret_cast<void*>(wrapper(s));
            }
            if (cur == real) return reinterpret_cast<void*>(wrapper(s));
        }
        return real;
    }
};

using MemAlloc = Family<cuMemAlloc_v2_fn, &Bodies::mem_alloc>;
using MemAllocPitch = Family<cuMemAllocPitch_v2_fn, &Bodies::mem_alloc_pitch>;
using MemFree = Family<cuMemFree_v2_fn, &Bodies::mem_free>;
using MemAllocAsync = Family<cuMemAllocAsync_fn, &Bodies::mem_alloc_async>;
using MemFreeAsync = Family<cuMemFreeAsync_fn, &Bodies::mem_free_async>;
using MemAllocFromPool = Family<cuMemAllocFromPoolAsync_fn, &Bodies::mem_alloc_from_pool>;
using MemAllocManaged = Family<cuMemAllocManaged_fn, &Bodies::mem_alloc_managed>;
using MemCreate = Family<cuMemCreate_fn, &Bodies::mem_create>;
using MemRelease = Family<cuMemRelease_fn, &Bodies::mem_release>;
using MemMap = Family<cuMemMap_fn, &Bodies::mem_map>;
using MemUnmap = Family<cuMemUnmap_fn, &Bodies::mem_unmap>;
using AddressReserve = Family<cuMemAddressReserve_fn, &Bodies::address_reserve>;
using AddressFree = Family<cuMemAddressFree_fn, &Bodies::address_free>;
using RetainHandle = Family<cuMemRetainAllocationHandle_fn, &Bodies::retain_handle>;
using ImportHandle = Family<cuMemImportFromShareableHandle_fn, &Bodies::import_handle>;

// cuGetProcAddress handed out by cuGetProcAddress or dlsym: it wraps what it
// returns in turn (wrap_entry).
struct ProcAddressBodies {
    static CUresult_t v1(cuGetProcAddress_v1_fn real, Api, const char* symbol, void** pfn,
                         int version, cuuint64_t_t flags) {
        if (!real) return kCuErrorNotFound;
        CUresult_t rc = real(symbol, pfn, version, flags);
        if (rc == kCuSuccess && pfn) *pfn = wrap_entry(symbol, version, flags, *pfn);
        return rc;
    }
    static CUresult_t v2(cuGetProcAddress_v2_fn real, Api, const char* symbol, void** pfn,
                         int version, cuuint64_t_t flags, int* status) {
        if (!real) return kCuErrorNotFound;
        CUresult_t rc = real(symbol, pfn, version, flags, status);
        if (rc == kCuSuccess && pfn) *pfn = wrap_entry(symbol, version, flags, *pfn);
        return rc;
    }
};
using ProcAddressV1 = Family<cuGetProcAddress_v1_fn, &ProcAddressBodies::v1>;
using ProcAddressV2 = Family<cuGetProcAddress_v2_fn, &ProcAddressBodies::v2>;

// --- names ---------------------------------------------------------------------------

struct Entry {
    const char* symbol;  // exported name in libcuda (what dlsym is asked for)
    const char* base;    // cuGetProcAddress name (nullptr: not asked for that way)
    int min_version;     // cuGetProcAddress: lowest version giving this ABI
    Api api;             // recorded as (the _ptsz form when asked per-thread)
    Api api_ptsz;
    void* (*wrap)(void*, Api);
    bool (*owns)(void*);
};

#define ALLOCSCOPE_ENTRY(SYMBOL, BASE, MINV, API, API_PTSZ, FAMILY)     \
    Entry {                                                             \
        SYMBOL, BASE, MINV, API, API_PTSZ, &FAMILY::wrap, &FAMILY::owns \
    }

constexpr Entry kEntries[] = {
    ALLOCSCOPE_ENTRY("cuMemAlloc_v2", "cuMemAlloc", 3020, Api::cuMemAlloc_v2, Api::cuMemAlloc_v2,
                     MemAlloc),
    ALLOCSCOPE_ENTRY("cuMemAllocPitch_v2", "cuMemAllocPitch", 3020, Api::cuMemAllocPitch_v2,
                     Api::cuMemAllocPitch_v2, MemAllocPitch),
    ALLOCSCOPE_ENTRY("cuMemFree_v2", "cuMemFree", 3020, Api::cuMemFree_v2, Api::cuMemFree_v2,
                     MemFree),
    ALLOCSCOPE_ENTRY("cuMemAllocAsync", "cuMemAllocAsync", 0, Api::cuMemAllocAsync,
                     Api::cuMemAllocAsync_ptsz, MemAllocAsync),
    ALLOCSCOPE_ENTRY("cuMemAllocAsync_ptsz", nullptr, 0, Api::cuMemAllocAsync_ptsz,
                     Api::cuMemAllocAsync_ptsz, MemAllocAsync),
    ALLOCSCOPE_ENTRY("cuMemFreeAsync", "cuMemFreeAsync", 0, Api::cuMemFreeAsync,
                     Api::cuMemFreeAsync_ptsz, MemFreeAsync),
    ALLOCSCOPE_ENTRY("cuMemFreeAsync_ptsz", nullptr, 0, Api::cuMemFreeAsync_ptsz,
                     Api::cuMemFreeAsync_ptsz, MemFreeAsync),
    ALLOCSCOPE_ENTRY("cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", 0,
                     Api::cuMemAllocFromPoolAsync, Api::cuMemAllocFromPoolAsync_ptsz,
                     MemAllocFromPool),
    ALLOCSCOPE_ENTRY("cuMemAllocFromPoolAsync_ptsz", nullptr, 0, Api::cuMemAllocFromPoolAsync_ptsz,
                     Api::cuMemAllocFromPoolAsync_ptsz, MemAllocFromPool),
    ALLOCSCOPE_ENTRY("cuMemAllocManaged", "cuMemAllocManaged", 0, Api::cuMemAllocManaged,
                     Api::cuMemAllocManaged, MemAllocManaged),
    ALLOCSCOPE_ENTRY("cuMemCreate", "cuMemCreate", 0, Api::cuMemCreate, Api::cuMemCreate,
                     MemCreate),
    ALLOCSCOPE_ENTRY("cuMemRelease", "cuMemRelease", 0, Api::cuMemRelease, Api::cuMemRelease,
                     MemRelease),
    ALLOCSCOPE_ENTRY("cuMemMap", "cuMemMap", 0, Api::cuMemMap, Api::cuMemMap, MemMap),
    ALLOCSCOPE_ENTRY("cuMemUnmap", "cuMemUnmap", 0, Api::cuMemUnmap, Api::cuMemUnmap, MemUnmap),
    ALLOCSCOPE_ENTRY("cuMemAddressReserve", "cuMemAddressReserve", 0, Api::cuMemAddressReserve,
                     Api::cuMemAddressReserve, AddressReserve),
    ALLOCSCOPE_ENTRY("cuMemAddressFree", "cuMemAddressFree", 0, Api::cuMemAddressFree,
                     Api::cuMemAddressFree, AddressFree),
    ALLOCSCOPE_ENTRY("cuMemRetainAllocationHandle", "cuMemRetainAllocationHandle", 0, Api::none,
                     Api::none, RetainHandle),
    ALLOCSCOPE_ENTRY("cuMemImportFromShareableHandle", "cuMemImportFromShareableHandle", 0,
                     Api::none, Api::none, ImportHandle),
    // cuGetProcAddress asked for by name gives the 5-argument ABI from 12.0 on.
    ALLOCSCOPE_ENTRY("cuGetProcAddress", nullptr, 0, Api::none, Api::none, ProcAddressV1),
    ALLOCSCOPE_ENTRY("cuGetProcAddress_v2", "cuGetProcAddress", 12000, Api::none, Api::none,
                     ProcAddressV2),
};
#undef ALLOCSCOPE_ENTRY

// A wrapper, or an entry point liballocscope.so exports (what
// dlsym(RTLD_DEFAULT, "cuMemAlloc_v2") finds while it is preloaded).
bool is_wrapper(void* p) {
    for (const Entry& e : kEntries)
        if (e.owns(p)) return true;
    Dl_info mine{}, theirs{};
    return dladdr(reinterpret_cast<void*>(&is_wrapper), &mine) != 0 && dladdr(p, &theirs) != 0 &&
           mine.dli_fbase == theirs.dli_fbase;
}

// The trampoline's list (driver_wrap.h) is the wrapping table's, name
// for name.
constexpr bool same_symbols() {
    using allocscope::driver::kWrappedSymbols;
    if (std::size(kWrappedSymbols) != std::size(kEntries)) return false;
    for (size_t i = 0; i < std::size(kEntries); ++i)
        if (std::string_view(kWrappedSymbols[i]) != kEntries[i].symbol) return false;
    return true;
}
static_assert(same_symbols(), "kWrappedSymbols must list kEntries' symbols in order");

}  // namespace

void* allocscope::driver::wrap_entry(const char* base_name, int cuda_version,
                                     unsigned long long flags, void* real) {
    if (!real || !base_name || !wrapping_enabled() || is_wrapper(real)) return real;
    if (std::strcmp(base_name, "cuGetProcAddress") == 0 && cuda_version < 12000) {
        return ProcAddressV1::wrap(real, Api::none);
    }
    for (const Entry& e : kEntries) {
        if (e.base && std::strcmp(e.base, base_name) == 0) {
            if (cuda_version < e.min_version) return real;  // an older ABI: not ours to wrap
            const bool ptsz = (flags & kCuGetProcAddressPerThreadDefaultStream) != 0;
            return e.wrap(real, ptsz ? e.api_ptsz : e.api);
        }
    }
    return real;
}

// By exported symbol name (dlsym).
void* allocscope::driver::wrap_symbol(const char* symbol, void* real) {
    if (!real || !symbol || !wrapping_enabled() || is_wrapper(real)) return real;
    for (const Entry& e : kEntries)
        if (std::strcmp(e.symbol, symbol) == 0) return e.wrap(real, e.api);
    return real;
}

// --- the exported entry points ----------------------------------------------------------

#define REAL_DRIVER(name, type)                                                       \
    ([]() noexcept {                                                                  \
        static std::atomic<type> cache{nullptr};                                      \
        return allocscope::cached_function(cache, &allocscope::resolve_driver, name); \
    }())

ALLOCSCOPE_EXPORT CUresult_t cuGetProcAddress(const char* symbol, void** pfn, int version,
                                              cuuint64_t_t flags) {
    return ProcAddressBodies::v1(REAL_DRIVER("cuGetProcAddress", cuGetProcAddress_v1_fn), Api::none,
                                 symbol, pfn, version, flags);
}

ALLOCSCOPE_EXPORT CUresult_t cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                                 cuuint64_t_t flags, int* status) {
    return ProcAddressBodies::v2(REAL_DRIVER("cuGetProcAddress_v2", cuGetProcAddress_v2_fn),
                                 Api::none, symbol, pfn, version, flags, status);
}

ALLOCSCOPE_EXPORT CUresult_t cuMemAlloc_v2(CUdeviceptr_t* p, size_t n) {
    return Bodies::mem_alloc(REAL_DRIVER("cuMemAlloc_v2", cuMemAlloc_v2_fn), Api::cuMemAlloc_v2, p,
                             n);
}
ALLOCSCOPE_EXPORT CUresult_t cuMemAllocPitch_v2(CUdeviceptr_t* p, size_t* pitch, size_t w, size_t h,
                                                unsigned int e) {
    return Bodies::mem_alloc_pitch(REAL_DRIVER("cuMemAllocPitch_v2", cuMemAllocPitch_v2_fn),
                                   Api::cuMemAllocPitch_v2, p, pitch, w, h, e);
}
ALLOCSCOPE_EXPORT CUresult_t cuMemFree_v2(CUdeviceptr_t p) {
    return Bodies::mem_free(REAL_DRIVER("cuMemFree_v2", cuMemFree_v2_fn), Api::cuMemFree_v2, p);
}

#define ALLOCSCOPE_DRIVER_ASYNC(ALLOC, FREE, FROM_POOL)                                           \
    ALLOCSCOPE_EXPORT CUresult_t ALLOC(CUdeviceptr_t* p, size_t n, CUstream_t s) {                \
        return Bodies::mem_alloc_async(REAL_DRIVER(#ALLOC, cuMemAllocAsync_fn), Api::ALLOC, p, n, \
                                       s);                                                        \
    }                                                                                             \
    ALLOCSCOPE_EXPORT CUresult_t FREE(CUdeviceptr_t p, CUstream_t s) {                            \
        return Bodies::mem_free_async(REAL_DRIVER(#FREE, cuMemFreeAsync_fn), Api::FREE, p, s);    \
    }                                                                                             \
    ALLOCSCOPE_EXPORT CUresult_t FROM_POOL(CUdeviceptr_t* p, size_t n, CUmemoryPool_t pool,       \
                                           CUstream_t s) {                                        \
        return Bodies::mem_alloc_from_pool(REAL_DRIVER(#FROM_POOL, cuMemAllocFromPoolAsync_fn),   \
                                           Api::FROM_POOL, p, n, pool, s);                        \
    }

ALLOCSCOPE_DRIVER_ASYNC(cuMemAllocAsync, cuMemFreeAsync, cuMemAllocFromPoolAsync)
ALLOCSCOPE_DRIVER_ASYNC(cuMemAllocAsync_ptsz, cuMemFreeAsync_ptsz, cuMemAllocFromPoolAsync_ptsz)

ALLOCSCOPE_EXPORT CUresult_t cuMemAllocManaged(CUdeviceptr_t* p, size_t n, unsigned int flags) {
    return Bodies::mem_alloc_managed(REAL_DRIVER("cuMemAllocManaged", cuMemAllocManaged_fn),
                                     Api::cuMemAllocManaged, p, n, flags);
}
ALLOCSCOPE_EXPORT CUresult_t cuMemCreate(CUmemHandle_t* h, size_t n,
                                         const CUmemAllocationPropPrefix* prop,
                                         unsigned long long flags) {
    return Bodies::mem_create(REAL_DRIVER("cuMemCreate", cuMemCreate_fn), Api::cuMemCreate, h, n,
                              prop, flags);
}
ALLOCSCOPE_EXPORT CUresult_t cuMemRelease(CUmemHandle_t h) {
    return Bodies::mem_release(REAL_DRIVER("cuMemRelease", cuMemRelease_fn), Api::cuMemRelease, h);
}
ALLOCSCOPE_EXPORT CUresult_t cuMemMap(CUdeviceptr_t p, size_t n, size_t offset, CUmemHandle_t h,
                                      unsigned long long flags) {
    return Bodies::mem_map(REAL_DRIVER("cuMemMap", cuMemMap_fn), Api::cuMemMap, p, n, offset, h,
                           flags);
}
ALLOCSCOPE_EXPORT CUresult_t cuMemUnmap(CUdeviceptr_t p, size_t n) {
    return Bodies::mem_unmap(REAL_DRIVER("cuMemUnmap", cuMemUnmap_fn), Api::cuMemUnmap, p, n);
}
ALLOCSCOPE_EXPORT CUresult_t cuMemAddressReserve(CUdeviceptr_t* p, size_t n, size_t alignment,
                                                 CUdeviceptr_t addr, unsigned long long flags) {
    return Bodies::address_reserve(REAL_DRIVER("cuMemAddressReserve", cuMemAddressReserve_fn),
                                   Api::cuMemAddressReserve, p, n, alignment, addr, flags);
}
ALLOCSCOPE_EXPORT CUresult_t cuMemRetainAllocationHandle(CUmemHandle_t* h, void* addr) {
    return Bodies::retain_handle(
        REAL_DRIVER("cuMemRetainAllocationHandle", cuMemRetainAllocationHandle_fn), Api::none, h,
        addr);
}
ALLOCSCOPE_EXPORT CUresult_t cuMemImportFromShareableHandle(CUmemHandle_t* h, void* os_handle,
                                                            int type) {
    return Bodies::import_handle(
        REAL_DRIVER("cuMemImportFromShareableHandle", cuMemImportFromShareableHandle_fn), Api::none,
        h, os_handle, type);
}
ALLOCSCOPE_EXPORT CUresult_t cuMemAddressFree(CUdeviceptr_t p, size_t n) {
    return Bodies::address_free(REAL_DRIVER("cuMemAddressFree", cuMemAddressFree_fn),
                                Api::cuMemAddressFree, p, n);
}
