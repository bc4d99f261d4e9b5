// What a program tells the recorder besides its tags: the training step,
// parameters (allocscope_register_param) and what is derived from them
// (allocscope_derived), marks, and the Python frames its stacks end in.
#include "allocscope/allocscope.h"
#include "recorder_internal.h"

#include <deque>
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

namespace {

// A DERIVED event (allocscope_derived) without the API's guard: also called
// from an allocation's hook (frame scopes).
void record_derived(const void* ptr, const char* layer, const char* name,
                    const char* how) noexcept {
    if (!ptr || !layer || !*layer) return;
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

}  // namespace

void derived(const void* ptr, const char* layer, const char* name, const char* how) noexcept {
    ApiScope scope;
    if (scope.active()) record_derived(ptr, layer, name, how);
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
    std::unordered_map<std::string, uint32_t> scope;  // -> index in scopes
    std::deque<FrameScope> scopes;                    // a deque: entries never move
};
constinit std::atomic<bool> g_any_frame_alias{false};

// Named frames that have a scope: (string id + 1) << 32 | index in
// FrameAliases::scopes, 0 = empty; open addressing, filled under the
// aliases' mutex, read without it by allocations' hooks.
constexpr size_t kScopeSlots = size_t{1} << 14;
constinit std::atomic<uint64_t> g_scope_slots[kScopeSlots]{};
constinit std::atomic<size_t> g_scope_slots_used{0};

size_t scope_slot(uint32_t id) noexcept {
    return (static_cast<size_t>(id) * 0x9E3779B1u) & (kScopeSlots - 1);
}

// Under the aliases' mutex: frame text `id` has scope `index`.
void add_scope_slot(uint32_t id, uint32_t index) noexcept {
    if (g_scope_slots_used.load(std::memory_order_relaxed) >= kScopeSlots / 2) return;  // full
    const uint64_t key = uint64_t{id} + 1;
    for (size_t i = scope_slot(id), n = 0; n < kScopeSlots; i = (i + 1) & (kScopeSlots - 1), ++n) {
        const uint64_t v = g_scope_slots[i].load(std::memory_order_relaxed);
        if (v == 0) {
            g_scope_slots_used.fetch_add(1, std::memory_order_relaxed);
            g_scope_slots[i].store(key << 32 | index, std::memory_order_release);
            return;
        }
        if (v >> 32 == key) {
            g_scope_slots[i].store(key << 32 | index, std::memory_order_release);
            return;
        }
    }
}

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

}  // namespace

// Also inside a hook: the outer-frames provider names frames from there.
// Interning makes no CUDA call, so nothing here needs the hooks' guard.
uint64_t python_frame(const char* function, const char* file, int line) noexcept {
    if (!file || !ensure_started()) return 0;
    try {
        if (!g_any_frame_alias.load(std::memory_order_acquire)) {
            const uint32_t id =
                intern(python_frame_text(function ? function : "", file, line).c_str());
            return id ? python_frame_address(id) : 0;
        }
        // A frame of generated code: its alias's text, and its scope.
        FrameAliases& aliases = frame_aliases();
        std::lock_guard lock(aliases.mutex);
        const std::string key = frame_key(file, line);
        const auto text = aliases.text.find(key);
        const uint32_t id =
            intern(text != aliases.text.end()
                       ? text->second.c_str()
                       : python_frame_text(function ? function : "", file, line).c_str());
        if (const auto scope = aliases.scope.find(key); id != 0 && scope != aliases.scope.end())
            add_scope_slot(id, scope->second);
        return id ? python_frame_address(id) : 0;
    } catch (...) {
        return 0;
    }
}

void python_frame_scope(const char* file, int line, const char* module, const char* param_module,
                        const char* param, const char* how) noexcept {
    if (!file || !*file) return;
    try {
        FrameAliases& aliases = frame_aliases();
        std::lock_guard lock(aliases.mutex);
        const std::string key = frame_key(file, line);
        FrameScope* scope = nullptr;
        if (auto it = aliases.scope.find(key); it != aliases.scope.end()) {
            scope = &aliases.scopes[it->second];  // registered again: the same graph
        } else {
            scope = &aliases.scopes.emplace_back();
            aliases.scope.emplace(key, static_cast<uint32_t>(aliases.scopes.size() - 1));
        }
        scope->module = module ? module : "";
        scope->param_module = param_module ? param_module : "";
        scope->param = param ? param : "";
        scope->how = how ? how : "";
        for (auto& entry : scope->layer_cache)
            entry.store(0, std::memory_order_relaxed);
        g_any_frame_alias.store(true, std::memory_order_release);
        g_any_frame_scope.store(true, std::memory_order_release);
    } catch (...) {  // out of host memory: the line's allocations keep their tags
    }
}

constinit std::atomic<bool> g_any_frame_scope{false};

const FrameScope* frame_scope(uint64_t frame) noexcept {
    if (!is_python_frame(frame)) return nullptr;
    const uint32_t id = python_frame_string(frame);
    const uint64_t key = uint64_t{id} + 1;
    for (size_t i = scope_slot(id), n = 0; n < kScopeSlots; i = (i + 1) & (kScopeSlots - 1), ++n) {
        const uint64_t v = g_scope_slots[i].load(std::memory_order_acquire);
        if (v == 0) return nullptr;
        if (v >> 32 == key) return &frame_aliases().scopes[static_cast<uint32_t>(v)];
    }
    return nullptr;
}

namespace {

// "<layer>.<module>", or `module` outside any layer.
std::string scoped_name(const std::string* layer, const std::string& module) {
    if (!layer || layer->empty()) return module;
    if (module.empty()) return *layer;
    return *layer + "." + module;
}

}  // namespace

void apply_frame_scope(const FrameScope& scope, Event& e) noexcept {
    if (scope.module.empty()) return;
    std::atomic<uint64_t>& slot = scope.layer_cache[e.layer % FrameScope::kLayerCache];
    const uint64_t cached = slot.load(std::memory_order_acquire);
    if (cached != 0 && cached >> 32 == uint64_t{e.layer} + 1) {
        e.layer = static_cast<uint32_t>(cached);
        return;
    }
    try {
        const TagEntry tag = current_tag();
        const uint32_t id = intern(scoped_name(tag.layer_text, scope.module).c_str());
        slot.store((uint64_t{e.layer} + 1) << 32 | id, std::memory_order_release);
        e.layer = id;
    } catch (...) {  // out of host memory: the tag stays the enclosing layer's
    }
}

void frame_scope_derived(const FrameScope& scope, uint64_t address) noexcept {
    if (scope.param.empty()) return;
    try {
        const TagEntry tag = current_tag();
        const std::string layer = scoped_name(tag.layer_text, scope.param_module);
        const char* how = scope.how.empty() ? nullptr : scope.how.c_str();
        record_derived(reinterpret_cast<const void*>(address), layer.c_str(), scope.param.c_str(),
                       how);
        if (ScopeDerived listener = g_scope_derived.load(std::memory_order_acquire)) [[unlikely]]
            listener(reinterpret_cast<const void*>(address), layer.c_str(), scope.param.c_str(),
                     how);
    } catch (...) {
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
