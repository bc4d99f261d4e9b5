#include "unwind.h"

#include <pthread.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <atomic>
#include <bit>

#include "unwind_cfi.h"

namespace allocscope {

namespace {

struct UnwindState {
    uint64_t* frames;
    size_t max_depth;
    size_t skip;
    size_t depth;
    LeadingFrames leading;
};

inline bool drop_leading(LeadingFrames& leading, size_t depth, uintptr_t pc) {
    if (depth != 0 || leading.max == 0 || pc < leading.lo || pc >= leading.hi) return false;
    --leading.max;
    return true;
}

_Unwind_Reason_Code collect_frame(struct _Unwind_Context* context, void* arg) {
    auto* state = static_cast<UnwindState*>(arg);
    uintptr_t ip = _Unwind_GetIP(context);
    if (ip == 0) return _URC_END_OF_STACK;
    if (state->skip > 0) {
        --state->skip;
        return _URC_NO_REASON;
    }
    if (drop_leading(state->leading, state->depth, ip)) return _URC_NO_REASON;
    state->frames[state->depth++] = ip;
    return state->depth < state->max_depth ? _URC_NO_REASON : _URC_END_OF_STACK;
}

// Rule cache: open addressing keyed by return address, preallocated, never
// evicted. A slot's key goes 0 -> (pc | kSlotBeingFilled) by CAS, then its
// rule is stored, then the key becomes pc with release order. A reader that
// acquires key == pc therefore sees that slot's only rule: never a torn or
// foreign one. Writers that lose a race, or find every probed slot taken,
// just use the rule they computed.
// Fork: inherited by the child and still valid there (same mappings); a
// slot left half-filled by a thread that did not survive the fork stays
// unusable, which only costs a miss.
// dlclose: rules of an unloaded object stay cached; code mapped at the same
// addresses later may get wrong frames, never a crash (see the bounds checks).
constexpr unsigned kCacheBits = 16;
constexpr size_t kCacheSlots = size_t{1} << kCacheBits;
constexpr size_t kProbeLimit = 8;
constexpr uint64_t kSlotBeingFilled = uint64_t{1} << 63;

struct CacheSlot {
    std::atomic<uint64_t> key;
    std::atomic<uint64_t> rule;
};

CacheSlot g_rule_cache[kCacheSlots];
std::atomic<uint64_t> g_fallback_captures{0};

size_t cache_home(uintptr_t pc) {
    return static_cast<size_t>((pc * 0x9e3779b97f4a7c15ull) >> (64 - kCacheBits));
}

__attribute__((noinline)) FrameRule fill_rule_cache(uintptr_t pc) {
    FrameRule rule = compute_frame_rule(pc);
    size_t home = cache_home(pc);
    for (size_t i = 0; i < kProbeLimit; ++i) {
        CacheSlot& slot = g_rule_cache[(home + i) % kCacheSlots];
        uint64_t key = 0;
        if (slot.key.compare_exchange_strong(key, pc | kSlotBeingFilled,
                                             std::memory_order_relaxed)) {
            slot.rule.store(std::bit_cast<uint64_t>(rule), std::memory_order_relaxed);
            slot.key.store(pc, std::memory_order_release);
            break;
        }
        if ((key & ~kSlotBeingFilled) == pc) break;
    }
    return rule;
}

inline FrameRule cached_frame_rule(uintptr_t pc) {
    size_t home = cache_home(pc);
    for (size_t i = 0; i < kProbeLimit; ++i) {
        const CacheSlot& slot = g_rule_cache[(home + i) % kCacheSlots];
        uint64_t key = slot.key.load(std::memory_order_acquire);
        if (key == pc) {
            return std::bit_cast<FrameRule>(slot.rule.load(std::memory_order_relaxed));
        }
        if (key == 0) break;
    }
    return fill_rule_cache(pc);
}

// The walk reads only [its own rsp, high) of the thread's stack: everything
// there is mapped, so a wrong rule yields wrong frames, never a fault.
// Dynamic TLS because the library may be dlopen'ed.
struct StackBounds {
    uintptr_t low = 0;
    uintptr_t high = 0;  // 0: not queried yet on this thread
};

// The rules of the thread's last walk, by position: consecutive captures on
// a thread share most of their frames (the same callers, a few calls
// apart), and a rule is a function of its return address alone, so a frame
// whose return address is the one at its position last time takes its rule
// from here (1 KiB, in cache) rather than from the process-wide cache (a
// miss per frame in a program that evicts it between captures).
constexpr size_t kMemoFrames = 64;
struct KnownRule {
    uintptr_t pc;
    FrameRule rule;
};
struct RuleMemo {
    KnownRule at[kMemoFrames];
};

// Behind the memo, the thread's recent rules by return address (direct
// mapped, 8 KiB): a frame that moved to another position since the last
// walk, or that an earlier walk on this thread met, takes its rule from
// here instead of the process-wide cache, whose 1 MiB a program evicts
// between captures (ALLOCSCOPE_WALK_CYCLES measures the difference).
constexpr size_t kRecentRules = 512;
struct RecentRules {
    KnownRule slot[kRecentRules];
};

struct ThreadWalk {
    StackBounds bounds;
    RuleMemo memo;
    RecentRules recent;
};

constinit thread_local ThreadWalk t_walk{};

__attribute__((noinline)) StackBounds query_stack_bounds(ThreadWalk& walk) {
    // Unusable unless pthread tells us (low > high fails every check).
    StackBounds bounds{UINTPTR_MAX, 1};
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
        void* address = nullptr;
        size_t size = 0;
        if (pthread_attr_getstack(&attr, &address, &size) == 0 && size != 0) {
            bounds.low = reinterpret_cast<uintptr_t>(address);
            bounds.high = bounds.low + size;
        }
        pthread_attr_destroy(&attr);
    }
    walk.bounds = bounds;
    return bounds;
}

inline StackBounds current_stack_bounds(ThreadWalk& walk) {
    StackBounds bounds = walk.bounds;
    return bounds.high != 0 ? bounds : query_stack_bounds(walk);
}

std::atomic<bool> g_walk_stats_on{false};
std::atomic<bool> g_walk_cycles_on{false};
std::atomic<uint64_t> g_walks{0}, g_walk_frames{0}, g_memo_hits{0}, g_recent_hits{0},
    g_memo_hit_cycles{0}, g_recent_hit_cycles{0}, g_miss_cycles{0};

// After the loads before it have completed (lfence), so that each frame's
// cycles are its own.
inline uint64_t cycles() noexcept {
#if defined(__x86_64__)
    _mm_lfence();
    return __rdtsc();
#else
    return 0;
#endif
}

// Where a frame's rule came from.
enum RuleSource : unsigned { kFromMemo, kFromRecent, kFromProcessCache };

struct WalkCounts {
    size_t hits[2] = {};      // by RuleSource: memo, recent
    uint64_t cycles[3] = {};  // by RuleSource
};

inline FrameRule recent_frame_rule(ThreadWalk& walk, uintptr_t pc, RuleSource& source) {
    KnownRule& known = walk.recent.slot[(pc ^ (pc >> 9)) % kRecentRules];
    if (known.pc == pc) {
        source = kFromRecent;
        return known.rule;
    }
    source = kFromProcessCache;
    known = {pc, cached_frame_rule(pc)};
    return known.rule;
}

inline FrameRule memo_frame_rule(ThreadWalk& walk, size_t position, uintptr_t pc,
                                 RuleSource& source) {
    if (position >= kMemoFrames) [[unlikely]]
        return recent_frame_rule(walk, pc, source);
    KnownRule& known = walk.memo.at[position];
    if (known.pc == pc) [[likely]] {
        source = kFromMemo;
        return known.rule;
    }
    known = {pc, recent_frame_rule(walk, pc, source)};
    return known.rule;
}

// ASan never poisons return-address or saved-register slots; this only keeps
// a wrong rule that lands in a redzone from being reported as a user bug.
__attribute__((no_sanitize("address"))) inline uintptr_t load_stack_word(uintptr_t address) {
    uintptr_t value;
    __builtin_memcpy(&value, reinterpret_cast<const void*>(address), sizeof(value));
    return value;
}

constexpr size_t kNeedsFallback = SIZE_MAX;

// `frame` is capture_stack's frame record: frame[0] = the caller's rbp,
// frame[1] = the return address into the caller, frame + 2 = the caller's rsp.
// The walk, with (kCounted) or without ALLOCSCOPE_LOG=debug's counting:
// two instantiations, so the common one carries none of it.
template <bool kCounted>
size_t walk_cached(ThreadWalk& walk, uint64_t* frames, size_t max_depth, size_t skip,
                   LeadingFrames leading, const uintptr_t* frame) {
    const StackBounds stack = current_stack_bounds(walk);
    uintptr_t sp = reinterpret_cast<uintptr_t>(frame + 2);
    // Signal alternate stacks and user-level fibers are not the thread stack.
    if (reinterpret_cast<uintptr_t>(frame) < stack.low || sp > stack.high) return kNeedsFallback;
    uintptr_t pc = frame[1];
    uintptr_t bp = frame[0];
    size_t depth = 0;
    size_t position = 0;
    WalkCounts counts;
    const bool timed = kCounted && g_walk_cycles_on.load(std::memory_order_relaxed);
    struct Count {  // on every way out of the walk
        WalkCounts& counts;
        const size_t& position;
        ~Count() {
            if (!kCounted) return;
            g_walks.fetch_add(1, std::memory_order_relaxed);
            g_walk_frames.fetch_add(position + 1, std::memory_order_relaxed);
            g_memo_hits.fetch_add(counts.hits[kFromMemo], std::memory_order_relaxed);
            g_recent_hits.fetch_add(counts.hits[kFromRecent], std::memory_order_relaxed);
            g_memo_hit_cycles.fetch_add(counts.cycles[kFromMemo], std::memory_order_relaxed);
            g_recent_hit_cycles.fetch_add(counts.cycles[kFromRecent], std::memory_order_relaxed);
            g_miss_cycles.fetch_add(counts.cycles[kFromProcessCache], std::memory_order_relaxed);
        }
    } count{counts, position};
    for (;; ++position) {
        const uint64_t started = timed ? cycles() : 0;
        RuleSource source;
        const FrameRule rule = memo_frame_rule(walk, position, pc, source);
        if (kCounted && source != kFromProcessCache) ++counts.hits[source];
        if (rule.kind == FrameRuleKind::kOutermost) return depth;
        if (rule.kind != FrameRuleKind::kStep) return kNeedsFallback;
        uintptr_t base = (rule.flags & FrameRule::kCfaFromRbp) != 0 ? bp : sp;
        uintptr_t cfa = base + static_cast<uintptr_t>(static_cast<intptr_t>(rule.cfa_offset));
        // The CFA only grows (no cycles) and the return address lies in [sp, high).
        if (cfa < sp + 8 || cfa > stack.high) return kNeedsFallback;
        if ((rule.flags & FrameRule::kRbpSaved) != 0) {
            uintptr_t slot = cfa + static_cast<uintptr_t>(static_cast<intptr_t>(rule.rbp_offset));
            if (slot < sp || slot > stack.high - sizeof(uintptr_t)) return kNeedsFallback;
            bp = load_stack_word(slot);
        }
        pc = load_stack_word(cfa - 8);
        sp = cfa;
        if (timed) counts.cycles[source] += cycles() - started;
        if (pc == 0) return depth;
        if (skip > 0) {
            --skip;
            continue;
        }
        if (drop_leading(leading, depth, pc)) continue;
        frames[depth++] = pc;
        if (depth == max_depth) return depth;
    }
}

// Inlined into its callers so that its own frame never shows: the first
// frame _Unwind_Backtrace reports is then the caller itself, and `skip`
// counts from there.
__attribute__((always_inline)) inline size_t unwind_backtrace(uint64_t* frames, size_t max_depth,
                                                              size_t skip,
                                                              LeadingFrames leading = {}) noexcept {
    UnwindState state{frames, max_depth, skip, 0, leading};
    _Unwind_Backtrace(collect_frame, &state);
    return state.depth;
}

}  // namespace

void clear_frame_rule_cache() noexcept {
    for (CacheSlot& slot : g_rule_cache) {
        slot.key.store(0, std::memory_order_relaxed);
        slot.rule.store(0, std::memory_order_relaxed);
    }
    t_walk.memo = {};  // the calling thread's (tests and benchmarks walk on it)
    t_walk.recent = {};
}

void enable_walk_stats(bool cycles) noexcept {
    g_walk_cycles_on.store(cycles, std::memory_order_relaxed);
    g_walk_stats_on.store(true, std::memory_order_relaxed);
}

WalkStats walk_stats() noexcept {
    return {g_walks.load(std::memory_order_relaxed),
            g_walk_frames.load(std::memory_order_relaxed),
            g_memo_hits.load(std::memory_order_relaxed),
            g_recent_hits.load(std::memory_order_relaxed),
            g_memo_hit_cycles.load(std::memory_order_relaxed),
            g_recent_hit_cycles.load(std::memory_order_relaxed),
            g_miss_cycles.load(std::memory_order_relaxed)};
}

uint64_t fallback_capture_count() noexcept {
    return g_fallback_captures.load(std::memory_order_relaxed);
}

__attribute__((noinline)) size_t capture_stack(uint64_t* frames, size_t max_depth, size_t skip,
                                               LeadingFrames leading) noexcept {
    if (max_depth == 0) return 0;
    // __builtin_frame_address(0) forces a standard frame record here
    // (push rbp; mov rsp, rbp), which hands over the caller's rsp and rbp.
    // The return-address check guards against a compiler that lays it out
    // differently.
    const auto* frame = static_cast<const uintptr_t*>(__builtin_frame_address(0));
    if (frame[1] == reinterpret_cast<uintptr_t>(__builtin_return_address(0))) {
        ThreadWalk& walk = t_walk;
        size_t depth = g_walk_stats_on.load(std::memory_order_relaxed)
                           ? walk_cached<true>(walk, frames, max_depth, skip, leading, frame)
                           : walk_cached<false>(walk, frames, max_depth, skip, leading, frame);
        if (depth != kNeedsFallback) return depth;
    }
    g_fallback_captures.fetch_add(1, std::memory_order_relaxed);
    return unwind_backtrace(frames, max_depth, skip + 2, leading);
}

__attribute__((noinline)) size_t capture_stack_unwinder(uint64_t* frames, size_t max_depth,
                                                        size_t skip) noexcept {
    if (max_depth == 0) return 0;
    return unwind_backtrace(frames, max_depth, skip + 2);
}

}  // namespace allocscope
