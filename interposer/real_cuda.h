// Lazy resolution of the real CUDA runtime functions the hooks forward to.
#pragma once

namespace allocscope {

// The next definition of `name` after liballocscope.so in lookup order
// (dlsym(RTLD_NEXT)); when libcudart was loaded RTLD_LOCAL that finds nothing,
// so fall back to the already-loaded libcudart.so.13 / .so.12
// (dlopen RTLD_NOLOAD). Returns nullptr when no runtime is loaded.
void* resolve_real(const char* name) noexcept;

// glibc's dlsym called from liballocscope.so (so RTLD_NEXT means "after
// liballocscope.so"), bypassing allocscope's own dlsym (hooks_driver.cpp).
void* next_symbol(void* handle, const char* name) noexcept;

template <typename Fn>
Fn real_function(const char* name) noexcept {
    return reinterpret_cast<Fn>(resolve_real(name));
}

}  // namespace allocscope
