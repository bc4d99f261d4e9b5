// liballocscope.so's dlsym: an x86-64 trampoline that leaves the caller's
// return address in place (RTLD_NEXT lookups depend on it), asks
// allocscope_dlsym_route where to go and jumps there: to glibc's dlsym, or,
// for the libcuda symbols the driver hooks wrap (driver_wrap.h), to
// the lookup that wraps what glibc's finds (hooks_driver.cpp). Libraries
// that carry a static copy of the runtime (NCCL, cuBLAS(Lt)) and libcudart
// itself look libcuda's entry points up this way.
//
// The trampoline's route runs for every dlsym in the process, including the
// ones a sanitizer runtime makes while it starts, before its shadow memory
// exists: everything on that path is uninstrumented, calls nothing
// instrumented (not even strcmp, which sanitizers intercept) and uses only
// constant-initialized data.
#include <dlfcn.h>

#include "driver_wrap.h"
#include "real_cuda.h"

using allocscope::driver::kWrappedSymbols;
using allocscope::driver::wrap_symbol;
using allocscope::driver::wrapping_enabled;

namespace {

#define ALLOCSCOPE_UNINSTRUMENTED \
    __attribute__((no_sanitize("address", "undefined", "thread"), noinline))

ALLOCSCOPE_UNINSTRUMENTED constexpr bool same_name(const char* a, const char* b) noexcept {
    while (*a && *a == *b) {
        ++a;
        ++b;
    }
    return *a == *b;
}

ALLOCSCOPE_UNINSTRUMENTED bool is_wrapped_symbol(const char* symbol) noexcept {
    if (!symbol || symbol[0] != 'c' || symbol[1] != 'u' || (symbol[2] != 'M' && symbol[2] != 'G'))
        return false;
    for (const char* name : kWrappedSymbols)
        if (same_name(name, symbol)) return true;
    return false;
}

using dlsym_fn = void* (*)(void*, const char*);
// Builtins, not std::atomic: its member functions are instrumented code.
constinit dlsym_fn g_real_dlsym = nullptr;

ALLOCSCOPE_UNINSTRUMENTED dlsym_fn real_dlsym() noexcept {
    dlsym_fn fn = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
    if (!fn) {
        void* p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!p) p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        fn = reinterpret_cast<dlsym_fn>(p);
        __atomic_store_n(&g_real_dlsym, fn, __ATOMIC_RELEASE);
    }
    return fn;
}

}  // namespace

// Called by the trampoline with dlsym's arguments: where to jump with them.
extern "C" __attribute__((visibility("hidden"))) void* allocscope_dlsym_route(void*,
                                                                              const char* name);
// The path for the names above: look up, then wrap.
extern "C" __attribute__((visibility("hidden"))) void* allocscope_dlsym_wrapped(void* handle,
                                                                                const char* name);

void* allocscope::next_symbol(void* handle, const char* name) noexcept {
    if (dlsym_fn real = real_dlsym()) return real(handle, name);
#if defined(__x86_64__)
    return nullptr;  // ::dlsym is the trampoline, which needs real_dlsym() too
#else
    return dlsym(handle, name);
#endif
}

// Only the wrapped names (never asked for by a sanitizer runtime) go on to
// instrumented code.
ALLOCSCOPE_UNINSTRUMENTED void* allocscope_dlsym_route(void*, const char* name) {
    if (is_wrapped_symbol(name) && wrapping_enabled())
        return reinterpret_cast<void*>(&allocscope_dlsym_wrapped);
    return reinterpret_cast<void*>(real_dlsym());
}

void* allocscope_dlsym_wrapped(void* handle, const char* name) {
    dlsym_fn real = real_dlsym();
    // RTLD_NEXT is resolved from liballocscope.so here, not from the caller:
    // for these names that still finds libcuda's definition.
    return real ? wrap_symbol(name, real(handle, name)) : nullptr;
}

#if defined(__x86_64__)
// dlsym: save the arguments, ask allocscope_dlsym_route where to go, restore
// them and jump there. The caller's return address stays on top of the stack,
// so glibc's dlsym sees its real caller.
asm(R"(
    .text
    .globl dlsym
    .type dlsym, @function
    .p2align 4
dlsym:
    .cfi_startproc
    endbr64
    pushq %rdi
    .cfi_adjust_cfa_offset 8
    pushq %rsi
    .cfi_adjust_cfa_offset 8
    subq $8, %rsp
    .cfi_adjust_cfa_offset 8
    call allocscope_dlsym_route
    addq $8, %rsp
    .cfi_adjust_cfa_offset -8
    popq %rsi
    .cfi_adjust_cfa_offset -8
    popq %rdi
    .cfi_adjust_cfa_offset -8
    testq %rax, %rax
    jz 1f
    jmp *%rax
1:
    xorl %eax, %eax
    ret
    .cfi_endproc
    .size dlsym, .-dlsym
)");
#endif
