// The driver-level end-to-end program: gets CUDA driver entry points every way
// real programs do and allocates through each, so the test can check what the
// interposer recorded. Linked against a CUDA runtime (the host-memory one in
// CI, the real one on a GPU machine).
//
// Usage: driver_program DRIVER_LIB    (libsimcuda.so's path, or libcuda.so.1)
//
// Steps, each printing one line to stdout (identical with and without
// allocscope; pointers are never printed):
//   runtime      cudaMalloc 1 MiB / cudaFree: the runtime lands in the driver
//   by-version   cudaGetDriverEntryPointByVersion("cuMemAlloc"): 2 MiB inside
//                the tag layers.0/forward (PyTorch's expandable segments path)
//   proc-address dlopen(DRIVER_LIB) + dlsym("cuGetProcAddress_v2"), then
//                cuMemAllocAsync per-thread stream: 3 MiB (NCCL's path)
//   vmm          reserve 8 MiB of VA, two 2 MiB handles, map both, retain
//                the first through its address and release that reference,
//                export the second and release an imported handle of it,
//                release both, one cuMemUnmap over 4 MiB, free the VA
//   dlsym        dlsym(handle, "cuMemAlloc_v2"): 5 MiB, kept until exit
//   default      dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"), when the process has
//                one (liballocscope.so exports it): 6 MiB, kept until exit
//   bad-free     cuMemFree_v2 of an address never allocated: an error
// Exits 1 when a call returns something it must not.
#include <allocscope/allocscope_dl.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "cuda_decls.h"
#include "cuda_driver_decls.h"

namespace {

constexpr size_t kMiB = size_t{1} << 20;
int g_failures = 0;

void expect(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "driver_program: %s\n", what);
        ++g_failures;
    }
}

// CUmemAllocationProp is larger than the prefix the interposer reads; the
// driver reads all of it, so pass a zeroed full-size one.
struct AllocationProp {
    CUmemAllocationPropPrefix prefix;
    unsigned char rest[48];
};

template <typename F>
F by_version(const char* name) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
    cudaError_t rc = cudaGetDriverEntryPointByVersion(name, &fn, 12000, 0, &status);
    expect(rc == cudaSuccess && fn, "cudaGetDriverEntryPointByVersion failed");
    return reinterpret_cast<F>(fn);
}

template <typename F>
F proc(cuGetProcAddress_v2_fn get, const char* name, unsigned long long flags = 0) {
    void* fn = nullptr;
    int status = 0;
    expect(get(name, &fn, 12000, flags, &status) == kCuSuccess && fn, "cuGetProcAddress failed");
    return reinterpret_cast<F>(fn);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: driver_program DRIVER_LIB\n");
        return 2;
    }
    // runtime
    void* p = nullptr;
    expect(cudaMalloc(&p, kMiB) == cudaSuccess, "cudaMalloc failed");
    expect(cudaFree(p) == cudaSuccess, "cudaFree failed");
    std::printf("runtime ok\n");

    // by-version
    auto alloc = by_version<cuMemAlloc_v2_fn>("cuMemAlloc");
    auto free_ = by_version<cuMemFree_v2_fn>("cuMemFree");
    if (alloc && free_) {
        CUdeviceptr_t d = 0;
        allocscope_dl_push("layers.0", "forward");
        expect(alloc(&d, 2 * kMiB) == kCuSuccess && d, "cuMemAlloc (by version) failed");
        allocscope_dl_pop();
        expect(free_(d) == kCuSuccess, "cuMemFree (by version) failed");
    }
    std::printf("by-version ok\n");

    // proc-address
    void* driver = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!driver) {
        std::fprintf(stderr, "driver_program: cannot open %s: %s\n", argv[1], dlerror());
        return 1;
    }
    auto get = reinterpret_cast<cuGetProcAddress_v2_fn>(dlsym(driver, "cuGetProcAddress_v2"));
    expect(get != nullptr, "no cuGetProcAddress_v2");
    if (!get) return 1;
    auto alloc_async =
        proc<cuMemAllocAsync_fn>(get, "cuMemAllocAsync", kCuGetProcAddressPerThreadDefaultStream);
    auto free_async =
        proc<cuMemFreeAsync_fn>(get, "cuMemFreeAsync", kCuGetProcAddressPerThreadDefaultStream);
    if (alloc_async && free_async) {
        CUdeviceptr_t d = 0;
        expect(alloc_async(&d, 3 * kMiB, nullptr) == kCuSuccess && d, "cuMemAllocAsync failed");
        expect(free_async(d, nullptr) == kCuSuccess, "cuMemFreeAsync failed");
        expect(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize failed");
    }
    std::printf("proc-address ok\n");

    // vmm
    auto reserve = proc<cuMemAddressReserve_fn>(get, "cuMemAddressReserve");
    auto address_free = proc<cuMemAddressFree_fn>(get, "cuMemAddressFree");
    auto create = proc<cuMemCreate_fn>(get, "cuMemCreate");
    auto release = proc<cuMemRelease_fn>(get, "cuMemRelease");
    auto map = proc<cuMemMap_fn>(get, "cuMemMap");
    auto unmap = proc<cuMemUnmap_fn>(get, "cuMemUnmap");
    auto retain = proc<cuMemRetainAllocationHandle_fn>(get, "cuMemRetainAllocationHandle");
    auto share = proc<cuMemExportToShareableHandle_fn>(get, "cuMemExportToShareableHandle");
    auto import = proc<cuMemImportFromShareableHandle_fn>(get, "cuMemImportFromShareableHandle");
    if (reserve && address_free && create && release && map && unmap && retain && share && import) {
        CUdeviceptr_t va = 0;
        expect(reserve(&va, 8 * kMiB, 2 * kMiB, 0, 0) == kCuSuccess && va, "reserve failed");
        AllocationProp prop{};
        prop.prefix.type = 1;           // CU_MEM_ALLOCATION_TYPE_PINNED
        prop.prefix.location_type = 1;  // CU_MEM_LOCATION_TYPE_DEVICE
        prop.prefix.location_id = 0;
        CUmemHandle_t h[2] = {0, 0};
        for (CUmemHandle_t& handle : h)
            expect(create(&handle, 2 * kMiB, &prop.prefix, 0) == kCuSuccess, "create failed");
        expect(map(va, 2 * kMiB, 0, h[0], 0) == kCuSuccess, "map failed");
        expect(map(va + 2 * kMiB, 2 * kMiB, 0, h[1], 0) == kCuSuccess, "map failed");
        // As NCCL frees: retain the handle behind the address, release twice.
        CUmemHandle_t again = 0;
        expect(retain(&again, reinterpret_cast<void*>(va + 4096)) == kCuSuccess && again == h[0],
               "retain failed");
        expect(release(again) == kCuSuccess, "release of the retained handle failed");
        // As NCCL shares buffers between ranks: export a handle, import it
        // (here into the same process) and release the imported one.
        int fd = -1;
        CUmemHandle_t imported = 0;
        if (share(&fd, h[1], 1, 0) == kCuSuccess) {  // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            expect(import(&imported, reinterpret_cast<void*>(static_cast<intptr_t>(fd)), 1) ==
                       kCuSuccess,
                   "import failed");
            expect(release(imported) == kCuSuccess, "release of the imported handle failed");
        }
        for (CUmemHandle_t handle : h)
            expect(release(handle) == kCuSuccess, "release failed");
        expect(unmap(va, 4 * kMiB) == kCuSuccess, "unmap failed");
        expect(address_free(va, 8 * kMiB) == kCuSuccess, "address free failed");
    }
    std::printf("vmm ok\n");

    // dlsym
    auto direct = reinterpret_cast<cuMemAlloc_v2_fn>(dlsym(driver, "cuMemAlloc_v2"));
    expect(direct != nullptr, "no cuMemAlloc_v2");
    CUdeviceptr_t kept = 0;
    if (direct) expect(direct(&kept, 5 * kMiB) == kCuSuccess && kept, "cuMemAlloc_v2 failed");
    std::printf("dlsym ok\n");

    // default
    if (auto global = reinterpret_cast<cuMemAlloc_v2_fn>(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"))) {
        CUdeviceptr_t also_kept = 0;
        expect(global(&also_kept, 6 * kMiB) == kCuSuccess && also_kept,
               "cuMemAlloc_v2 (default) failed");
    }
    std::printf("default ok\n");

    // bad-free
    auto free_direct = reinterpret_cast<cuMemFree_v2_fn>(dlsym(driver, "cuMemFree_v2"));
    if (free_direct) {
        static char not_device_memory[64];
        expect(free_direct(reinterpret_cast<CUdeviceptr_t>(not_device_memory)) != kCuSuccess,
               "freeing a non-device address succeeded");
    }
    std::printf("bad-free ok\n");
    return g_failures == 0 ? 0 : 1;
}
