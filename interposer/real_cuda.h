// Lazy resolution of the real CUDA functions the hooks forward to: one
// lookup rule for the runtime and the driver, one cache for every hook.
#pragma once

#include <atomic>

namespace allocscope {

// The next definition of `name` after liballocscope.so in lookup order
// (dlsym(RTLD_NEXT)); when libcudart was loaded RTLD_LOCAL that finds nothing,
// so fall back to the already-loaded libcudart.so.13 / .so.12
// (dlopen RTLD_NOLOAD). Returns nullptr when no runtime is loaded.
void* resolve_real(const char* name) noexcept;

// The same for libcuda's own definition: the next one after liballocscope.so,
// else the one in an already loaded libcuda.so.1 (the runtime opens it
// RTLD_LOCAL), or in ALLOCSCOPE_CUDA_DRIVER_LIB (the tests' host-memory
// driver) when that is loaded.
void* resolve_driver(const char* name) noexcept;

// glibc's dlsym called from liballocscope.so (so RTLD_NEXT means "after
// liballocscope.so"), bypassing allocscope's own dlsym (dlsym_trampoline.cpp).
void* next_symbol(void* handle, const char* name) noexcept;

// `cache`, or `resolve(name)` on first use (cached once found).
template <typename Fn>
Fn cached_function(std::atomic<Fn>& cache, void* (*resolve)(const char*) noexcept,
                   const char* name) noexcept {
    Fn fn = cache.load(std::memory_order_relaxed);
    if (!fn) {
        fn = reinterpret_cast<Fn>(resolve(name));
        if (fn) cache.store(fn, std::memory_order_relaxed);
    }
    return fn;
}

}  // namespace allocscope
