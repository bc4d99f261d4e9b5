#include "unwind.h"

#include <pthread.h>
#include <sys/mman.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <atomic>
#include <bit>
#include <cstring>

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

// Replay of an earlier walk. A walk is a function of the registers it
// starts from (pc, rsp, and rbp where a rule reads it before any frame
// restores it), of the request (depth, skip, leading frames) and of the
// stack words it reads: started from the same registers, with every word it
// read last time still holding the same value, it would read the same words
// again and give the same frames. So a capture whose registers match a
// recorded walk's only reads those words again (independent loads: they
// overlap, where the walk's loads each wait for the one before) and
// compares their digest with the recorded one. The recorded values are not
// kept: between two captures a training step evicts the entry from every
// cache, and the values were most of its lines (one 64-bit word per read,
// against a 16-bit offset). The digest (ReplayDigest) tells any single
// changed word for certain, and several with odds of 2^-64: the odds the
// stack ids already take (StackTable: one 64-bit hash per stack). One
// changed word and the capture walks.
// Per thread, set-associative by (pc, rsp), mapped on the thread's first
// capture and unmapped when it exits.
constexpr size_t kReplayReads = 64;   // words a recorded walk may have read (7 bits)
constexpr size_t kReplayFrames = 32;  // frames it may have returned (6 bits)
constexpr size_t kReplaySets = 128;
constexpr size_t kReplayWays = 2;  // replacement: the way not used last
// A read's offset from sp0 is kept in words, 16 bits: a walk reading
// further than this from where it started is not recorded.
constexpr uintptr_t kReplaySpan = uintptr_t{UINT16_MAX} * sizeof(uint64_t);

// The digest of a walk's reads, in order: four lanes (read i goes to lane
// i % 4), each step a bijection of the lane for a given word, so that a
// lane whose words differ in one place ends different; the lanes are then
// combined by bijections of each. Four lanes keep the dependent
// multiplications out of each other's way.
struct ReplayDigest {
    static constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
    uint64_t lane[4] = {0x243F6A8885A308D3ull, 0x13198A2E03707344ull, 0xA4093822299F31D0ull,
                        0x082EFA98EC4E6C89ull};
    static uint64_t step(uint64_t lane, uint64_t word) noexcept {
        const uint64_t x = (lane ^ word) * kMul;
        return (x << 29) | (x >> 35);
    }
    void add(size_t i, uint64_t word) noexcept { lane[i & 3] = step(lane[i & 3], word); }
    uint64_t value() const noexcept {
        // Each lane through its own bijection (an odd multiplier, then a
        // rotation), so one lane's difference is never undone by the others.
        return lane[0] ^ std::rotl(lane[1] * 0xD6E8FEB86659FD93ull, 17) ^
               std::rotl(lane[2] * 0xCA5A826395121157ull, 31) ^
               std::rotl(lane[3] * 0x94D049BB133111EBull, 47);
    }
};

// What a replay reads comes first: the header (one cache line, the
// caller's cookie in it), the digest and the offsets; the frames only when
// the caller has no cookie for them.
struct alignas(64) ReplayEntry {
    uintptr_t pc0;  // 0: empty
    uintptr_t sp0;
    uintptr_t bp0;  // compared only when uses_bp0
    uintptr_t leading_lo;
    uintptr_t leading_hi;
    WalkCookie cookie;  // the caller's, for these frames
    uint16_t leading_max;
    uint16_t max_depth;
    uint16_t skip;
    uint16_t uses_bp0 : 1;
    uint16_t reads : 7;             // up to kReplayReads
    uint16_t depth : 6;             // up to kReplayFrames
    uint64_t digest;                // of the words read (ReplayDigest)
    uint16_t offset[kReplayReads];  // of each word read, from sp0, in words
    uint64_t frames[kReplayFrames];

    bool matches(uintptr_t pc, uintptr_t sp, uintptr_t bp, size_t depth_wanted, size_t skip_wanted,
                 const LeadingFrames& leading) const noexcept {
        return pc0 == pc && sp0 == sp && (!uses_bp0 || bp0 == bp) && max_depth == depth_wanted &&
               skip == skip_wanted && leading_lo == leading.lo && leading_hi == leading.hi &&
               leading_max == leading.max;
    }
};

static_assert(kReplayWays == 2);
static_assert(offsetof(ReplayEntry, digest) == 64, "the header fills one cache line");
struct ReplaySet {
    ReplayEntry way[kReplayWays];
    uint32_t last_used;  // the way hit or filled last
};

struct ReplayCache {
    ReplaySet set[kReplaySets];
};

// The stack words a walk's frames depend on, for its replay entry (entry
// null: not recorded): every return address, and each restored rbp that a
// later rule takes its CFA from. A restored rbp no rule uses (code without
// frame pointers keeps anything in rbp, a loop counter for one) is not
// kept: it would only make captures that differ in it miss.
struct WalkRecording {
    ReplayEntry* entry = nullptr;
    uintptr_t sp0 = 0;
    size_t reads = 0;
    ReplayDigest digest{};
    bool bp_restored = false;  // a frame has restored rbp from the stack
    bool uses_bp0 = false;     // a rule took the CFA from the starting rbp
    bool too_long = false;
    bool bp_pending = false;  // the last restore, not yet used
    uintptr_t bp_address = 0;
    uint64_t bp_value = 0;

    void restore_bp(uintptr_t address, uint64_t value) noexcept {
        bp_restored = bp_pending = true;
        bp_address = address;
        bp_value = value;
    }
    void use_bp() noexcept {
        if (bp_pending) {
            bp_pending = false;
            read(bp_address, bp_value);
        } else if (!bp_restored) {
            uses_bp0 = true;
        }
    }
    void read(uintptr_t address, uint64_t value) noexcept {
        if (!entry) return;
        const uintptr_t offset = address - sp0;
        if (reads == kReplayReads || offset > kReplaySpan || offset % sizeof(uint64_t) != 0) {
            too_long = true;
            return;
        }
        entry->offset[reads] = static_cast<uint16_t>(offset / sizeof(uint64_t));
        digest.add(reads, value);
        ++reads;
    }
};

struct ThreadWalk {
    StackBounds bounds;
    RuleMemo memo;
    RecentRules recent;
    ReplayCache* replay;      // null until the thread's first capture
    bool replay_unavailable;  // mapping failed, or the thread is exiting
    bool in_capture;  // a capture on this thread has not returned (a signal handler's must not
                      // touch the cache)
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
    g_memo_hit_cycles{0}, g_recent_hit_cycles{0}, g_miss_cycles{0}, g_replays{0};

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
                   LeadingFrames leading, const uintptr_t* frame, WalkRecording& recording) {
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
        const bool from_rbp = (rule.flags & FrameRule::kCfaFromRbp) != 0;
        if (from_rbp) recording.use_bp();
        uintptr_t base = from_rbp ? bp : sp;
        uintptr_t cfa = base + static_cast<uintptr_t>(static_cast<intptr_t>(rule.cfa_offset));
        // The CFA only grows (no cycles) and the return address lies in [sp, high).
        if (cfa < sp + 8 || cfa > stack.high) return kNeedsFallback;
        if ((rule.flags & FrameRule::kRbpSaved) != 0) {
            uintptr_t slot = cfa + static_cast<uintptr_t>(static_cast<intptr_t>(rule.rbp_offset));
            if (slot < sp || slot > stack.high - sizeof(uintptr_t)) return kNeedsFallback;
            bp = load_stack_word(slot);
            recording.restore_bp(slot, bp);
        }
        pc = load_stack_word(cfa - 8);
        recording.read(cfa - 8, pc);
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

const pthread_key_t* replay_key() noexcept;

// The thread's replay cache, mapped on first use (mmap: captures are also
// taken in signal handlers, where malloc is not safe); null where it cannot be.
ReplayCache* replay_cache(ThreadWalk& walk) noexcept {
    if (walk.replay || walk.replay_unavailable) return walk.replay;
    const pthread_key_t* key = replay_key();
    if (!key) return nullptr;  // before this file's static initialization: try again later
    void* mapped = mmap(nullptr, sizeof(ReplayCache), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED || pthread_setspecific(*key, mapped) != 0) {
        if (mapped != MAP_FAILED) munmap(mapped, sizeof(ReplayCache));
        walk.replay_unavailable = true;
        return nullptr;
    }
    walk.replay = static_cast<ReplayCache*>(mapped);  // zero-filled: every entry empty
    return walk.replay;
}

void release_replay_cache(void* cache) noexcept {
    t_walk.replay = nullptr;
    t_walk.replay_unavailable = true;  // a capture in a later destructor walks without it
    munmap(cache, sizeof(ReplayCache));
}

struct ReplayKey {
    pthread_key_t key{};
    bool ok = pthread_key_create(&key, release_replay_cache) == 0;
};
ReplayKey g_replay_key;

const pthread_key_t* replay_key() noexcept {
    return g_replay_key.ok ? &g_replay_key.key : nullptr;
}

size_t replay_set_index(uintptr_t pc, uintptr_t sp) noexcept {
    constexpr unsigned kBits = std::countr_zero(kReplaySets);
    static_assert((size_t{1} << kBits) == kReplaySets);
    return static_cast<size_t>(((pc ^ sp) * 0x9e3779b97f4a7c15ull) >> (64 - kBits));
}

// Whether the stack words `entry`'s walk read still hold what it read (their
// digest is the recorded one): then a walk from the same registers would
// return entry's frames.
inline bool still_holds(const ReplayEntry& entry, uintptr_t sp0) noexcept {
    ReplayDigest digest;
    const size_t reads = entry.reads;
    const auto word = [&](size_t i) {
        return load_stack_word(sp0 + size_t{entry.offset[i]} * sizeof(uint64_t));
    };
    // Four at a time, the lanes in registers.
    uint64_t l0 = digest.lane[0], l1 = digest.lane[1], l2 = digest.lane[2], l3 = digest.lane[3];
    size_t i = 0;
    for (; i + 4 <= reads; i += 4) {
        l0 = ReplayDigest::step(l0, word(i));
        l1 = ReplayDigest::step(l1, word(i + 1));
        l2 = ReplayDigest::step(l2, word(i + 2));
        l3 = ReplayDigest::step(l3, word(i + 3));
    }
    digest.lane[0] = l0;
    digest.lane[1] = l1;
    digest.lane[2] = l2;
    digest.lane[3] = l3;
    for (; i < reads; ++i)
        digest.add(i, word(i));
    return digest.value() == entry.digest;
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
    if (ReplayCache* cache = t_walk.replay)
        for (ReplaySet& set : cache->set)
            for (ReplayEntry& entry : set.way)
                entry.pc0 = 0;
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
            g_miss_cycles.load(std::memory_order_relaxed),
            g_replays.load(std::memory_order_relaxed)};
}

uint64_t fallback_capture_count() noexcept {
    return g_fallback_captures.load(std::memory_order_relaxed);
}

__attribute__((noinline)) size_t capture_stack(uint64_t* frames, size_t max_depth, size_t skip,
                                               LeadingFrames leading, WalkCookie** cookie,
                                               uint64_t cookie_key) noexcept {
    if (cookie) *cookie = nullptr;
    if (max_depth == 0) return 0;
    // __builtin_frame_address(0) forces a standard frame record here
    // (push rbp; mov rsp, rbp), which hands over the caller's rsp and rbp.
    // The return-address check guards against a compiler that lays it out
    // differently.
    const auto* frame = static_cast<const uintptr_t*>(__builtin_frame_address(0));
    if (frame[1] == reinterpret_cast<uintptr_t>(__builtin_return_address(0))) {
        ThreadWalk& walk = t_walk;
        const bool counted = g_walk_stats_on.load(std::memory_order_relaxed);
        const uintptr_t pc0 = frame[1];
        const uintptr_t sp0 = reinterpret_cast<uintptr_t>(frame + 2);
        const uintptr_t bp0 = frame[0];
        // A capture interrupting another on this thread (a signal handler)
        // walks without the cache: the interrupted one may be filling it.
        const bool replayable = !walk.in_capture && max_depth <= UINT16_MAX && skip <= UINT16_MAX &&
                                leading.max <= UINT16_MAX;
        ReplaySet* set = nullptr;
        size_t way = 0;
        if (replayable) {
            walk.in_capture = true;
            if (ReplayCache* cache = replay_cache(walk)) {
                set = &cache->set[replay_set_index(pc0, sp0)];
                // Both ways may hold walks from these registers (two
                // callers whose frames happen to line up).
                for (size_t w = 0; w < kReplayWays; ++w) {
                    ReplayEntry& entry = set->way[w];
                    if (entry.matches(pc0, sp0, bp0, max_depth, skip, leading) &&
                        still_holds(entry, sp0)) {
                        set->last_used = static_cast<uint32_t>(w);
                        walk.in_capture = false;
                        if (counted) g_replays.fetch_add(1, std::memory_order_relaxed);
                        if (cookie) {
                            *cookie = &entry.cookie;
                            if (entry.cookie.key == cookie_key && entry.cookie.value != 0)
                                return kFramesInCookie;
                        }
                        std::memcpy(frames, entry.frames, entry.depth * sizeof(uint64_t));
                        return entry.depth;
                    }
                }
                way = set->last_used ^ 1;  // the walk replaces the older entry
                set->way[way].pc0 = 0;     // empty until filled below
            }
        }
        WalkRecording recording{set ? &set->way[way] : nullptr, sp0};
        const size_t depth =
            counted ? walk_cached<true>(walk, frames, max_depth, skip, leading, frame, recording)
                    : walk_cached<false>(walk, frames, max_depth, skip, leading, frame, recording);
        if (set && depth != kNeedsFallback && depth <= kReplayFrames && !recording.too_long) {
            ReplayEntry& entry = set->way[way];
            entry.sp0 = sp0;
            entry.bp0 = bp0;
            entry.leading_lo = leading.lo;
            entry.leading_hi = leading.hi;
            entry.leading_max = static_cast<uint16_t>(leading.max);
            entry.max_depth = static_cast<uint16_t>(max_depth);
            entry.skip = static_cast<uint16_t>(skip);
            entry.uses_bp0 = recording.uses_bp0 ? 1 : 0;
            entry.reads = static_cast<uint16_t>(recording.reads) & 0x7f;
            entry.digest = recording.digest.value();
            entry.depth = static_cast<uint16_t>(depth) & 0x3f;
            std::memcpy(entry.frames, frames, depth * sizeof(uint64_t));
            entry.cookie = {};
            if (cookie) *cookie = &entry.cookie;
            entry.pc0 = pc0;  // last: the entry is complete
            set->last_used = static_cast<uint32_t>(way);
        }
        if (replayable) walk.in_capture = false;
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
