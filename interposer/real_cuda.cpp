#include "real_cuda.h"

#include <dlfcn.h>

#include <initializer_list>

namespace allocscope {

void* resolve_real(const char* name) noexcept {
    if (void* fn = next_symbol(RTLD_NEXT, name)) return fn;
    for (const char* soname : {"libcudart.so.13", "libcudart.so.12"}) {
        if (void* handle = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD)) {
            void* fn = next_symbol(handle, name);
            dlclose(handle);  // RTLD_NOLOAD took a reference; the library stays loaded
            if (fn) return fn;
        }
    }
    return nullptr;
}

}  // namespace allocscope
