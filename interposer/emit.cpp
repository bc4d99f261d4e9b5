// Event emission, the hot path of every hook: the hooks' guard, the events
// they record (record_alloc, the two halves of a free), the fields every
// event shares, and the stack capture of an allocation with the interning of
// its frames and strings.
//
// Stack capture lives here, not in a file of its own: record_alloc inlines
// capture_stack_id (and StackCapture::walk, always_inline), which only
// works within one translation unit; the helpers stay file-local for it.
#include <algorithm>
#include <span>
#include <vector>

#include "recorder_internal.h"
#include "unwind.h"

namespace allocscope::recorder {

constinit thread_local ThreadState t_thread{};
constinit std::atomic<OuterFrames> g_outer_frames{nullptr};
constinit std::atomic<ScopeDerived> g_scope_derived{nullptr};
constinit std::atomic<AddressFreed> g_address_freed{nullptr};

// --- definitions ------------------------------------------------------------------

uint32_t intern_locked(const char* text) {
    if (!text || !*text) return 0;
    auto [id, is_new] = g->strings.intern(text);
    if (is_new) g->pending_defs.push_back({RecordType::string, id, text, {}, {}});
    return id;
}

uint32_t intern(const char* text) {
    if (!text || !*text) return 0;
    std::lock_guard lock(g->defs_mutex);
    return intern_locked(text);
}

namespace {

// --- stack capture ----------------------------------------------------------------

// Frames of liballocscope.so itself (hooks, recorder) lead every captured
// stack; how many depends on inlining, so the walk drops them by address
// (at most this many) without counting them towards the depth.
constexpr size_t kOwnFramesMax = 8;

uint32_t intern_stack(const uint64_t* frames, size_t n) noexcept {
    if (n == 0) return 0;
    const std::span<const uint64_t> stack{frames, n};
    const uint64_t h = StackTable::hash(stack);
    StackIdSlot& cached = t_thread.stack_ids[h % kStackIdSlots];
    if (cached.hash == h && cached.depth == n) return cached.id;
    try {
        const uint32_t id =
            g->stacks.intern(h, stack, [](uint32_t id, std::span<const uint64_t> f) {
                std::lock_guard lock(g->defs_mutex);
                g->pending_defs.push_back(
                    {RecordType::stack, id, {}, std::vector<uint64_t>(f.begin(), f.end()), {}});
            });
        if (id != 0) cached = {h, id, static_cast<uint32_t>(n)};
        return id;
    } catch (...) {
        return 0;
    }
}

// The key under which the recorder keeps a stack id with the unwinder's
// record of a walk (WalkCookie): the outer frames' hash, since the native
// frames are that walk's. Never 0.
uint64_t outer_key(std::span<const uint64_t> outer) noexcept {
    return StackTable::hash(outer.first(std::min(outer.size(), kMaxOuterFrames)));
}

// The native frames, then up to kMaxOuterFrames of `outer` (Python's: the
// callers of the interpreter the native stack ends in), as a stack id. A
// capture that replays a walk whose frames were interned before with the
// same outer frames takes that id from the walk's cookie: no frames copied,
// hashed or looked up.
struct StackCapture {
    uint64_t frames[Config::kMaxStackDepth + kMaxOuterFrames];
    WalkCookie* cookie = nullptr;
    uint64_t key = 0;
    size_t n = 0;

    // Returns the id when the cookie had it (0: frames captured, n set).
    __attribute__((always_inline)) uint32_t walk(std::span<const uint64_t> outer,
                                                 uint32_t depth) noexcept {
        key = outer_key(outer);
        const size_t native =
            capture_stack(frames, std::min<size_t>(depth, Config::kMaxStackDepth), 0,
                          {g->self_start, g->self_end, kOwnFramesMax}, &cookie, key);
        if (native == kFramesInCookie) return static_cast<uint32_t>(cookie->value);
        const size_t extra = std::min(outer.size(), kMaxOuterFrames);
        std::copy_n(outer.begin(), extra, frames + native);
        n = native + extra;
        return 0;
    }
    uint32_t intern() noexcept {
        const uint32_t id = intern_stack(frames, n);
        if (cookie && id != 0) *cookie = {key, id};
        return id;
    }
};

__attribute__((always_inline)) inline uint32_t capture_stack_id_untimed(
    std::span<const uint64_t> outer, uint32_t depth) noexcept {
    StackCapture capture;
    if (const uint32_t id = capture.walk(outer, depth)) return id;
    return capture.intern();
}

__attribute__((noinline)) uint32_t capture_stack_id_timed(std::span<const uint64_t> outer,
                                                          uint32_t depth) noexcept {
    StackCapture capture;
    const uint64_t start = mono_ns();
    uint32_t id = capture.walk(outer, depth);
    const uint64_t walked = mono_ns();
    if (id == 0) id = capture.intern();
    const uint64_t end = mono_ns();
    g->stack_ns.fetch_add(end - start, std::memory_order_relaxed);
    g->walk_ns.fetch_add(walked - start, std::memory_order_relaxed);
    g->stacks_captured.fetch_add(1, std::memory_order_relaxed);
    g->python_frames.fetch_add(outer.size(), std::memory_order_relaxed);
    return id;
}

// The stack id of the calling hook's caller (0: stacks off or not recorded).
uint32_t capture_stack_id(std::span<const uint64_t> outer = {}) noexcept {
    const uint32_t depth = g->config.stack_depth;
    if (depth == 0) return 0;
    if (g->cost_stats) [[unlikely]]
        return capture_stack_id_timed(outer, depth);
    return capture_stack_id_untimed(outer, depth);
}

// --- event helpers ----------------------------------------------------------------

// How long a hook waits for room in a full ring before dropping its event.
constexpr uint64_t kRingPatienceNs = 2'000'000'000ull;

// The fields every event shares; `seq` is the ring's.
void fill_common(Event& e, EventKind kind) noexcept {
    e.kind = kind;
    e.level = Level::none;
    e.memory = MemoryKind::none;
    e.api = Api::none;
    e.address = 0;
    e.size = 0;
    e.stream = 0;
    e.stack = 0;
    e.aux = 0;
    e.flags = 0;
    e.device = -1;
    e.result = 0;
    e.t_ns = mono_ns() - g->start_mono_ns;
    e.tid = thread_id();
    e.step = g->step.load(std::memory_order_relaxed);
    TagEntry tag = current_tag();
    e.layer = tag.layer;
    e.phase = tag.phase;
}

// cudaErrorMemoryAllocation, for a failure reported without a code.
constexpr int kOutOfMemory = 2;

// The thread's Python frames from the registered provider (set_outer_frames),
// written to `buffer`; empty when none is registered.
std::span<const uint64_t> provider_frames(uint64_t (&buffer)[kMaxOuterFrames]) noexcept {
    OuterFrames provider = g_outer_frames.load(std::memory_order_acquire);
    if (!provider) return {};
    const size_t n = provider(buffer, kMaxOuterFrames);
    return {buffer, std::min(n, kMaxOuterFrames)};
}

// The request's fields of an alloc or oom event.
void fill_request(Event& e, const AllocInfo& info, uint32_t stack, int result) noexcept {
    e.size = info.size;
    e.stream = info.stream;
    e.stack = stack;
    e.device = info.device;
    e.result = result;
    e.level = info.level;
    e.memory = info.memory;
    e.api = info.api;
    e.flags |= info.flags;
    e.aux = info.aux;
}

}  // namespace

// Reserves a slot (every field is written: slots are reused).
EventRing::Slot* begin_event(EventKind kind) noexcept {
    EventRing::Slot* slot = g->ring.reserve(kRingPatienceNs);
    if (!slot) {
        g->events_dropped.fetch_add(1, std::memory_order_relaxed);
        return nullptr;
    }
    fill_common(slot->event, kind);
    return slot;
}

// --- hooks' interface ---------------------------------------------------------------

HookGuard::HookGuard() noexcept : outer_(enter_guard()), recording_(guard_recording(outer_)) {}

HookGuard::~HookGuard() {
    leave_guard(outer_);
}

__attribute__((noinline)) void record_alloc(const AllocInfo& info, void* address, int result,
                                            std::span<const uint64_t> outer) noexcept {
    if (result != 0 || address == nullptr) [[unlikely]] {
        record_oom(info, result != 0 ? result : kOutOfMemory, 0);
        return;
    }
    if (!ensure_started()) return;
    // No frames given (a runtime or driver hook): ask the registered
    // provider (set_outer_frames) for the thread's Python frames.
    uint64_t provided[kMaxOuterFrames];
    if (outer.data() == nullptr && g->config.stack_depth != 0) outer = provider_frames(provided);
    const uint32_t stack = capture_stack_id(outer);
    // Generated code's lines (allocscope_python_frame_scope): the innermost
    // Python frame says which module made the allocation.
    const FrameScope* scope = nullptr;
    if (!outer.empty() && g_any_frame_scope.load(std::memory_order_relaxed)) [[unlikely]]
        scope = frame_scope(outer[0]);
    EventRing::Slot* slot = begin_event(EventKind::alloc);
    if (!slot) return;
    Event& e = slot->event;
    e.address = reinterpret_cast<uint64_t>(address);
    fill_request(e, info, stack, 0);
    if (scope) [[unlikely]]
        apply_frame_scope(*scope, e);
    EventRing::publish(slot);
    if (scope) [[unlikely]]
        frame_scope_derived(*scope, reinterpret_cast<uint64_t>(address));
}

void record_oom(const AllocInfo& info, int result, uint64_t device_free) noexcept {
    if (!ensure_started()) return;
    uint64_t provided[kMaxOuterFrames];
    std::span<const uint64_t> outer;
    if (g->config.stack_depth != 0) outer = provider_frames(provided);
    const uint32_t stack = capture_stack_id(outer);
    EventRing::Slot* slot = begin_event(EventKind::oom);
    if (!slot) return;
    Event& e = slot->event;
    e.address = device_free;
    fill_request(e, info, stack, result);
    EventRing::publish(slot);
}

// The free's size, device and memory kind, and whether its address was
// live, are the writer's to fill in (track_live): the hook only reserves
// the slot, so its seq precedes any allocation that reuses the address.
void begin_free(PendingFree& pending, Api api, Level level, void* address,
                uint64_t stream) noexcept {
    pending.slot = nullptr;
    // Before the real free: the address cannot have been taken again yet.
    if (AddressFreed freed = g_address_freed.load(std::memory_order_acquire)) [[unlikely]]
        freed(address);
    if (!ensure_started()) return;
    EventRing::Slot* slot = begin_event(EventKind::free);
    if (!slot) return;
    Event& e = slot->event;
    e.address = reinterpret_cast<uint64_t>(address);
    e.stream = stream;
    e.level = level;
    e.api = api;
    pending.slot = slot;
}

void begin_range_free(PendingFree& pending, Api api, Level level, void* address,
                      uint64_t size) noexcept {
    begin_free(pending, api, level, address, 0);
    if (!pending.slot) return;
    Event& e = static_cast<EventRing::Slot*>(pending.slot)->event;
    e.size = size;
    e.flags |= kFlagRange;
}

void end_free(PendingFree& pending, int result) noexcept {
    if (!pending.slot) return;
    auto* slot = static_cast<EventRing::Slot*>(pending.slot);
    slot->event.result = result;
    EventRing::publish(slot);
}

void set_outer_frames(OuterFrames provider) noexcept {
    g_outer_frames.store(provider, std::memory_order_release);
}

void set_scope_listener(ScopeDerived derived, AddressFreed freed) noexcept {
    g_scope_derived.store(derived, std::memory_order_release);
    g_address_freed.store(freed, std::memory_order_release);
}

}  // namespace allocscope::recorder
