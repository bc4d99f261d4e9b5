// The production implementations of the allocator's two injectable
// interfaces: segments from the CUDA runtime, block events to allocscope.
#include <allocscope/allocscope_dl.h>

#include <stdexcept>
#include <string>

#include "alloc/caching_allocator.h"
#include "cuda_decls.h"

namespace allocscope::harness::alloc {

namespace {

void check(cudaError_t err, const char* call) {
    if (err != cudaSuccess)
        throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(err));
}

// cudaMalloc and cudaFree act on the calling thread's current device; like
// c10::cuda::CUDAGuard, make the allocator's device current and restore the
// caller's afterwards.
class CurrentDeviceScope {
  public:
    explicit CurrentDeviceScope(int device) {
        check(cudaGetDevice(&previous_), "cudaGetDevice");
        if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
        changed_ = previous_ != device;
    }
    ~CurrentDeviceScope() {
        if (changed_) (void)cudaSetDevice(previous_);
    }
    CurrentDeviceScope(const CurrentDeviceScope&) = delete;
    CurrentDeviceScope& operator=(const CurrentDeviceScope&) = delete;

  private:
    int previous_ = 0;
    bool changed_ = false;
};

}  // namespace

SegmentSource cuda_runtime_segments(int device) {
    return {
        [device](size_t bytes) -> void* {
            CurrentDeviceScope scope(device);
            void* ptr = nullptr;
            cudaError_t err = cudaMalloc(&ptr, bytes);
            // Out of memory is the one failure the allocator recovers from
            // (by releasing its cache); anything else is a broken device.
            // Like PyTorch, clear the runtime's sticky last error so code
            // that checks cudaGetLastError() later does not see it.
            if (err == cudaErrorMemoryAllocation) {
                (void)cudaGetLastError();
                return nullptr;
            }
            check(err, "cudaMalloc");
            return ptr;
        },
        [device](void* ptr) {
            CurrentDeviceScope scope(device);
            check(cudaFree(ptr), "cudaFree");
        },
    };
}

BlockEventSink allocscope_block_events() {
    return {
        [](void* ptr, size_t size, int device, Stream stream) {
            allocscope_dl_block_alloc(ptr, size, device, stream);
        },
        [](void* ptr) { allocscope_dl_block_free(ptr); },
        // The device's free memory is not measured here (0: not known).
        [](size_t size, int device, Stream stream) {
            allocscope_dl_block_oom(size, device, stream, 0);
        },
    };
}

}  // namespace allocscope::harness::alloc
