// The calling thread's tag stack: plain tags (allocscope_push / _pop, NVTX
// ranges) and keyed ones (allocscope_enter, _leave, _leave_kind,
// _enter_nested), and what they tell about the thread's current layer and
// phase. Each push and pop is an event; the stack itself is the thread's
// (ThreadState::tags), touched without a lock.
#include <cstring>
#include <string>
#include <string_view>

#include <allocscope/sdk/tag_rules.h>

#include "recorder_internal.h"

namespace allocscope::recorder {

namespace {

// Pushes `tag` (its layer and phase already interned) onto the calling
// thread's stack. Beyond kMaxTagDepth the push is counted and flagged but
// the tag stays the enclosing one.
void push_entry(TagEntry tag) noexcept {
    uint32_t flags = 0;
    if (t_thread.depth < kMaxTagDepth) {
        t_thread.tags[t_thread.depth] = tag;
    } else {
        flags = kFlagTagOverflow;
        const TagEntry parent = current_tag();
        tag.layer = parent.layer;
        tag.phase = parent.phase;
    }
    ++t_thread.depth;
    emit_simple(EventKind::tag_push, tag.layer, tag.phase, 0, flags);
}

void pop_entry() noexcept {
    if (t_thread.depth == 0) return;
    const TagEntry tag = current_tag();
    const uint32_t flags = t_thread.depth > kMaxTagDepth ? uint32_t{kFlagTagOverflow} : 0u;
    --t_thread.depth;
    emit_simple(EventKind::tag_pop, tag.layer, tag.phase, 0, flags);
}

// Pops until `depth` tags are left.
void pop_to(uint32_t depth) noexcept {
    while (t_thread.depth > depth)
        pop_entry();
}

InternedText& interned_slot(const char* text) noexcept {
    const auto bits = reinterpret_cast<uintptr_t>(text);
    return t_thread.interned[((bits >> 3) ^ (bits >> 11)) % kInternCacheSlots];
}

// The id and interned copy of non-empty `text` from the thread's cache, or
// false.
bool cached_intern(const char* text, uint32_t& id, const std::string*& interned) noexcept {
    const InternedText& slot = interned_slot(text);
    if (slot.ptr != text || std::strcmp(text, slot.text->c_str()) != 0) return false;
    id = slot.id;
    interned = slot.text;
    return true;
}

// Interns `text` (NULL: keeps `id` and `interned` as they are; "": none)
// through the thread's cache, else under the definitions lock.
void intern_for_tag(const char* text, uint32_t& id, const std::string*& interned) {
    if (!text) return;
    if (!*text) {
        id = 0;
        interned = nullptr;
        return;
    }
    if (cached_intern(text, id, interned)) return;
    {
        std::lock_guard lock(g->defs_mutex);
        id = intern_locked(text);
        interned = &g->strings.at(id);
    }
    interned_slot(text) = {text, interned, id};
}

// The entry (layer, phase) makes over the calling thread's current tag: a
// NULL value keeps the enclosing one, "" is none. False when interning failed.
bool make_entry(TagEntry& tag, const char* layer, const char* phase) noexcept {
    tag = current_tag();
    tag.kind = 0;
    tag.key = 0;
    tag.generation = 0;
    try {
        intern_for_tag(layer, tag.layer, tag.layer_text);
        const std::string* phase_text = nullptr;
        intern_for_tag(phase, tag.phase, phase_text);
    } catch (...) {
        return false;
    }
    return true;
}

// The number of the calling thread's tags that are stored (beyond
// kMaxTagDepth they are only counted).
uint32_t stored_depth() noexcept {
    return t_thread.depth < kMaxTagDepth ? t_thread.depth : kMaxTagDepth;
}

// The keyed entries on the calling thread's stack: all of them (kind 0), or
// those of `kind`.
uint32_t keyed_entries(uint32_t kind = 0) noexcept {
    uint32_t n = 0;
    for (uint32_t i = 0, d = stored_depth(); i < d; ++i) {
        const uint32_t k = t_thread.tags[i].kind;
        n += k != 0 && (kind == 0 || k == kind);
    }
    return n;
}

std::string_view text_of(const TagEntry& e) noexcept {
    return e.layer_text ? std::string_view(*e.layer_text) : std::string_view();
}

// True when module `layer` is `scope` or inside it (sdk/tag_rules.h), and
// everything is inside "" (a tag without a module).
bool within(std::string_view layer, std::string_view scope) noexcept {
    return scope.empty() || layer_within(layer, scope);
}

}  // namespace

bool push_tag(const char* layer, const char* phase) noexcept {
    ApiScope scope;
    if (!scope.active()) return false;
    TagEntry tag;
    if (!make_entry(tag, layer, phase)) return false;
    push_entry(tag);
    return true;
}

void pop_tag() noexcept {
    ApiScope scope;
    if (!scope.active()) return;
    pop_entry();  // a pop without push is ignored (allocscope.h)
}

int enter_tag(uint64_t key, uint32_t kind, uint64_t generation, const char* layer,
              const char* phase) noexcept {
    ApiScope scope;
    if (!scope.active() || kind == 0) return -1;
    const uint32_t before = keyed_entries();
    TagEntry tag;
    if (!make_entry(tag, layer, phase)) return -1;
    tag.kind = kind;
    tag.key = key;
    tag.generation = generation;
    push_entry(tag);
    return static_cast<int>(before);
}

int64_t leave_tag(uint64_t key, uint32_t kind, const char** layer) noexcept {
    ApiScope scope;
    if (!scope.active() || kind == 0) return -1;
    for (uint32_t i = stored_depth(); i-- > 0;) {
        const TagEntry& e = t_thread.tags[i];
        if (e.kind != kind || e.key != key) continue;
        const auto generation = static_cast<int64_t>(e.generation & INT64_MAX);
        if (layer) *layer = e.layer_text ? e.layer_text->c_str() : "";
        pop_to(i);
        return generation;
    }
    return -1;
}

void leave_kind(uint32_t kind, uint64_t older_than) noexcept {
    ApiScope scope;
    if (!scope.active() || kind == 0) return;
    const uint32_t n = stored_depth();
    for (uint32_t i = 0; i < n; ++i) {
        const TagEntry& e = t_thread.tags[i];
        if (e.kind == kind && e.generation < older_than) {
            pop_to(i);
            return;
        }
    }
}

int enter_nested(uint64_t key, uint32_t kind, uint64_t generation, const char* layer,
                 const char* phase) noexcept {
    ApiScope scope;
    if (!scope.active() || kind == 0) return -1;
    // Entries of this kind from an earlier generation are over.
    uint32_t n = stored_depth();
    for (uint32_t i = 0; i < n; ++i) {
        const TagEntry& e = t_thread.tags[i];
        if (e.kind == kind && e.generation < generation) {
            pop_to(i);
            break;
        }
    }
    TagEntry tag;
    if (!make_entry(tag, layer, phase)) return -1;
    tag.kind = kind;
    tag.key = key;
    tag.generation = generation;
    const std::string_view name = text_of(tag);
    // The first entry of this kind that does not enclose `layer` is over,
    // and so is everything above it, but the entries among them that are
    // inside `layer` (entered first through a shared trigger) come back on
    // top of it.
    TagEntry inner[kMaxTagDepth];
    uint32_t inner_count = 0;
    n = stored_depth();
    for (uint32_t i = 0; i < n; ++i) {
        const TagEntry& e = t_thread.tags[i];
        if (e.kind != kind) continue;
        if (e.key == key) return 0;  // entered already
        if (within(name, text_of(e))) continue;
        for (uint32_t j = i; j < n; ++j) {
            const TagEntry& x = t_thread.tags[j];
            if (x.kind == kind && x.layer != tag.layer && within(text_of(x), name))
                inner[inner_count++] = x;
        }
        pop_to(i);
        break;
    }
    push_entry(tag);
    for (uint32_t i = 0; i < inner_count; ++i)
        push_entry(inner[i]);
    return 1;
}

uint32_t keyed_depth(uint32_t kind) noexcept {
    ApiScope scope;
    return scope.recording() ? keyed_entries(kind) : 0;
}

std::string current_layer() {
    ApiScope scope;
    if (!scope.active()) return {};
    return std::string(text_of(current_tag()));
}

std::string current_phase() {
    ApiScope scope;
    if (!scope.active()) return {};
    const uint32_t phase = current_tag().phase;
    if (phase == 0) return {};
    std::lock_guard lock(g->defs_mutex);
    return g->strings.at(phase);
}

}  // namespace allocscope::recorder
