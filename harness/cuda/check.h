// Error checking for the cuda backend: every CUDA runtime, cuBLASLt and NCCL
// call goes through one of these; a failure throws std::runtime_error naming
// the call, the error string and the source line, so the harness reports one
// clear message and exits instead of computing on garbage.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace allocscope::harness::cuda {

[[noreturn]] inline void fail(const char* what, const std::string& detail, const char* file,
                              int line) {
    throw std::runtime_error(std::string(what) + " failed: " + detail + " (" + file + ":" +
                             std::to_string(line) + ")");
}

inline void check(cudaError_t status, const char* what, const char* file, int line) {
    if (status != cudaSuccess) fail(what, cudaGetErrorString(status), file, line);
}

inline void check(cublasStatus_t status, const char* what, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) {
        fail(what, std::string("cuBLAS status ") + std::to_string(int(status)), file, line);
    }
}

}  // namespace allocscope::harness::cuda

// ALLOCSCOPE_CUDA_CHECK(cudaMemcpyAsync(...));
#define ALLOCSCOPE_CUDA_CHECK(call) \
    ::allocscope::harness::cuda::check((call), #call, __FILE__, __LINE__)

// After a kernel launch: launch errors surface here, not at a later call.
#define ALLOCSCOPE_CUDA_CHECK_LAUNCH() ALLOCSCOPE_CUDA_CHECK(cudaGetLastError())
