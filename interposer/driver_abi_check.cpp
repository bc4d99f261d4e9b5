// Compile-time check of cuda_api/cuda_driver_decls.h against cuda.h: every
// wrapped entry point has the same number of parameters, each of the same
// size, and the allocation property prefix sits where cuda.h puts it.
// Built only when the CUDA headers are found; it defines nothing.
#include <cuda.h>

#include <cstddef>
#include <type_traits>

#include "cuda_driver_decls.h"

namespace {

template <typename A, typename B>
struct SameShape : std::false_type {};
template <typename RA, typename... A, typename RB, typename... B>
struct SameShape<RA (*)(A...), RB (*)(B...)> {
    static constexpr bool value = sizeof(RA) == sizeof(RB) && sizeof...(A) == sizeof...(B) &&
                                  ((sizeof(A) == sizeof(B)) && ...);
};

#define ALLOCSCOPE_SAME(OURS, THEIRS)                          \
    static_assert(SameShape<OURS, decltype(&::THEIRS)>::value, \
                  #THEIRS " does not match cuda_api/cuda_driver_decls.h")

// cuda.h names the current ABIs by their base names (cuMemAlloc is
// cuMemAlloc_v2, cuGetProcAddress is cuGetProcAddress_v2).
ALLOCSCOPE_SAME(cuGetProcAddress_v2_fn, cuGetProcAddress);
ALLOCSCOPE_SAME(cuMemAlloc_v2_fn, cuMemAlloc);
ALLOCSCOPE_SAME(cuMemAllocPitch_v2_fn, cuMemAllocPitch);
ALLOCSCOPE_SAME(cuMemFree_v2_fn, cuMemFree);
ALLOCSCOPE_SAME(cuMemAllocAsync_fn, cuMemAllocAsync);
ALLOCSCOPE_SAME(cuMemFreeAsync_fn, cuMemFreeAsync);
ALLOCSCOPE_SAME(cuMemAllocFromPoolAsync_fn, cuMemAllocFromPoolAsync);
ALLOCSCOPE_SAME(cuMemAllocManaged_fn, cuMemAllocManaged);
ALLOCSCOPE_SAME(cuMemCreate_fn, cuMemCreate);
ALLOCSCOPE_SAME(cuMemRelease_fn, cuMemRelease);
ALLOCSCOPE_SAME(cuMemMap_fn, cuMemMap);
ALLOCSCOPE_SAME(cuMemUnmap_fn, cuMemUnmap);
ALLOCSCOPE_SAME(cuMemAddressReserve_fn, cuMemAddressReserve);
ALLOCSCOPE_SAME(cuMemAddressFree_fn, cuMemAddressFree);
ALLOCSCOPE_SAME(cuMemRetainAllocationHandle_fn, cuMemRetainAllocationHandle);
ALLOCSCOPE_SAME(cuMemExportToShareableHandle_fn, cuMemExportToShareableHandle);
ALLOCSCOPE_SAME(cuMemImportFromShareableHandle_fn, cuMemImportFromShareableHandle);
#undef ALLOCSCOPE_SAME

static_assert(sizeof(CUresult) == sizeof(CUresult_t));
static_assert(int{CUDA_SUCCESS} == int{kCuSuccess} &&
              int{CUDA_ERROR_INVALID_VALUE} == int{kCuErrorInvalidValue} &&
              int{CUDA_ERROR_OUT_OF_MEMORY} == int{kCuErrorOutOfMemory} &&
              int{CUDA_ERROR_NOT_FOUND} == int{kCuErrorNotFound});
static_assert(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM ==
              kCuGetProcAddressPerThreadDefaultStream);
static_assert(offsetof(CUmemAllocationProp, type) == offsetof(CUmemAllocationPropPrefix, type));
static_assert(offsetof(CUmemAllocationProp, location) + offsetof(CUmemLocation, type) ==
              offsetof(CUmemAllocationPropPrefix, location_type));
static_assert(offsetof(CUmemAllocationProp, location) + offsetof(CUmemLocation, id) ==
              offsetof(CUmemAllocationPropPrefix, location_id));
static_assert(CU_MEM_LOCATION_TYPE_DEVICE == 1);

}  // namespace
