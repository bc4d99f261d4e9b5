// CUDA driver API hooks: the allocation entry points of libcuda, wherever a
// program gets them from.
//
//   * direct references (a program linked against libcuda.so.1): the
//     functions below are exported unversioned and interpose libcuda's;
//   * cuGetProcAddress / cuGetProcAddress_v2 and the runtime's
//     cudaGetDriverEntryPoint[ByVersion][_ptsz] (PyTorch's expandable
//     segments): the pointer handed out is swapped for a wrapper;
//   * dlsym(handle, "cuGetProcAddress_v2") and friends: libraries that carry
//     a static copy of the runtime (NCCL, cuBLAS(Lt)) and libcudart itself
//     open libcuda with dlopen and look its entry points up by name. dlsym is
//     interposed by a trampoline that leaves the caller's return address in
//     place (RTLD_NEXT lookups depend on it) and only looks at the names
//     below.
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
//   cuMemUnmap      one free per mapping inside the unmapped range;
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
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "config.h"
#include "cuda_decls.h"
#include "cuda_driver_decls.h"
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

// --- switches ------------------------------------------------------------------------

bool env_switch(const char* name, bool fallback) noexcept {
    const char* v = std::getenv(name);
    if (!v) return fallback;
    std::optional<bool> b = allocscope::parse_switch(v);
    return b ? *b : fallback;  // a bad value is reported by the recorder's config
}

bool wrapping_enabled() noexcept {
    static const bool enabled =
        env_switch("ALLOCSCOPE_DRIVER_HOOKS", true) && !env_switch("ALLOCSCOPE_DISABLE", false);
    return enabled;
}

uint64_t as_int(const void* p) {
    return reinterpret_cast<uint64_t>(p);
}
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

template <typename Real, typename Describe, typename... Args>
CUresult_t drv_alloc(Real real, Describe describe, CUdeviceptr_t* out, Args... args) {
    if (!real) return kCuErrorNotFound;
    HookGuard guard;
    CUresult_t rc = real(out, args...);
    if (recording(guard)) {
        void* p = rc == kCuSuccess && out ? as_ptr(*out) : nullptr;
        allocscope::recorder::record_alloc(describe(rc), p, rc);
    }
    return rc;
}

template <typename Real, typename... Args>
CUresult_t drv_free(Real real, Api api, uint64_t address, CUstream_t stream, Args... args) {
    if (!real) return kCuErrorNotFound;
    HookGuard guard;
    if (!recording(guard) || address == 0) return real(args...);
    PendingFree pending;
    allocscope::recorder::begin_free(pending, api, Level::segment, as_ptr(address), as_int(stream));
    CUresult_t rc = real(args...);
    allocscope::recorder::end_free(pending, rc);
    return rc;
}

// --- mappings: cuMemUnmap takes a range, which may hold several mappings ------------------

struct Mappings {
    std::mutex mutex;
    std::map<uint64_t, uint64_t> by_address;  // mapped VA -> size
    // References that need a cuMemRelease of their own which frees nothing
    // of this process's: the extra ones cuMemRetainAllocationHandle took
    // (NCCL retains the handle behind an address and releases it twice when
    // it frees) and handles imported from another process
    // (cuMemImportFromShareableHandle: NCCL's peer buffers; the memory is the
    // exporter's).
    std::map<CUmemHandle_t, uint64_t> retains;
};

Mappings& mappings() {
    static Mappings* m = new Mappings();  // never destroyed: unmaps may come at exit
    return *m;
}

// --- bodies: what each entry point does around the real call ------------------------

struct Bodies {
    static CUresult_t mem_alloc(cuMemAlloc_v2_fn real, Api api, CUdeviceptr_t* p, size_t n) {
        return drv_alloc(
            real,
            [&](CUresult_t) {
                return device_segment(api, n, nullptr, allocscope::recorder::current_device());
            },
            p, n);
    }
    static CUresult_t mem_alloc_pitch(cuMemAllocPitch_v2_fn real, Api api, CUdeviceptr_t* p,
                                      size_t* pitch, size_t width, size_t height,
                                      unsigned int element) {
        return drv_alloc(
            real,
            [&](CUresult_t rc) {
                size_t bytes = rc == kCuSuccess && pitch ? *pitch * height : width * height;
                return device_segment(api, bytes, nullptr, allocscope::recorder::current_device());
            },
            p, pitch, width, height, element);
    }
    static CUresult_t mem_free(cuMemFree_v2_fn real, Api api, CUdeviceptr_t p) {
        return drv_free(real, api, p, nullptr, p);
    }
    static CUresult_t mem_alloc_async(cuMemAllocAsync_fn real, Api api, CUdeviceptr_t* p, size_t n,
                                      CUstream_t s) {
        return drv_alloc(
            real,
            [&](CUresult_t) {
                return device_segment(api, n, s, allocscope::recorder::current_device());
            },
            p, n, s);
    }
    static CUresult_t mem_free_async(cuMemFreeAsync_fn real, Api api, CUdeviceptr_t p,
                                     CUstream_t s) {
        return drv_free(real, api, p, s, p, s);
    }
    static CUresult_t mem_alloc_from_pool(cuMemAllocFromPoolAsync_fn real, Api api,
                                          CUdeviceptr_t* p, size_t n, CUmemoryPool_t pool,
                                          CUstream_t s) {
        return drv_alloc(
            real,
            [&](CUresult_t) {
                return device_segment(api, n, s, allocscope::recorder::current_device());
            },
            p, n, pool, s);
    }
    static CUresult_t mem_alloc_managed(cuMemAllocManaged_fn real, Api api, CUdeviceptr_t* p,
                                        size_t n, unsigned int flags) {
        return drv_alloc(
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
        return drv_alloc(
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
            std::lock_guard lock(mappings().mutex);
            auto it = mappings().retains.find(handle);
            if (it != mappings().retains.end()) {
                // Drops a retained reference: the handle lives on.
                CUresult_t rc = real(handle);
                if (rc == kCuSuccess && --it->second == 0) mappings().retains.erase(it);
                return rc;
            }
        }
        return drv_free(real, api, handle, nullptr, handle);
    }
    static void count_reference(CUmemHandle_t handle) {
        std::lock_guard lock(mappings().mutex);
        try {
            ++mappings().retains[handle];
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
            if (rc == kCuSuccess) {
                std::lock_guard lock(mappings().mutex);
                try {
                    mappings().by_address[ptr] = n;
                } catch (...) {  // out of host memory: the unmap then frees one address
                }
            }
            allocscope::recorder::record_alloc(
                device_segment(api, n, nullptr, allocscope::recorder::current_device()),
                rc == kCuSuccess ? as_ptr(ptr) : nullptr, rc);
        }
        return rc;
    }
    static CUresult_t mem_unmap(cuMemUnmap_fn real, Api api, CUdeviceptr_t ptr, size_t n) {
        if (!real) return kCuErrorNotFound;
        HookGuard guard;
        if (!recording(guard)) return real(ptr, n);
        // The mappings inside [ptr, ptr + n), in address order; one free each.
        std::vector<uint64_t> inside;
        {
            std::lock_guard lock(mappings().mutex);
            auto& m = mappings().by_address;
            try {
                for (auto it = m.lower_bound(ptr); it != m.end() && it->first < ptr + n; ++it)
                    inside.push_back(it->first);
            } catch (...) {
                inside.clear();
            }
        }
        if (inside.empty()) inside.push_back(ptr);  // mapped before recording began
        std::vector<PendingFree> pending(inside.size());
        for (size_t i = 0; i < inside.size(); ++i)
            allocscope::recorder::begin_free(pending[i], api, Level::segment, as_ptr(inside[i]), 0);
        CUresult_t rc = real(ptr, n);
        for (PendingFree& p : pending)
            allocscope::recorder::end_free(p, rc);
        if (rc == kCuSuccess) {
            std::lock_guard lock(mappings().mutex);
            for (uint64_t a : inside)
                mappings().by_address.erase(a);
        }
        return rc;
    }
    static CUresult_t address_reserve(cuMemAddressReserve_fn real, Api api, CUdeviceptr_t* p,
                                      size_t n, size_t alignment, CUdeviceptr_t addr,
                                      unsigned long long flags) {
        return drv_alloc(
            real,
            [&](CUresult_t) {
                return AllocInfo{api, Level::segment, MemoryKind::address_range, n, 0, -1};
            },
            p, n, alignment, addr, flags);
    }
    static CUresult_t address_free(cuMemAddressFree_fn real, Api api, CUdeviceptr_t p, size_t n) {
        return drv_free(real, api, p, nullptr, p, n);
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
// returns in turn.
void* wrap_entry(const char* base_name, int cuda_version, unsigned long long flags, void* real);

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

void* wrap_entry(const char* base_name, int cuda_version, unsigned long long flags, void* real) {
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
void* wrap_symbol(const char* symbol, void* real) {
    if (!real || !symbol || !wrapping_enabled() || is_wrapper(real)) return real;
    for (const Entry& e : kEntries)
        if (std::strcmp(e.symbol, symbol) == 0) return e.wrap(real, e.api);
    return real;
}

// --- dlsym ---------------------------------------------------------------------------
//
// The trampoline's route runs for every dlsym in the process, including the
// ones a sanitizer runtime makes while it starts, before its shadow memory
// exists: everything on that path is uninstrumented, calls nothing
// instrumented (not even strcmp, which sanitizers intercept) and uses only
// constant-initialized data.

#define ALLOCSCOPE_UNINSTRUMENTED \
    __attribute__((no_sanitize("address", "undefined", "thread"), noinline))

constexpr const char* kWrappedSymbols[] = {
    "cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemFree_v2",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemFreeAsync",
    "cuMemFreeAsync_ptsz",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocFromPoolAsync_ptsz",
    "cuMemAllocManaged",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemRetainAllocationHandle",
    "cuMemImportFromShareableHandle",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
};

ALLOCSCOPE_UNINSTRUMENTED constexpr bool same_name(const char* a, const char* b) noexcept {
    while (*a && *a == *b) {
        ++a;
        ++b;
    }
    return *a == *b;
}

// The route's list is the wrapping table's, name for name.
constexpr bool same_symbols() {
    if (std::size(kWrappedSymbols) != std::size(kEntries)) return false;
    for (size_t i = 0; i < std::size(kEntries); ++i)
        if (!same_name(kWrappedSymbols[i], kEntries[i].symbol)) return false;
    return true;
}
static_assert(same_symbols(), "kWrappedSymbols must list kEntries' symbols in order");

ALLOCSCOPE_UNINSTRUMENTED bool is_wrapped_symbol(const char* symbol) noexcept {
    if (!symbol || symbol[0] != 'c' || symbol[1] != 'u' || (symbol[2] != 'M' && symbol[2] != 'G'))
        return false;
    for (const char* name : kWrappedSymbols)
        if (same_name(name, symbol)) return true;
    return false;
}

using dlsym_fn = void* (*)(void*, const char*);
// Builtins, not std::atomic: its member functions are instrumented code.
constinit dlsym_fn g_real_dlsym = nullptr;

ALLOCSCOPE_UNINSTRUMENTED dlsym_fn real_dlsym() noexcept {
    dlsym_fn fn = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
    if (!fn) {
        void* p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!p) p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        fn = reinterpret_cast<dlsym_fn>(p);
        __atomic_store_n(&g_real_dlsym, fn, __ATOMIC_RELEASE);
    }
    return fn;
}

}  // namespace

// Called by the trampoline with dlsym's arguments: where to jump with them.
extern "C" __attribute__((visibility("hidden"))) void* allocscope_dlsym_route(void*,
                                                                              const char* name);
// The path for the names above: look up, then wrap.
extern "C" __attribute__((visibility("hidden"))) void* allocscope_dlsym_wrapped(void* handle,
                                                                                const char* name);

void* allocscope::next_symbol(void* handle, const char* name) noexcept {
    if (dlsym_fn real = real_dlsym()) return real(handle, name);
#if defined(__x86_64__)
    return nullptr;  // ::dlsym is the trampoline, which needs real_dlsym() too
#else
    return dlsym(handle, name);
#endif
}

// Only the wrapped names (never asked for by a sanitizer runtime) go on to
// instrumented code.
ALLOCSCOPE_UNINSTRUMENTED void* allocscope_dlsym_route(void*, const char* name) {
    if (is_wrapped_symbol(name) && wrapping_enabled())
        return reinterpret_cast<void*>(&allocscope_dlsym_wrapped);
    return reinterpret_cast<void*>(real_dlsym());
}

void* allocscope_dlsym_wrapped(void* handle, const char* name) {
    dlsym_fn real = real_dlsym();
    // RTLD_NEXT is resolved from liballocscope.so here, not from the caller:
    // for these names that still finds libcuda's definition.
    return real ? wrap_symbol(name, real(handle, name)) : nullptr;
}

#if defined(__x86_64__)
// dlsym: save the arguments, ask allocscope_dlsym_route where to go, restore
// them and jump there. The caller's return address stays on top of the stack,
// so glibc's dlsym sees its real caller.
asm(R"(
    .text
    .globl dlsym
    .type dlsym, @function
    .p2align 4
dlsym:
    .cfi_startproc
    endbr64
    pushq %rdi
    .cfi_adjust_cfa_offset 8
    pushq %rsi
    .cfi_adjust_cfa_offset 8
    subq $8, %rsp
    .cfi_adjust_cfa_offset 8
    call allocscope_dlsym_route
    addq $8, %rsp
    .cfi_adjust_cfa_offset -8
    popq %rsi
    .cfi_adjust_cfa_offset -8
    popq %rdi
    .cfi_adjust_cfa_offset -8
    testq %rax, %rax
    jz 1f
    jmp *%rax
1:
    xorl %eax, %eax
    ret
    .cfi_endproc
    .size dlsym, .-dlsym
)");
#endif

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
    *fn =
        wrap_entry(symbol, version, per_thread ? kCuGetProcAddressPerThreadDefaultStream : 0, *fn);
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
