// The public C API of include/allocscope/allocscope.h.
#include "allocscope/allocscope.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <string>

#include "recorder.h"

#define ALLOCSCOPE_EXPORT extern "C" __attribute__((visibility("default")))

ALLOCSCOPE_EXPORT void allocscope_push(const char* layer, const char* phase) {
    allocscope::recorder::push_tag(layer, phase);
}

ALLOCSCOPE_EXPORT void allocscope_pop(void) {
    allocscope::recorder::pop_tag();
}

ALLOCSCOPE_EXPORT int allocscope_enter(uint64_t key, uint32_t kind, uint64_t generation,
                                       const char* layer, const char* phase) {
    return allocscope::recorder::enter_tag(key, kind, generation, layer, phase);
}

ALLOCSCOPE_EXPORT int64_t allocscope_leave(uint64_t key, uint32_t kind, const char** layer) {
    return allocscope::recorder::leave_tag(key, kind, layer);
}

ALLOCSCOPE_EXPORT void allocscope_leave_kind(uint32_t kind, uint64_t older_than) {
    allocscope::recorder::leave_kind(kind, older_than);
}

ALLOCSCOPE_EXPORT int allocscope_enter_nested(uint64_t key, uint32_t kind, uint64_t generation,
                                              const char* layer, const char* phase) {
    return allocscope::recorder::enter_nested(key, kind, generation, layer, phase);
}

ALLOCSCOPE_EXPORT int allocscope_keyed_depth(void) {
    return static_cast<int>(allocscope::recorder::keyed_depth());
}

ALLOCSCOPE_EXPORT int allocscope_keyed_kind_depth(uint32_t kind) {
    return kind == 0 ? 0 : static_cast<int>(allocscope::recorder::keyed_depth(kind));
}

ALLOCSCOPE_EXPORT size_t allocscope_current_layer(char* out, size_t size) {
    std::string layer;
    try {
        layer = allocscope::recorder::current_layer();
    } catch (...) {
        layer.clear();
    }
    if (out && size > 0) {
        const size_t n = std::min(layer.size(), size - 1);
        std::memcpy(out, layer.data(), n);
        out[n] = '\0';
    }
    return layer.size();
}

ALLOCSCOPE_EXPORT int64_t allocscope_config_get(const char* name, char* out, size_t size) {
    std::optional<std::string> value;
    try {
        if (const allocscope::Config* c = allocscope::recorder::config(); c && name)
            value = allocscope::config_value(*c, name);
    } catch (...) {
        value.reset();
    }
    const std::string text = value.value_or("");
    if (out && size > 0) {
        const size_t n = std::min(text.size(), size - 1);
        std::memcpy(out, text.data(), n);
        out[n] = '\0';
    }
    return value ? static_cast<int64_t>(text.size()) : -1;
}

ALLOCSCOPE_EXPORT void allocscope_step(uint64_t step) {
    allocscope::recorder::set_step(step);
}

ALLOCSCOPE_EXPORT uint64_t allocscope_current_step(void) {
    return allocscope::recorder::current_step();
}

ALLOCSCOPE_EXPORT void allocscope_register_param(const char* layer, const char* name,
                                                 uint64_t numel, const char* dtype,
                                                 uint64_t sharded_numel) {
    allocscope::recorder::register_param(layer, name, numel, dtype, sharded_numel);
}

ALLOCSCOPE_EXPORT void allocscope_mark(const char* text) {
    allocscope::recorder::mark(text);
}

ALLOCSCOPE_EXPORT void allocscope_allocator_counters(int device, uint64_t allocated,
                                                     uint64_t reserved, uint64_t device_used) {
    allocscope::recorder::allocator_counters(device, allocated, reserved, device_used);
}

ALLOCSCOPE_EXPORT void allocscope_oom_parameter(const char* layer, const char* name,
                                                uint64_t count) {
    allocscope::recorder::oom_parameter(layer, name, count);
}

ALLOCSCOPE_EXPORT void allocscope_derived(const void* ptr, const char* layer, const char* name,
                                          const char* how) {
    allocscope::recorder::derived(ptr, layer, name, how);
}

ALLOCSCOPE_EXPORT void allocscope_block_alloc(void* ptr, size_t size, int device, void* stream) {
    allocscope::recorder::HookGuard guard;
    if (!guard.recording() || ptr == nullptr) return;
    allocscope::recorder::record_alloc(
        {allocscope::Api::block_alloc, allocscope::Level::block, allocscope::MemoryKind::device,
         size, reinterpret_cast<uint64_t>(stream), device},
        ptr, 0);
}

ALLOCSCOPE_EXPORT void allocscope_block_oom(size_t size, int device, void* stream,
                                            uint64_t device_free) {
    allocscope::recorder::HookGuard guard;
    if (!guard.recording()) return;
    allocscope::recorder::record_oom(
        {allocscope::Api::block_alloc, allocscope::Level::block, allocscope::MemoryKind::device,
         size, reinterpret_cast<uint64_t>(stream), device},
        2 /* cudaErrorMemoryAllocation */, device_free);
}

ALLOCSCOPE_EXPORT uint64_t allocscope_python_frame(const char* function, const char* file,
                                                   int line) {
    return allocscope::recorder::python_frame(function, file, line);
}

ALLOCSCOPE_EXPORT void allocscope_python_frame_alias(const char* file, int line,
                                                     const char* function, const char* as_file,
                                                     int as_line) {
    allocscope::recorder::python_frame_alias(file, line, function, as_file, as_line);
}

ALLOCSCOPE_EXPORT void allocscope_python_frame_scope(const char* file, int line, const char* module,
                                                     const char* param_module, const char* param,
                                                     const char* how) {
    allocscope::recorder::python_frame_scope(file, line, module, param_module, param, how);
}

ALLOCSCOPE_EXPORT void allocscope_set_outer_frames(size_t (*provider)(uint64_t*, size_t)) {
    allocscope::recorder::set_outer_frames(provider);
}

ALLOCSCOPE_EXPORT void allocscope_set_scope_listener(void (*derived)(const void*, const char*,
                                                                     const char*, const char*),
                                                     void (*freed)(const void*)) {
    allocscope::recorder::set_scope_listener(derived, freed);
}

ALLOCSCOPE_EXPORT void allocscope_block_alloc_frames(void* ptr, size_t size, int device,
                                                     void* stream, const uint64_t* outer_frames,
                                                     size_t outer_count) {
    allocscope::recorder::HookGuard guard;
    if (!guard.recording() || ptr == nullptr) return;
    allocscope::recorder::record_alloc(
        {allocscope::Api::block_alloc, allocscope::Level::block, allocscope::MemoryKind::device,
         size, reinterpret_cast<uint64_t>(stream), device},
        ptr, 0, {outer_frames, outer_frames ? outer_count : 0});  // null: the provider's
}

ALLOCSCOPE_EXPORT void allocscope_block_alloc_graph_pool(void* ptr, size_t size, int device,
                                                         void* stream, uint64_t pool) {
    allocscope::recorder::HookGuard guard;
    if (!guard.recording() || ptr == nullptr) return;
    allocscope::recorder::record_alloc(
        {allocscope::Api::block_alloc, allocscope::Level::block, allocscope::MemoryKind::device,
         size, reinterpret_cast<uint64_t>(stream), device, allocscope::kFlagGraphPool,
         static_cast<uint32_t>(pool)},
        ptr, 0);
}

namespace {

// The (0, second) pools declared as graphs' (allocscope_graph_pool): read
// under the allocator's lock on every pooled block, so lock-free; few
// pools are ever made, so a scan of a short array.
constexpr uint32_t kGraphPools = 256;
std::atomic<uint64_t> g_graph_pools[kGraphPools];
std::atomic<uint32_t> g_graph_pool_count{0};

bool is_graph_pool(uint64_t first, uint64_t second) noexcept {
    if (first != 0) return true;
    if (second == 0) return false;
    const uint32_t n = std::min(g_graph_pool_count.load(std::memory_order_acquire), kGraphPools);
    for (uint32_t i = 0; i < n; ++i)
        if (g_graph_pools[i].load(std::memory_order_acquire) == second) return true;
    return false;
}

}  // namespace

ALLOCSCOPE_EXPORT void allocscope_graph_pool(uint64_t first, uint64_t second) {
    if (first != 0 || second == 0 || is_graph_pool(0, second)) return;
    const uint32_t i = g_graph_pool_count.fetch_add(1, std::memory_order_acq_rel);
    if (i < kGraphPools) g_graph_pools[i].store(second, std::memory_order_release);
}

ALLOCSCOPE_EXPORT void allocscope_block_alloc_in_pool(void* ptr, size_t size, int device,
                                                      void* stream, uint64_t first,
                                                      uint64_t second) {
    if (is_graph_pool(first, second)) {
        allocscope_block_alloc_graph_pool(ptr, size, device, stream, first != 0 ? first : second);
    } else {
        allocscope_block_alloc(ptr, size, device, stream);
    }
}

ALLOCSCOPE_EXPORT void allocscope_block_free(void* ptr) {
    allocscope::recorder::HookGuard guard;
    if (!guard.recording() || ptr == nullptr) return;
    allocscope::recorder::PendingFree pending;
    allocscope::recorder::begin_free(pending, allocscope::Api::block_free, allocscope::Level::block,
                                     ptr, 0);
    allocscope::recorder::end_free(pending, 0);
}

namespace {

void copy_error(const std::string& text, char* error, size_t error_size) {
    if (!error || error_size == 0) return;
    const size_t n = std::min(text.size(), error_size - 1);
    std::memcpy(error, text.data(), n);
    error[n] = '\0';
}

}  // namespace

ALLOCSCOPE_EXPORT uint64_t allocscope_check_begin(const char* plugins, const char* options,
                                                  char* error, size_t error_size) {
    std::string problem;
    const uint64_t id = allocscope::recorder::check_begin(plugins, options, problem);
    copy_error(id ? std::string() : problem, error, error_size);
    return id;
}

ALLOCSCOPE_EXPORT int allocscope_check_end(uint64_t id, allocscope_check_visitor visit, void* user,
                                           char* error, size_t error_size) {
    allocscope::CheckSet::Outcome out;
    const bool ok = allocscope::recorder::check_end(id, out);
    if (visit) {
        for (const allocscope::Finding& f : out.findings) {
            allocscope_check_finding v{};
            v.plugin = f.plugin.c_str();
            v.severity = static_cast<uint32_t>(f.severity);
            v.rank = f.rank;
            v.layer = f.layer.c_str();
            v.phase = f.phase.c_str();
            v.bytes = f.bytes;
            v.count = f.count;
            v.summary = f.summary.c_str();
            const std::string stack = allocscope::recorder::finding_stack(f);
            v.stack = stack.c_str();
            visit(user, &v);
        }
    }
    copy_error(ok ? std::string() : out.error, error, error_size);
    return ok ? 0 : -1;
}
