// The public C API of include/allocscope/allocscope.h.
#include "allocscope/allocscope.h"

#include "recorder.h"

#define ALLOCSCOPE_EXPORT extern "C" __attribute__((visibility("default")))

ALLOCSCOPE_EXPORT void allocscope_push(const char* layer, const char* phase) {
    allocscope::recorder::push_tag(layer, phase);
}

ALLOCSCOPE_EXPORT void allocscope_pop(void) {
    allocscope::recorder::pop_tag();
}

ALLOCSCOPE_EXPORT void allocscope_step(uint64_t step) {
    allocscope::recorder::set_step(step);
}

ALLOCSCOPE_EXPORT void allocscope_register_param(const char* layer, const char* name,
                                                 uint64_t numel, const char* dtype,
                                                 uint64_t sharded_numel) {
    allocscope::recorder::register_param(layer, name, numel, dtype, sharded_numel);
}

ALLOCSCOPE_EXPORT void allocscope_mark(const char* text) {
    allocscope::recorder::mark(text);
}

ALLOCSCOPE_EXPORT void allocscope_block_alloc(void* ptr, size_t size, int device, void* stream) {
    allocscope::recorder::HookGuard guard;
    if (!guard.recording() || ptr == nullptr) return;
    allocscope::recorder::record_alloc(
        {allocscope::Api::block_alloc, allocscope::Level::block, allocscope::MemoryKind::device,
         size, reinterpret_cast<uint64_t>(stream), device},
        ptr, 0);
}

ALLOCSCOPE_EXPORT void allocscope_block_free(void* ptr) {
    allocscope::recorder::HookGuard guard;
    if (!guard.recording() || ptr == nullptr) return;
    allocscope::recorder::PendingFree pending;
    allocscope::recorder::begin_free(pending, allocscope::Api::block_free, allocscope::Level::block,
                                     ptr, 0);
    allocscope::recorder::end_free(pending, 0);
}
