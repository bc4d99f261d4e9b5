// The CUDA driver API entry points allocscope wraps, declared with
// ABI-identical plain types so that the interposer, the host-memory driver of
// the tests (harness/sim_cudart/sim_cuda.cpp) and the test programs build
// without cuda.h. cuda.h itself is not usable here: it renames cuMemAlloc to
// cuMemAlloc_v2 and cuGetProcAddress to cuGetProcAddress_v2 by macro, and the
// interposer must define both the old and the new names. When the CUDA
// headers are available, interposer/driver_abi_check.cpp checks these types
// against cuda.h.
#pragma once

#include <cstddef>

extern "C" {

typedef int CUresult_t;  // enum cudaError_enum; int-sized in the ABI
typedef unsigned long long CUdeviceptr_t;
typedef unsigned long long CUmemHandle_t;  // CUmemGenericAllocationHandle
typedef struct CUstream_st* CUstream_t;
typedef struct CUmemPoolHandle_st* CUmemoryPool_t;
typedef unsigned long long cuuint64_t_t;

// The leading members of CUmemAllocationProp: where the memory lives.
struct CUmemAllocationPropPrefix {
    int type;  // CUmemAllocationType
    int requested_handle_types;
    int location_type;  // CUmemLocationType (1 = device)
    int location_id;    // the device ordinal for device memory
};

enum : CUresult_t {
    kCuSuccess = 0,
    kCuErrorInvalidValue = 1,
    kCuErrorOutOfMemory = 2,
    kCuErrorNotFound = 500,
};

// cuGetProcAddress flags.
constexpr unsigned long long kCuGetProcAddressPerThreadDefaultStream = 1ull << 1;

// Driver signatures, by the exported symbol's name.
using cuGetProcAddress_v1_fn = CUresult_t (*)(const char* symbol, void** pfn, int cudaVersion,
                                              cuuint64_t_t flags);
using cuGetProcAddress_v2_fn = CUresult_t (*)(const char* symbol, void** pfn, int cudaVersion,
                                              cuuint64_t_t flags, int* symbolStatus);
using cuMemAlloc_v2_fn = CUresult_t (*)(CUdeviceptr_t* dptr, size_t bytesize);
using cuMemAllocPitch_v2_fn = CUresult_t (*)(CUdeviceptr_t* dptr, size_t* pPitch,
                                             size_t WidthInBytes, size_t Height,
                                             unsigned int ElementSizeBytes);
using cuMemFree_v2_fn = CUresult_t (*)(CUdeviceptr_t dptr);
using cuMemAllocAsync_fn = CUresult_t (*)(CUdeviceptr_t* dptr, size_t bytesize, CUstream_t hStream);
using cuMemFreeAsync_fn = CUresult_t (*)(CUdeviceptr_t dptr, CUstream_t hStream);
using cuMemAllocFromPoolAsync_fn = CUresult_t (*)(CUdeviceptr_t* dptr, size_t bytesize,
                                                  CUmemoryPool_t pool, CUstream_t hStream);
using cuMemAllocManaged_fn = CUresult_t (*)(CUdeviceptr_t* dptr, size_t bytesize,
                                            unsigned int flags);
using cuMemCreate_fn = CUresult_t (*)(CUmemHandle_t* handle, size_t size,
                                      const CUmemAllocationPropPrefix* prop,
                                      unsigned long long flags);
using cuMemRelease_fn = CUresult_t (*)(CUmemHandle_t handle);
using cuMemMap_fn = CUresult_t (*)(CUdeviceptr_t ptr, size_t size, size_t offset,
                                   CUmemHandle_t handle, unsigned long long flags);
using cuMemUnmap_fn = CUresult_t (*)(CUdeviceptr_t ptr, size_t size);
using cuMemAddressReserve_fn = CUresult_t (*)(CUdeviceptr_t* ptr, size_t size, size_t alignment,
                                              CUdeviceptr_t addr, unsigned long long flags);
using cuMemAddressFree_fn = CUresult_t (*)(CUdeviceptr_t ptr, size_t size);
using cuMemRetainAllocationHandle_fn = CUresult_t (*)(CUmemHandle_t* handle, void* addr);
using cuMemExportToShareableHandle_fn = CUresult_t (*)(void* shareable, CUmemHandle_t handle,
                                                       int handle_type, unsigned long long flags);
using cuMemImportFromShareableHandle_fn = CUresult_t (*)(CUmemHandle_t* handle, void* os_handle,
                                                         int handle_type);
}
