// The current device of the calling thread, cached per thread for the
// hooks that record it (cudaMalloc and friends, the driver's allocations).
#include <atomic>

#include "cuda_decls.h"
#include "real_cuda.h"
#include "recorder_internal.h"

namespace allocscope::recorder {

// cudaGetDevice costs over a microsecond in the real runtime (measured on
// the H200 host, docs/PERFORMANCE.md), so the device is cached per thread, keyed
// by the driver's current context: the runtime's current device is the
// device of the current context, and a context never changes device.
int32_t current_device() noexcept {
    using GetDevice = cudaError_t (*)(int*);
    using GetContext = int (*)(void**);  // CUresult cuCtxGetCurrent(CUcontext*)
    // Looked up like the hooks' own real functions, and again until found: a
    // runtime loaded after the first driver-level allocation still counts.
    static std::atomic<GetDevice> device_cache{nullptr};
    static std::atomic<GetContext> context_cache{nullptr};
    const GetDevice get_device = cached_function(device_cache, &resolve_real, "cudaGetDevice");
    if (!get_device) return -1;
    const GetContext get_context =
        cached_function(context_cache, &resolve_driver, "cuCtxGetCurrent");
    void* context = nullptr;
    if (get_context && get_context(&context) == 0 && context &&
        context == t_thread.device_context) {
        return t_thread.device;
    }
    int device = -1;
    if (get_device(&device) != cudaSuccess) return -1;
    if (context) {
        t_thread.device_context = context;
        t_thread.device = device;
    }
    return device;
}

}  // namespace allocscope::recorder
