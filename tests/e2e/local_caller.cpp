// A library that uses the CUDA runtime and is itself loaded with
// dlopen(RTLD_LOCAL), the way Python loads extension modules such as
// libtorch_cuda.so: libcudart then sits outside the global scope, so the
// interposer's dlsym(RTLD_NEXT) finds nothing and it must fall back to the
// already-loaded libcudart.so.13.
#include "cuda_decls.h"

extern "C" __attribute__((visibility("default"))) int local_caller_alloc_free(size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return 1;
    return cudaFree(p) == cudaSuccess ? 0 : 2;
}
