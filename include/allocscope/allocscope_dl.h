/* Optional binding to the allocscope C API, header-only.
 *
 * Resolves the functions of <allocscope/allocscope.h> once with
 * dlsym(RTLD_DEFAULT, ...). When liballocscope.so is not loaded every call is
 * a cheap no-op, so an instrumented program runs unchanged without it.
 * Link with -ldl on glibc older than 2.34.
 *
 *   allocscope_dl_push("layers.3", "forward");
 *   ...
 *   allocscope_dl_pop();
 *
 * In C++, allocscope::ScopedTag does the push/pop pair for a scope.
 */
#ifndef ALLOCSCOPE_ALLOCSCOPE_DL_H
#define ALLOCSCOPE_ALLOCSCOPE_DL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "allocscope.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct allocscope_dl_table {
    void (*push)(const char*, const char*);
    void (*pop)(void);
    void (*step)(uint64_t);
    void (*register_param)(const char*, const char*, uint64_t, const char*, uint64_t);
    void (*mark)(const char*);
    void (*derived)(const void*, const char*, const char*, const char*);
    void (*block_alloc)(void*, size_t, int, void*);
    void (*block_free)(void*);
    void (*block_oom)(size_t, int, void*, uint64_t);
    uint64_t (*check_begin)(const char*, const char*, char*, size_t);
    int (*check_end)(uint64_t, allocscope_check_visitor, void*, char*, size_t);
    void (*allocator_counters)(int, uint64_t, uint64_t, uint64_t);
    int64_t (*config_get)(const char*, char*, size_t);
    void (*oom_parameter)(const char*, const char*, uint64_t);
} allocscope_dl_table;

static inline void allocscope_dl_fill_(allocscope_dl_table* t) {
    *(void**)&t->push = dlsym(RTLD_DEFAULT, "allocscope_push");
    *(void**)&t->pop = dlsym(RTLD_DEFAULT, "allocscope_pop");
    *(void**)&t->step = dlsym(RTLD_DEFAULT, "allocscope_step");
    *(void**)&t->register_param = dlsym(RTLD_DEFAULT, "allocscope_register_param");
    *(void**)&t->mark = dlsym(RTLD_DEFAULT, "allocscope_mark");
    *(void**)&t->derived = dlsym(RTLD_DEFAULT, "allocscope_derived");
    *(void**)&t->block_alloc = dlsym(RTLD_DEFAULT, "allocscope_block_alloc");
    *(void**)&t->block_free = dlsym(RTLD_DEFAULT, "allocscope_block_free");
    *(void**)&t->block_oom = dlsym(RTLD_DEFAULT, "allocscope_block_oom");
    *(void**)&t->check_begin = dlsym(RTLD_DEFAULT, "allocscope_check_begin");
    *(void**)&t->check_end = dlsym(RTLD_DEFAULT, "allocscope_check_end");
    *(void**)&t->allocator_counters = dlsym(RTLD_DEFAULT, "allocscope_allocator_counters");
    *(void**)&t->config_get = dlsym(RTLD_DEFAULT, "allocscope_config_get");
    *(void**)&t->oom_parameter = dlsym(RTLD_DEFAULT, "allocscope_oom_parameter");
}

/* The resolved table; members are NULL when the interposer is absent.
 * Resolution runs once per translation unit; a thread that arrives while
 * another resolves waits for it (a handful of dlsym calls). A wait that
 * does not end within about a millisecond means the resolving thread is
 * gone (a child forked while another thread was resolving): the waiter
 * then resolves a table of its own rather than hang. */
static inline const allocscope_dl_table* allocscope_dl(void) {
    static allocscope_dl_table table;
    static int state; /* 0 unresolved, 1 resolving, 2 resolved */
    static __thread allocscope_dl_table own;
    static __thread int own_state;
    if (__atomic_load_n(&state, __ATOMIC_ACQUIRE) == 2) return &table;
    int expected = 0;
    if (__atomic_compare_exchange_n(&state, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        allocscope_dl_fill_(&table);
        __atomic_store_n(&state, 2, __ATOMIC_RELEASE);
        return &table;
    }
    for (long spins = 0; __atomic_load_n(&state, __ATOMIC_ACQUIRE) != 2; ++spins) {
        if (spins > 1000000) {
            if (!own_state) {
                allocscope_dl_fill_(&own);
                own_state = 1;
            }
            return &own;
        }
    }
    return &table;
}

/* Nonzero when liballocscope.so is loaded in this process. */
static inline int allocscope_dl_available(void) {
    return allocscope_dl()->push != 0;
}

static inline void allocscope_dl_push(const char* layer, const char* phase) {
    const allocscope_dl_table* t = allocscope_dl();
    if (t->push) t->push(layer, phase);
}
static inline void allocscope_dl_pop(void) {
    const allocscope_dl_table* t = allocscope_dl();
    if (t->pop) t->pop();
}
static inline void allocscope_dl_step(uint64_t step) {
    const allocscope_dl_table* t = allocscope_dl();
    if (t->step) t->step(step);
}
static inline void allocscope_dl_register_param(const char* layer, const char* name, uint64_t numel,
                                                const char* dtype, uint64_t sharded_numel) {
    const allocscope_dl_table* t = allocscope_dl();
    if (t->register_param) t->register_param(layer, name, numel, dtype, sharded_numel);
}
static inline void allocscope_dl_mark(const char* text) {
    const allocscope_dl_table* t = allocscope_dl();
    if (t->mark) t->mark(text);
}
static inline void allocscope_dl_derived(const void* ptr, const char* layer, const char* name,
                                         const char* how) {
    const allocscope_dl_table* t = allocscope_dl();
    if (t->derived) t->derived(ptr, layer, name, how);
}
static inline void allocscope_dl_block_alloc(void* ptr, size_t size, int device, void* stream) {
    const allocscope_dl_table* t = allocscope_dl();
    if (t->block_alloc) t->block_alloc(ptr, size, device, stream);
}
static inline void allocscope_dl_block_free(void* ptr) {
    const allocscope_dl_table* t = allocscope_dl();
    if (t->block_free) t->block_free(ptr);
}
static inline void allocscope_dl_block_oom(size_t size, int device, void* stream,
                                           uint64_t device_free) {
    const allocscope_dl_table* t = allocscope_dl();
    if (t->block_oom) t->block_oom(size, device, stream, device_free);
}
static inline void allocscope_dl_allocator_counters(int device, uint64_t allocated,
                                                    uint64_t reserved, uint64_t device_used) {
    const allocscope_dl_table* t = allocscope_dl();
    if (t->allocator_counters) t->allocator_counters(device, allocated, reserved, device_used);
}

static inline void allocscope_dl_oom_parameter(const char* layer, const char* name,
                                               uint64_t count) {
    const allocscope_dl_table* t = allocscope_dl();
    if (t->oom_parameter) t->oom_parameter(layer, name, count);
}

/* Configuration: without the interposer (or with one older than
 * allocscope_config_get) returns -1 with "" in `out`: nothing is recorded
 * then, whatever the variable says. */
static inline int64_t allocscope_dl_config_get(const char* name, char* out, size_t size) {
    const allocscope_dl_table* t = allocscope_dl();
    if (t->config_get) return t->config_get(name, out, size);
    if (out && size > 0) out[0] = '\0';
    return -1;
}

/* Checks: without the interposer, begin returns 0 and end -1, both saying
 * so in `error`. */
static inline void allocscope_dl_not_loaded_(char* error, size_t error_size) {
    static const char text[] =
        "liballocscope.so is not loaded in this process: run it under `allocscope run -- ...` "
        "or with LD_PRELOAD=<libdir>/liballocscope.so";
    if (!error || error_size == 0) return;
    size_t n = sizeof text - 1 < error_size - 1 ? sizeof text - 1 : error_size - 1;
    memcpy(error, text, n);
    error[n] = '\0';
}
static inline uint64_t allocscope_dl_check_begin(const char* plugins, const char* options,
                                                 char* error, size_t error_size) {
    const allocscope_dl_table* t = allocscope_dl();
    if (t->check_begin) return t->check_begin(plugins, options, error, error_size);
    allocscope_dl_not_loaded_(error, error_size);
    return 0;
}
static inline int allocscope_dl_check_end(uint64_t id, allocscope_check_visitor visit, void* user,
                                          char* error, size_t error_size) {
    const allocscope_dl_table* t = allocscope_dl();
    if (t->check_end) return t->check_end(id, visit, user, error, error_size);
    allocscope_dl_not_loaded_(error, error_size);
    return -1;
}

#ifdef __cplusplus
} /* extern "C" */

namespace allocscope {

/* Pushes a tag for the lifetime of the object. */
class ScopedTag {
  public:
    ScopedTag(const char* layer, const char* phase) { allocscope_dl_push(layer, phase); }
    ~ScopedTag() { allocscope_dl_pop(); }
    ScopedTag(const ScopedTag&) = delete;
    ScopedTag& operator=(const ScopedTag&) = delete;
};

}  // namespace allocscope
#endif

#endif /* ALLOCSCOPE_ALLOCSCOPE_DL_H */
