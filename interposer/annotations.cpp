// What a program tells the recorder besides its tags: the training step,
// parameters (allocscope_register_param) and what is derived from them
// (allocscope_derived), marks, and the Python frames its stacks end in.
#include "allocscope/allocscope.h"
#include "recorder_internal.h"

#include <mutex>
#include <string>
#include <unordered_map>

namespace allocscope::recorder {

uint64_t current_step() noexcept {
    return g ? g->step.load(std::memory_order_relaxed) : 0;  // State is never destroyed
}

void set_step(uint64_t step) noexcept {
    ApiScope scope;
    if (!scope.active()) return;
    g->step.store(step, std::memory_order_relaxed);
    EventRing::Slot* slot = begin_event(EventKind::step);
    if (!slot) return;
    slot->event.step = step;
    slot->event.api = Api::c_api;
    EventRing::publish(slot);
}

namespace {

// A new param record (under defs_mutex); the latest index of (layer, name)
// is what allocscope_derived names.
uint32_t add_param_locked(uint32_t layer, uint32_t name, uint32_t dtype, uint64_t numel,
                          uint64_t sharded_numel) {
    ParamRecord p;
    p.index = g->params++;
    p.layer = layer;
    p.name = name;
    p.dtype = dtype;
    p.numel = numel;
    p.sharded_numel = sharded_numel;
    g->pending_defs.push_back({RecordType::param, p.index, {}, {}, p});
    g->param_index[{layer, name}] = p.index;
    return p.index;
}

}  // namespace

void register_param(const char* layer, const char* name, uint64_t numel, const char* dtype,
                    uint64_t sharded_numel) noexcept {
    ApiScope scope;
    if (!scope.active()) return;
    uint32_t index = 0;
    try {
        std::lock_guard lock(g->defs_mutex);
        index = add_param_locked(intern_locked(layer), intern_locked(name), intern_locked(dtype),
                                 numel, sharded_numel);
    } catch (...) {
        return;
    }
    TagEntry tag = current_tag();
    emit_simple(EventKind::param, tag.layer, tag.phase, index, 0);
}

namespace {

// The index of parameter (layer, name), registered without sizes where it
// was not (under defs_mutex); `registered`: it was registered here.
uint32_t param_locked(const char* layer, const char* name, bool& registered) {
    const uint32_t layer_id = intern_locked(layer);
    const uint32_t name_id = intern_locked(name);
    auto it = g->param_index.find({layer_id, name_id});
    registered = it == g->param_index.end();
    return registered ? add_param_locked(layer_id, name_id, 0, 0, 0) : it->second;
}

}  // namespace

void oom_parameter(const char* layer, const char* name, uint64_t count) noexcept {
    ApiScope scope;
    if (!scope.active() || !layer || !name || !*name) return;
    uint32_t index = 0, mark_id = 0;
    bool registered = false;
    try {
        std::lock_guard lock(g->defs_mutex);
        index = param_locked(layer, name, registered);
        mark_id = intern_locked(ALLOCSCOPE_OOM_PARAM_MARK);
    } catch (...) {
        return;
    }
    const TagEntry tag = current_tag();
    if (registered) emit_simple(EventKind::param, tag.layer, tag.phase, index, 0);
    EventRing::Slot* slot = begin_event(EventKind::mark);
    if (!slot) return;
    Event& e = slot->event;
    e.layer = tag.layer;
    e.phase = tag.phase;
    e.aux = mark_id;
    e.address = index;
    e.size = count == 0 ? 1 : count;
    e.api = Api::c_api;
    EventRing::publish(slot);
}

void derived(const void* ptr, const char* layer, const char* name, const char* how) noexcept {
    ApiScope scope;
    if (!scope.active() || !ptr || !layer || !*layer) return;
    uint32_t index = 0;
    uint32_t how_id = 0;
    bool registered = false;
    try {
        std::lock_guard lock(g->defs_mutex);
        // Never registered: registered here without sizes, so the
        // declaration still names its parameter.
        index = param_locked(layer, name, registered);
        how_id = intern_locked(how);
    } catch (...) {
        return;
    }
    TagEntry tag = current_tag();
    if (registered) emit_simple(EventKind::param, tag.layer, tag.phase, index, 0);
    EventRing::Slot* slot = begin_event(EventKind::derived);
    if (!slot) return;
    Event& e = slot->event;
    e.layer = tag.layer;
    e.phase = tag.phase;
    e.aux = index;
    e.stream = how_id;
    e.address = reinterpret_cast<uint64_t>(ptr);
    e.api = Api::c_api;
    EventRing::publish(slot);
}

void mark(const char* text) noexcept {
    ApiScope scope;
    if (!scope.active()) return;
    uint32_t id = 0;
    try {
        id = intern(text);
    } catch (...) {
        return;
    }
    TagEntry tag = current_tag();
    emit_simple(EventKind::mark, tag.layer, tag.phase, id, 0);
}

void allocator_counters(int device, uint64_t allocated, uint64_t reserved,
                        uint64_t device_used) noexcept {
    ApiScope scope;
    if (!scope.active()) return;
    uint32_t id = 0;
    try {
        id = intern(ALLOCSCOPE_COUNTERS_MARK);
    } catch (...) {
        return;
    }
    const TagEntry tag = current_tag();
    EventRing::Slot* slot = begin_event(EventKind::mark);
    if (!slot) return;
    Event& e = slot->event;
    e.layer = tag.layer;
    e.phase = tag.phase;
    e.aux = id;
    e.address = allocated;
    e.size = reserved;
    e.stream = device_used;
    e.device = device;
    e.api = Api::c_api;
    EventRing::publish(slot);
}

namespace {

// Frames of generated code named as the source lines they were generated
// from (python_frame_alias): "file\nline" -> the frame's text. Read only
// when one was ever registered, on a frame's first naming (callers keep
// the address), so never on an allocation's path otherwise.
struct FrameAliases {
    std::mutex mutex;
    std::unordered_map<std::string, std::string> text;
};
constinit std::atomic<bool> g_any_frame_alias{false};

FrameAliases& frame_aliases() {
    static FrameAliases* aliases = new FrameAliases();  // never destroyed: hooks run at exit
    return *aliases;
}

std::string frame_key(std::string_view file, int line) {
    std::string key(file);
    key += '\n';
    key += std::to_string(line);
    return key;
}

// The text python_frame() interns for (function, file, line).
std::string frame_text(const char* function, const char* file, int line) {
    if (g_any_frame_alias.load(std::memory_order_acquire)) {
        FrameAliases& aliases = frame_aliases();
        std::lock_guard lock(aliases.mutex);
        if (auto it = aliases.text.find(frame_key(file, line)); it != aliases.text.end())
            return it->second;
    }
    return python_frame_text(function ? function : "", file, line);
}

}  // namespace

// Also inside a hook: the outer-frames provider names frames from there.
// Interning makes no CUDA call, so nothing here needs the hooks' guard.
uint64_t python_frame(const char* function, const char* file, int line) noexcept {
    if (!file || !ensure_started()) return 0;
    try {
        const uint32_t id = intern(frame_text(function, file, line).c_str());
        return id ? python_frame_address(id) : 0;
    } catch (...) {
        return 0;
    }
}

void python_frame_alias(const char* file, int line, const char* function, const char* as_file,
                        int as_line) noexcept {
    if (!file || !*file || !as_file || !*as_file) return;
    try {
        std::string text = python_frame_text(function ? function : "", as_file, as_line);
        FrameAliases& aliases = frame_aliases();
        std::lock_guard lock(aliases.mutex);
        aliases.text.insert_or_assign(frame_key(file, line), std::move(text));
        g_any_frame_alias.store(true, std::memory_order_release);
    } catch (...) {  // out of host memory: the frame keeps its own name
    }
}

}  // namespace allocscope::recorder
