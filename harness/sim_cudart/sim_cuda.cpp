// A CUDA driver that serves host memory: libsimcuda.so, the driver behind
// the tests' runtime (sim_cudart.cpp), for machines without a GPU. Like the
// real pair, the runtime opens it with dlopen (RTLD_LOCAL), looks up
// cuGetProcAddress_v2 with dlsym and gets every other entry point through it,
// so the interposer's driver hooks are exercised on the same paths as with
// libcuda.so.1: direct references, cuGetProcAddress, dlsym, and the runtime's
// cudaGetDriverEntryPoint[ByVersion].
//
// Behaviour that tests rely on:
//   * cuMemAlloc_v2 / cuMemAllocAsync / cuMemAllocFromPoolAsync /
//     cuMemAllocManaged / cuMemAllocPitch_v2 serve sim::Memory (sim_memory.h);
//     a pointer freed with the wrong call, twice, or never handed out gives
//     CUDA_ERROR_INVALID_VALUE;
//   * virtual memory management: cuMemAddressReserve reserves inaccessible
//     address space (mmap PROT_NONE); cuMemCreate makes a handle (counted
//     against ALLOCSCOPE_SIM_MEMORY_LIMIT); cuMemMap makes part of a
//     reservation readable and writable and requires the range to lie in a
//     reservation, to fit the handle at the offset and to overlap no other
//     mapping; cuMemUnmap requires every mapping it touches to lie wholly
//     inside the range, and at least one; cuMemAddressFree requires the exact
//     reservation with nothing mapped in it; cuMemRelease of a mapped handle
//     is allowed (the memory goes when the last mapping does), as in CUDA;
//     cuMemRetainAllocationHandle gives the handle mapped at an address with
//     one more reference, released by a cuMemRelease of its own;
//     cuMemExportToShareableHandle writes the handle's value as the
//     shareable handle, cuMemImportFromShareableHandle makes a new handle of
//     the same size from it (not counted against the limit);
//   * cuGetProcAddress[_v2] knows the names above (cuMemAlloc and friends
//     only from version 3020, as the _v2 ABI) and the _ptsz variants when
//     asked with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM; other names
//     give CUDA_ERROR_NOT_FOUND.
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

#include "cuda_driver_decls.h"
#include "sim_memory.h"

#define SIM_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

enum Kind { kDevice = 1, kManaged = 2 };

CUresult_t status(sim::Status s) {
    switch (s) {
        case sim::Status::ok:
            return kCuSuccess;
        case sim::Status::invalid:
            return kCuErrorInvalidValue;
        case sim::Status::out_of_memory:
            return kCuErrorOutOfMemory;
    }
    return kCuErrorInvalidValue;
}

CUresult_t allocate(CUdeviceptr_t* out, size_t size, int kind) {
    if (!out) return kCuErrorInvalidValue;
    void* p = nullptr;
    CUresult_t rc = status(sim::Memory::instance().allocate(&p, size, kind));
    *out = reinterpret_cast<CUdeviceptr_t>(p);
    return rc;
}

CUresult_t release(CUdeviceptr_t p, int kind) {
    if (p == 0) return kCuErrorInvalidValue;
    return status(sim::Memory::instance().release(reinterpret_cast<void*>(p), kind));
}

// --- virtual memory management ----------------------------------------------------

struct Handle {
    size_t size;
    int mappings;
    bool released;
    int retains;    // cuMemRetainAllocationHandle references not yet released
    bool imported;  // from cuMemImportFromShareableHandle: counts against no limit
};
struct Mapping {
    size_t size;
    CUmemHandle_t handle;
};

struct Vmm {
    std::mutex mutex;
    std::map<uint64_t, size_t> reservations;  // start -> size
    std::map<uint64_t, Mapping> mappings;     // start -> mapping
    std::map<CUmemHandle_t, Handle> handles;
    CUmemHandle_t next_handle = 0x1000;

    bool in_reservation(uint64_t p, size_t n) const {
        auto it = reservations.upper_bound(p);
        if (it == reservations.begin()) return false;
        --it;
        return p >= it->first && p + n <= it->first + it->second;
    }
    bool overlaps_mapping(uint64_t p, size_t n) const {
        auto it = mappings.lower_bound(p);
        if (it != mappings.end() && it->first < p + n) return true;
        if (it == mappings.begin()) return false;
        --it;
        return it->first + it->second.size > p;
    }
    // Drops a handle whose last reference went.
    void maybe_free(CUmemHandle_t h) {
        auto it = handles.find(h);
        if (it == handles.end() || !it->second.released || it->second.mappings > 0) return;
        if (!it->second.imported) sim::Memory::instance().unreserve(it->second.size);
        handles.erase(it);
    }
};

Vmm& vmm() {
    static Vmm* v = new Vmm();
    return *v;
}

}  // namespace

SIM_EXPORT CUresult_t cuMemAlloc_v2(CUdeviceptr_t* p, size_t n) {
    return allocate(p, n, kDevice);
}
SIM_EXPORT CUresult_t cuMemFree_v2(CUdeviceptr_t p) {
    CUresult_t rc = release(p, kDevice);  // device or managed memory alike
    return rc == kCuErrorInvalidValue ? release(p, kManaged) : rc;
}
SIM_EXPORT CUresult_t cuMemAllocPitch_v2(CUdeviceptr_t* p, size_t* pitch, size_t width,
                                         size_t height, unsigned int) {
    if (!pitch) return kCuErrorInvalidValue;
    size_t row = (width + 511) / 512 * 512;
    CUresult_t rc = allocate(p, row * height, kDevice);
    if (rc == kCuSuccess) *pitch = row;
    return rc;
}
SIM_EXPORT CUresult_t cuMemAllocManaged(CUdeviceptr_t* p, size_t n, unsigned int) {
    return allocate(p, n, kManaged);
}

#define SIM_ASYNC(ALLOC, FREE, FROM_POOL)                                                     \
    SIM_EXPORT CUresult_t ALLOC(CUdeviceptr_t* p, size_t n, CUstream_t) {                     \
        return allocate(p, n, kDevice);                                                       \
    }                                                                                         \
    SIM_EXPORT CUresult_t FREE(CUdeviceptr_t p, CUstream_t) {                                 \
        return release(p, kDevice);                                                           \
    }                                                                                         \
    SIM_EXPORT CUresult_t FROM_POOL(CUdeviceptr_t* p, size_t n, CUmemoryPool_t, CUstream_t) { \
        return allocate(p, n, kDevice);                                                       \
    }
SIM_ASYNC(cuMemAllocAsync, cuMemFreeAsync, cuMemAllocFromPoolAsync)
SIM_ASYNC(cuMemAllocAsync_ptsz, cuMemFreeAsync_ptsz, cuMemAllocFromPoolAsync_ptsz)
#undef SIM_ASYNC

SIM_EXPORT CUresult_t cuMemAddressReserve(CUdeviceptr_t* p, size_t n, size_t alignment,
                                          CUdeviceptr_t, unsigned long long) {
    if (!p || n == 0) return kCuErrorInvalidValue;
    const size_t align = alignment > 4096 ? alignment : 4096;
    void* raw =
        mmap(nullptr, n + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) return kCuErrorOutOfMemory;
    const auto base = reinterpret_cast<uint64_t>(raw);
    const uint64_t start = (base + align - 1) / align * align;
    if (start > base) munmap(raw, start - base);
    const uint64_t end = start + n;
    if (base + n + align > end) munmap(reinterpret_cast<void*>(end), base + n + align - end);
    std::lock_guard lock(vmm().mutex);
    vmm().reservations[start] = n;
    *p = start;
    return kCuSuccess;
}

SIM_EXPORT CUresult_t cuMemAddressFree(CUdeviceptr_t p, size_t n) {
    std::lock_guard lock(vmm().mutex);
    Vmm& v = vmm();
    auto it = v.reservations.find(p);
    if (it == v.reservations.end() || it->second != n || v.overlaps_mapping(p, n))
        return kCuErrorInvalidValue;
    v.reservations.erase(it);
    munmap(reinterpret_cast<void*>(p), n);
    return kCuSuccess;
}

SIM_EXPORT CUresult_t cuMemCreate(CUmemHandle_t* h, size_t n, const CUmemAllocationPropPrefix* prop,
                                  unsigned long long) {
    if (!h || !prop || n == 0) return kCuErrorInvalidValue;
    if (!sim::Memory::instance().reserve(n)) return kCuErrorOutOfMemory;
    std::lock_guard lock(vmm().mutex);
    *h = vmm().next_handle;
    vmm().next_handle += 0x10;
    vmm().handles[*h] = {n, 0, false, 0, false};
    return kCuSuccess;
}

SIM_EXPORT CUresult_t cuMemRelease(CUmemHandle_t h) {
    std::lock_guard lock(vmm().mutex);
    auto it = vmm().handles.find(h);
    if (it == vmm().handles.end() || it->second.released) return kCuErrorInvalidValue;
    if (it->second.retains > 0) {
        --it->second.retains;
        return kCuSuccess;
    }
    it->second.released = true;
    vmm().maybe_free(h);
    return kCuSuccess;
}

// The handle mapped at `addr` (anywhere inside a mapping), with one more
// reference that needs its own cuMemRelease.
SIM_EXPORT CUresult_t cuMemRetainAllocationHandle(CUmemHandle_t* h, void* addr) {
    std::lock_guard lock(vmm().mutex);
    Vmm& v = vmm();
    const auto p = reinterpret_cast<uint64_t>(addr);
    auto it = v.mappings.upper_bound(p);
    if (!h || it == v.mappings.begin()) return kCuErrorInvalidValue;
    --it;
    if (p >= it->first + it->second.size) return kCuErrorInvalidValue;
    *h = it->second.handle;
    ++v.handles[*h].retains;
    return kCuSuccess;
}

// Export: the shareable handle is the handle's value (written as an int, the
// POSIX file descriptor type). Import: a new handle to the same size.
SIM_EXPORT CUresult_t cuMemExportToShareableHandle(void* shareable, CUmemHandle_t h, int,
                                                   unsigned long long) {
    std::lock_guard lock(vmm().mutex);
    if (!shareable || !vmm().handles.contains(h)) return kCuErrorInvalidValue;
    *static_cast<int*>(shareable) = static_cast<int>(h);
    return kCuSuccess;
}

SIM_EXPORT CUresult_t cuMemImportFromShareableHandle(CUmemHandle_t* h, void* os_handle, int) {
    std::lock_guard lock(vmm().mutex);
    auto it =
        vmm().handles.find(static_cast<CUmemHandle_t>(reinterpret_cast<uintptr_t>(os_handle)));
    if (!h || it == vmm().handles.end()) return kCuErrorInvalidValue;
    *h = vmm().next_handle;
    vmm().next_handle += 0x10;
    vmm().handles[*h] = {it->second.size, 0, false, 0, true};
    return kCuSuccess;
}

SIM_EXPORT CUresult_t cuMemMap(CUdeviceptr_t p, size_t n, size_t offset, CUmemHandle_t h,
                               unsigned long long) {
    std::lock_guard lock(vmm().mutex);
    Vmm& v = vmm();
    auto it = v.handles.find(h);
    if (it == v.handles.end() || it->second.released || n == 0 || offset > it->second.size ||
        n > it->second.size - offset || !v.in_reservation(p, n) || v.overlaps_mapping(p, n)) {
        return kCuErrorInvalidValue;
    }
    if (mprotect(reinterpret_cast<void*>(p), n, PROT_READ | PROT_WRITE) != 0)
        return kCuErrorInvalidValue;
    v.mappings[p] = {n, h};
    ++it->second.mappings;
    return kCuSuccess;
}

SIM_EXPORT CUresult_t cuMemUnmap(CUdeviceptr_t p, size_t n) {
    std::lock_guard lock(vmm().mutex);
    Vmm& v = vmm();
    auto first = v.mappings.lower_bound(p);
    if (first != v.mappings.begin()) {
        auto before = std::prev(first);
        if (before->first + before->second.size > p) return kCuErrorInvalidValue;  // cut in two
    }
    auto last = first;
    while (last != v.mappings.end() && last->first < p + n) {
        if (last->first + last->second.size > p + n) return kCuErrorInvalidValue;
        ++last;
    }
    if (first == last) return kCuErrorInvalidValue;
    for (auto it = first; it != last;) {
        void* at = reinterpret_cast<void*>(it->first);
        madvise(at, it->second.size, MADV_DONTNEED);
        mprotect(at, it->second.size, PROT_NONE);
        const CUmemHandle_t h = it->second.handle;
        it = v.mappings.erase(it);
        --v.handles[h].mappings;
        v.maybe_free(h);
    }
    return kCuSuccess;
}

// --- entry point lookup ------------------------------------------------------------

namespace {

struct Named {
    const char* base;  // the name cuGetProcAddress is asked for
    int min_version;   // versions below get CUDA_ERROR_NOT_FOUND (no v1 ABI here)
    void* fn;
    void* fn_ptsz;  // per-thread default stream variant, or fn
};

void* lookup(const char* symbol, int version, unsigned long long flags);

CUresult_t get_proc(const char* symbol, void** pfn, int version, unsigned long long flags) {
    if (!symbol || !pfn) return kCuErrorInvalidValue;
    *pfn = lookup(symbol, version, flags);
    return *pfn ? kCuSuccess : kCuErrorNotFound;
}

}  // namespace

SIM_EXPORT CUresult_t cuGetProcAddress(const char* symbol, void** pfn, int version,
                                       cuuint64_t_t flags) {
    return get_proc(symbol, pfn, version, flags);
}

SIM_EXPORT CUresult_t cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                          cuuint64_t_t flags, int* symbol_status) {
    CUresult_t rc = get_proc(symbol, pfn, version, flags);
    if (symbol_status) *symbol_status = rc == kCuSuccess ? 0 : 1;  // SUCCESS / SYMBOL_NOT_FOUND
    return rc;
}

namespace {

template <typename F>
void* fp(F f) {
    return reinterpret_cast<void*>(f);
}

void* lookup(const char* symbol, int version, unsigned long long flags) {
    const Named table[] = {
        {"cuMemAlloc", 3020, fp(&cuMemAlloc_v2), fp(&cuMemAlloc_v2)},
        {"cuMemAllocPitch", 3020, fp(&cuMemAllocPitch_v2), fp(&cuMemAllocPitch_v2)},
        {"cuMemFree", 3020, fp(&cuMemFree_v2), fp(&cuMemFree_v2)},
        {"cuMemAllocManaged", 0, fp(&cuMemAllocManaged), fp(&cuMemAllocManaged)},
        {"cuMemAllocAsync", 0, fp(&cuMemAllocAsync), fp(&cuMemAllocAsync_ptsz)},
        {"cuMemFreeAsync", 0, fp(&cuMemFreeAsync), fp(&cuMemFreeAsync_ptsz)},
        {"cuMemAllocFromPoolAsync", 0, fp(&cuMemAllocFromPoolAsync),
         fp(&cuMemAllocFromPoolAsync_ptsz)},
        {"cuMemCreate", 0, fp(&cuMemCreate), fp(&cuMemCreate)},
        {"cuMemRelease", 0, fp(&cuMemRelease), fp(&cuMemRelease)},
        {"cuMemMap", 0, fp(&cuMemMap), fp(&cuMemMap)},
        {"cuMemUnmap", 0, fp(&cuMemUnmap), fp(&cuMemUnmap)},
        {"cuMemAddressReserve", 0, fp(&cuMemAddressReserve), fp(&cuMemAddressReserve)},
        {"cuMemAddressFree", 0, fp(&cuMemAddressFree), fp(&cuMemAddressFree)},
        {"cuMemRetainAllocationHandle", 0, fp(&cuMemRetainAllocationHandle),
         fp(&cuMemRetainAllocationHandle)},
        {"cuMemExportToShareableHandle", 0, fp(&cuMemExportToShareableHandle),
         fp(&cuMemExportToShareableHandle)},
        {"cuMemImportFromShareableHandle", 0, fp(&cuMemImportFromShareableHandle),
         fp(&cuMemImportFromShareableHandle)},
        {"cuGetProcAddress", 12000, fp(&cuGetProcAddress_v2), fp(&cuGetProcAddress_v2)},
    };
    if (std::strcmp(symbol, "cuGetProcAddress") == 0 && version < 12000)
        return fp(&cuGetProcAddress);
    for (const Named& n : table) {
        if (std::strcmp(n.base, symbol) != 0) continue;
        if (version < n.min_version) return nullptr;
        return flags & kCuGetProcAddressPerThreadDefaultStream ? n.fn_ptsz : n.fn;
    }
    return nullptr;
}

}  // namespace
