#include "real_cuda.h"

#include <dlfcn.h>

#include <initializer_list>

#include "recorder.h"

namespace allocscope {

namespace {

// `name` after liballocscope.so, else in the first of `libraries` that is
// already loaded and defines it.
void* next_or_in(const char* name, std::initializer_list<const char*> libraries) noexcept {
    if (void* fn = next_symbol(RTLD_NEXT, name)) return fn;
    for (const char* library : libraries) {
        if (!library) continue;
        if (void* handle = dlopen(library, RTLD_LAZY | RTLD_NOLOAD)) {
            void* fn = next_symbol(handle, name);
            dlclose(handle);  // RTLD_NOLOAD took a reference; the library stays loaded
            if (fn) return fn;
        }
    }
    return nullptr;
}

}  // namespace

void* resolve_real(const char* name) noexcept {
    return next_or_in(name, {"libcudart.so.13", "libcudart.so.12"});
}

void* resolve_driver(const char* name) noexcept {
    // ALLOCSCOPE_CUDA_DRIVER_LIB, parsed with the rest of the configuration.
    const Config* c = recorder::config();
    const char* named = c && !c->cuda_driver_lib.empty() ? c->cuda_driver_lib.c_str() : nullptr;
    return next_or_in(name, {named, "libcuda.so.1"});
}

}  // namespace allocscope
