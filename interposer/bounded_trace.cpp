// Bounded recording on the writer thread (ALLOCSCOPE_MAX_TRACE_SIZE, see
// core/trace_bound.h): the head is sealed at the first step start past a
// quarter of the bound, checkpoints are taken at step starts (and inside
// steps longer than half the window), and a trace past its bound is
// rewritten as head + carried events + the tail from the oldest checkpoint
// that leaves at most half the window.
#include <unistd.h>

#include <algorithm>
#include <string>

#include "recorder_internal.h"

namespace allocscope::recorder {

namespace {

uint64_t head_budget() {
    return g->config.max_trace_bytes / 4;
}

// The bytes after the head the tail may use.
uint64_t window() {
    const TraceBound& b = g->bound;
    const uint64_t bound = g->config.max_trace_bytes;
    const uint64_t used = b.head.offset + b.file_overhead;
    return bound > used ? bound - used : 0;
}

TraceCheckpoint checkpoint_now(uint64_t step) {
    const TraceBound& b = g->bound;
    TraceCheckpoint c;
    c.offset = g->writer.bytes_written();
    c.events = g->writer.events_written();
    c.last_seq = b.last_seq;
    c.t_ns = b.last_t_ns;
    c.step = step;
    c.live = live_set(g->live);
    for (const auto& [tid, scopes] : b.open) {
        if (!scopes.empty()) c.open.push_back({tid, scopes});
    }
    for (const auto& [pool, r] : c.live) {
        if (pool == Pool::device_segment && b.owners.held(r.address))
            c.held_segments.push_back(r.address);
    }
    std::sort(c.held_segments.begin(), c.held_segments.end());
    return c;
}

void give_up(const std::string& why) {
    g->bound.failed = true;
    log_line(LogLevel::quiet,
             "allocscope: " + why + "; the trace is no longer bounded (ALLOCSCOPE_MAX_TRACE_SIZE)");
}

// At a record boundary (flushed) where the events after it start `step`.
void maybe_checkpoint(uint64_t step, bool step_start) {
    TraceBound& b = g->bound;
    const uint64_t at = g->writer.bytes_written();
    if (!b.head_sealed) {
        // At a step start past a quarter of the bound; past half of it
        // anywhere (a program without steps, or a very long first one).
        if (at < head_budget() || (!step_start && at < 2 * head_budget())) return;
        b.head = checkpoint_now(step);
        b.head_sealed = true;
        return;
    }
    const uint64_t last = b.cuts.empty() ? b.head.offset + b.file_overhead : b.cuts.back().offset;
    const uint64_t every = std::max<uint64_t>(window() / (step_start ? 8 : 2), 1);
    if (at - last < every) return;
    b.cuts.push_back(checkpoint_now(step));
    while (b.cuts.size() > 32)
        b.cuts.pop_front();
}

void compact() {
    TraceBound& b = g->bound;
    const uint64_t size = g->writer.bytes_written();
    // The oldest checkpoint whose tail takes at most half the window, else
    // the newest, else one taken here.
    const uint64_t half = window() / 2;
    size_t pick = b.cuts.size();
    for (size_t i = 0; i < b.cuts.size(); ++i) {
        if (size - b.cuts[i].offset <= half) {
            pick = i;
            break;
        }
    }
    if (pick == b.cuts.size()) {
        if (b.cuts.empty()) b.cuts.push_back(checkpoint_now(b.last_step));
        pick = b.cuts.size() - 1;
    }
    const TraceCheckpoint& cut = b.cuts[pick];
    // What this compaction drops: the file between the head and the cut,
    // less what an earlier one put there.
    const uint64_t events_dropped = cut.events - b.head.events - b.file_carried;
    const uint64_t bytes_dropped = cut.offset - b.head.offset - b.file_overhead;
    const std::vector<Event> carried =
        carried_events(b.head, cut, b.mark_text, b.dropped_events + events_dropped,
                       b.dropped_bytes + bytes_dropped);
    if (carried.empty()) {  // no room for them in the seqs: a later cut may have it
        b.cuts.erase(b.cuts.begin(), b.cuts.begin() + long(pick) + 1);
        return;
    }
    const std::string path = g->writer.path();
    const std::string scratch = path + ".compacting";
    std::string error;
    uint64_t new_cut = 0, new_size = 0;
    const uint64_t events =
        b.head.events + carried.size() + (g->writer.events_written() - cut.events);
    ::unlink(scratch.c_str());  // a leftover of a process killed while compacting
    if (!write_compacted(path, scratch, b.head.offset, cut.offset, carried, new_cut, new_size,
                         error) ||
        !g->writer.adopt(scratch, new_size, events, error)) {
        ::unlink(scratch.c_str());
        give_up("cannot keep the trace within its bound: " + error);
        return;
    }
    // The checkpoints after the cut, where they are in the new file.
    const uint64_t shift_from = cut.offset, shift_events = cut.events;
    const uint64_t new_events = b.head.events + carried.size();
    std::deque<TraceCheckpoint> later(b.cuts.begin() + long(pick) + 1, b.cuts.end());
    for (TraceCheckpoint& c : later) {
        c.offset = c.offset - shift_from + new_cut;
        c.events = c.events - shift_events + new_events;
    }
    b.cuts = std::move(later);
    b.file_carried = carried.size();
    b.file_overhead = new_cut - b.head.offset;
    b.dropped_events += events_dropped;
    b.dropped_bytes += bytes_dropped;
    if (new_size > g->config.max_trace_bytes / 8 * 7) {
        give_up("the trace's first steps and definitions (strings, stacks) alone take " +
                std::to_string(new_size) + " of its " + std::to_string(g->config.max_trace_bytes) +
                " bytes");
    }
}

}  // namespace

void bound_start() {
    TraceBound& b = g->bound;
    b.on = g->config.max_trace_bytes > 0;
    if (!b.on) return;
    try {
        b.mark_text = intern(kBoundedMark);
    } catch (...) {
        give_up("out of memory");
    }
}

void bound_event(const Event& e) {
    TraceBound& b = g->bound;
    if (!b.on || b.failed) return;
    try {
        if (e.kind == EventKind::step && e.step != b.last_step) {
            g->writer.flush();
            maybe_checkpoint(e.step, true);
        }
    } catch (...) {  // out of memory taking a checkpoint
        give_up("out of memory");
    }
}

void bound_live_change(const LiveChange& change) noexcept {
    TraceBound& b = g->bound;
    if (!b.on || b.failed) return;
    try {
        b.owners.apply(change);
    } catch (...) {
        give_up("out of memory");
    }
}

void bound_written(const Event& e) {
    TraceBound& b = g->bound;
    if (!b.on || b.failed) return;
    b.last_seq = e.seq;
    b.last_t_ns = e.t_ns;
    b.last_step = e.step;
    try {
        if (e.kind == EventKind::tag_push) {
            b.open[e.tid].push_back({e.layer, e.phase});
        } else if (e.kind == EventKind::tag_pop) {
            auto it = b.open.find(e.tid);
            if (it != b.open.end() && !it->second.empty()) it->second.pop_back();
        }
    } catch (...) {
        give_up("out of memory");
    }
}

void bound_after_flush() {
    TraceBound& b = g->bound;
    if (!b.on || b.failed || g->writer.failed()) return;
    try {
        maybe_checkpoint(b.last_step, false);
        if (b.head_sealed && g->writer.bytes_written() > g->config.max_trace_bytes) compact();
    } catch (...) {
        give_up("out of memory");
    }
}

}  // namespace allocscope::recorder
