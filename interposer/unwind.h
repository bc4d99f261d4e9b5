// Raw call-stack capture for the hook hot path: return addresses only, no
// symbolization, no allocation, no locks on the fast path.
#pragma once

#include <cstddef>
#include <cstdint>

namespace allocscope {

// Leading frames to drop by address: after `skip`, up to `max` frames whose
// return address lies in [lo, hi) (the tracer's own code) are dropped before
// the first one is kept, without counting towards max_depth.
struct LeadingFrames {
    uintptr_t lo = 0;
    uintptr_t hi = 0;
    size_t max = 0;
};

// Writes up to `max_depth` return addresses of the calling thread into
// `frames`, innermost first, starting with the caller of the function that
// called capture_stack() (`skip` further frames are dropped, then the
// `leading` ones). Returns the number written. Safe to call from any thread
// at any time after the process started; never throws.
//
// `cookie`, when given, is set to a pair of words kept with the thread's
// record of this walk (null when there is none): zero for a new walk, and
// what the caller stored there after an earlier capture that this one
// replays, i.e. one with exactly these frames. When that stored key equals
// `cookie_key` (and its value is not 0), the frames are not copied and
// kFramesInCookie is returned instead of a depth: the caller keeps what it
// needs of them in the value (the recorder: the stack id it interned for
// them). Valid until the thread's next capture.
struct WalkCookie {
    uint64_t key = 0;
    uint64_t value = 0;
};
inline constexpr size_t kFramesInCookie = ~size_t{0};
size_t capture_stack(uint64_t* frames, size_t max_depth, size_t skip, LeadingFrames leading = {},
                     WalkCookie** cookie = nullptr, uint64_t cookie_key = 0) noexcept;

// Counting for ALLOCSCOPE_LOG=debug: once enabled, cached walks add up the
// frames they step through and how many rules came from the thread's memo
// of its last walk and from its table of recent rules (a relaxed add per
// walk); with `cycles` also the time-stamp-counter cycles spent on frames
// by where their rule came from (two fenced counter reads per frame:
// slower walks).
struct WalkStats {
    uint64_t walks = 0;
    uint64_t frames = 0;
    uint64_t memo_hits = 0;
    uint64_t recent_hits = 0;
    uint64_t memo_hit_cycles = 0;  // all 0 where the processor has no time-stamp counter
    uint64_t recent_hit_cycles = 0;
    uint64_t miss_cycles = 0;  // rules from the process-wide cache (or computed)
    uint64_t replays = 0;      // captures answered by replaying an earlier walk (not in `walks`)
};
void enable_walk_stats(bool cycles) noexcept;
WalkStats walk_stats() noexcept;

// The same contract through libgcc's _Unwind_Backtrace alone: what
// capture_stack() falls back to, 2-6 µs for 24 frames (the benchmark's
// baseline).
size_t capture_stack_unwinder(uint64_t* frames, size_t max_depth, size_t skip) noexcept;

}  // namespace allocscope
