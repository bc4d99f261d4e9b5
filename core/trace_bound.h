// Bounded recording (allocscope run --max-trace-size): a trace that would
// grow past its bound is rewritten as its head (the first steps, kept
// whole), the definitions (strings, stacks, modules, params) of what it
// drops, the events that carry the live set over the gap, and its tail from
// a live-set checkpoint on. The writer thread takes the checkpoints (at step
// starts, or every so many bytes) and decides when to compact; the pieces
// here are what it and the tests share.
//
// The carried events turn what was live (and the scopes open) at the end of
// the head into what was live (and open) at the checkpoint: tag_pop for the
// head's open scopes, tag_push for the checkpoint's, a free for each
// allocation live at the head's end and gone by the checkpoint, an alloc for
// each allocation made since and still live, each flagged kFlagCarried, then
// one mark (kBoundedMark: `address` events dropped so far, `size` bytes). A
// reader replays them as any events, so the live set where the tail begins
// is the one the unbounded trace has there.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "event.h"
#include "live_table.h"
#include "replay.h"

namespace allocscope {

// The text of the mark a bounded trace writes where it dropped events.
inline constexpr const char* kBoundedMark = "allocscope: events dropped (max trace size)";

// A thread's open scopes, outermost first: (layer, phase) string ids.
struct OpenScopes {
    uint32_t tid = 0;
    std::vector<std::pair<uint32_t, uint32_t>> scopes;
};

// Where a trace may be cut: the file offset of a record boundary and what
// was live and open there.
struct TraceCheckpoint {
    uint64_t offset = 0;                            // bytes in the file before it
    uint64_t events = 0;                            // events in the file before it
    uint64_t last_seq = 0;                          // the last event's seq before it
    uint64_t t_ns = 0;                              // the last event's time before it
    uint64_t step = 0;                              // the step the events after it start in
    std::vector<std::pair<Pool, LiveRecord>> live;  // sorted (live_set)
    std::vector<OpenScopes> open;                   // threads with open scopes
    // The live device segments that have held a block (SegmentOwners),
    // sorted: their carried allocs are flagged kFlagHeldBlock.
    std::vector<uint64_t> held_segments;
};

// What `replay` holds live, in every pool, sorted by (pool, seq).
std::vector<std::pair<Pool, LiveRecord>> live_set(const Replay& replay);

// The carried events from `head` to `cut` (see the top of the file), with
// seqs from head.last_seq + 1 on; empty when they would not fit below the
// tail's first seq (cut.last_seq + 1): the cut is then unusable.
std::vector<Event> carried_events(const TraceCheckpoint& head, const TraceCheckpoint& cut,
                                  uint32_t mark_text, uint64_t dropped_events,
                                  uint64_t dropped_bytes);

// Writes to `out` the bytes [0, head_end) of the trace at `path`, the
// definition records of [head_end, cut), an event block (or several) of
// `carried`, and the bytes [cut, end of file). Returns false with `error`
// set when a file cannot be read or written or a record in [head_end, cut)
// cannot be framed; `new_cut` is where the tail begins in `out`, `size` its
// length.
bool write_compacted(const std::string& path, const std::string& out, uint64_t head_end,
                     uint64_t cut, std::span<const Event> carried, uint64_t& new_cut,
                     uint64_t& size, std::string& error);

// Parses a size for --max-trace-size / ALLOCSCOPE_MAX_TRACE_SIZE: bytes, or
// a number with K, M, G (or KiB, MiB, GiB; powers of 1024). False when it is
// not one.
bool parse_size(std::string_view text, uint64_t& bytes);

// The smallest bound a trace takes: its head, a window and the carried
// events need room.
inline constexpr uint64_t kMinTraceBound = 64 * 1024;

}  // namespace allocscope
