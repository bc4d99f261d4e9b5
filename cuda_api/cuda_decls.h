// The CUDA runtime declarations the hooks are defined against. With the CUDA
// headers available (-Dcuda=enabled/auto) they come from cuda_runtime_api.h,
// so a signature drift fails to compile. Without them, the minimal
// ABI-identical declarations below keep the interposer buildable.
#pragma once

#include <cstddef>

#if defined(ALLOCSCOPE_HAVE_CUDA_HEADERS)
#include <cuda_runtime_api.h>
#else
extern "C" {
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorNoDevice = 100,
    cudaErrorSharedObjectSymbolNotFound = 302,
    cudaErrorLaunchFailure = 719,
} cudaError_t;
typedef struct CUstream_st* cudaStream_t;
typedef struct CUmemPoolHandle_st* cudaMemPool_t;

cudaError_t cudaMalloc(void** devPtr, size_t size);
cudaError_t cudaFree(void* devPtr);
cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream);
cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream);
cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t memPool,
                                    cudaStream_t stream);
cudaError_t cudaMallocManaged(void** devPtr, size_t size, unsigned int flags);
cudaError_t cudaMallocPitch(void** devPtr, size_t* pitch, size_t width, size_t height);
cudaError_t cudaMallocHost(void** ptr, size_t size);
cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaDeviceSynchronize(void);
const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaGetLastError(void);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* memPool, int device);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamCreate(cudaStream_t* pStream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
enum cudaDriverEntryPointQueryResult {
    cudaDriverEntryPointSuccess = 0,
    cudaDriverEntryPointSymbolNotFound = 1,
    cudaDriverEntryPointVersionNotSufficent = 2,
};
cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** funcPtr, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult* driverStatus);
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult* driverStatus);
}
#endif

// The per-thread-default-stream entry points are exported by libcudart but
// declared by its header only under CUDA_API_PER_THREAD_DEFAULT_STREAM.
extern "C" {
cudaError_t cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t hStream);
cudaError_t cudaFreeAsync_ptsz(void* devPtr, cudaStream_t hStream);
cudaError_t cudaMallocFromPoolAsync_ptsz(void** ptr, size_t size, cudaMemPool_t memPool,
                                         cudaStream_t stream);
cudaError_t cudaGetDriverEntryPoint_ptsz(const char* symbol, void** funcPtr,
                                         unsigned long long flags,
                                         enum cudaDriverEntryPointQueryResult* driverStatus);
cudaError_t cudaGetDriverEntryPointByVersion_ptsz(
    const char* symbol, void** funcPtr, unsigned int cudaVersion, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult* driverStatus);
}
