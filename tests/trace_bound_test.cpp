// Bounded traces (core/trace_bound.h): a trace rewritten as its head, the
// carried events and its tail reads as the whole trace does from the tail
// on, and says what it dropped; sizes parse as --max-trace-size takes them.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "analysis.h"
#include "diff.h"
#include "replay.h"
#include "segment_owners.h"
#include "support.h"
#include "trace_bound.h"
#include "trace_reader.h"
#include "trace_writer.h"

namespace fs = std::filesystem;
using namespace allocscope;
using namespace allocscope::test;

namespace {

// Writes a trace as the interposer's writer does, keeping the live set and
// the open scopes, and takes checkpoints where steps begin.
struct Recorder {
    TraceWriter w;
    Replay live;
    std::map<uint32_t, std::vector<std::pair<uint32_t, uint32_t>>> open;
    std::map<uint32_t, std::vector<std::pair<uint32_t, uint32_t>>> tags;
    uint64_t seq = 0, t_ns = 0, step = 0;
    uint32_t strings = 1;

    explicit Recorder(const std::string& path) {
        TraceHeader h;
        h.rank = 0;
        h.world_size = 1;
        h.host = "node-1";
        std::string error;
        REQUIRE_MESSAGE(w.open(path, h, error), error);
    }
    uint32_t str(const std::string& s) {
        w.string(strings, s);
        return strings++;
    }
    void put(Event e) {
        e.seq = ++seq;
        e.t_ns = (t_ns += 1000);
        e.step = step;
        if (e.kind == EventKind::alloc || e.kind == EventKind::free) {
            const auto& s = tags[e.tid];
            if (e.kind == EventKind::alloc && !s.empty())
                e.layer = s.back().first, e.phase = s.back().second;
            LiveRecord freed;
            if (live.apply(e, &freed) == FreeOutcome::freed && e.kind == EventKind::free) {
                e.size = freed.size;
                e.memory = freed.memory;
                e.device = freed.device;
            }
        }
        w.event(e);
        if (e.kind == EventKind::tag_push) open[e.tid].push_back({e.layer, e.phase});
        if (e.kind == EventKind::tag_pop && !open[e.tid].empty()) open[e.tid].pop_back();
    }
    void push(uint32_t layer, uint32_t phase, uint32_t tid = 1) {
        tags[tid].push_back({layer, phase});
        Event e;
        e.kind = EventKind::tag_push;
        e.tid = tid;
        e.layer = layer;
        e.phase = phase;
        put(e);
    }
    void pop(uint32_t tid = 1) {
        Event e;
        e.kind = EventKind::tag_pop;
        e.tid = tid;
        e.layer = tags[tid].back().first;
        e.phase = tags[tid].back().second;
        tags[tid].pop_back();
        put(e);
    }
    void block(EventKind kind, uint64_t address, uint64_t size = 0, uint32_t tid = 1) {
        Event e;
        e.kind = kind;
        e.tid = tid;
        e.level = Level::block;
        e.memory = kind == EventKind::alloc ? MemoryKind::device : MemoryKind::none;
        e.api = kind == EventKind::alloc ? Api::block_alloc : Api::block_free;
        e.address = address;
        e.size = size;
        e.device = 0;
        put(e);
    }
    // A checkpoint where step `next` begins (before its step event).
    TraceCheckpoint checkpoint(uint64_t next) {
        w.flush();
        TraceCheckpoint c;
        c.offset = w.bytes_written();
        c.events = w.events_written();
        c.last_seq = seq;
        c.t_ns = t_ns;
        c.step = next;
        c.live = live_set(live);
        for (const auto& [tid, scopes] : open) {
            if (!scopes.empty()) c.open.push_back({tid, scopes});
        }
        return c;
    }
    void begin_step(uint64_t n) {
        step = n;
        Event e;
        e.kind = EventKind::step;
        e.tid = 1;
        put(e);
    }
};

}  // namespace

TEST_CASE("a compacted trace reads as the whole one from its cut on and says what it dropped") {
    TempDir dir;
    const std::string whole = dir.file("whole.trace"), compacted = dir.file("bounded.trace");
    TraceCheckpoint head, cut;
    uint64_t events = 0;
    {
        Recorder r(whole);
        const uint32_t mark = r.str(kBoundedMark);
        const uint32_t layer0 = r.str("layers.0"), forward = r.str("forward"),
                       backward = r.str("backward"), outer = r.str("outer");
        uint32_t late = 0;
        for (uint64_t s = 0; s < 12; ++s) {
            if (s == 3) head = r.checkpoint(s);
            if (s == 8) cut = r.checkpoint(s);
            r.begin_step(s);
            if (s == 2) r.push(outer, forward, 2);  // open from step 2 to step 9
            if (s == 9) r.pop(2);
            r.push(layer0, forward);
            r.block(EventKind::alloc, 0x1000 + s * 0x100, 4096 + s);  // lives one step
            if (s > 0) r.block(EventKind::free, 0x1000 + (s - 1) * 0x100);
            r.block(EventKind::alloc, 0x9000, 512);
            r.block(EventKind::free, 0x9000);
            r.pop();
            if (s == 5) {  // a string defined where events will be dropped, used after
                late = r.str("late.layer");
                r.push(late, forward);
                r.block(EventKind::alloc, 0x50000, 1 << 20);  // lives to the end
                r.pop();
            }
            if (s == 10) {
                r.push(late, backward);
                r.block(EventKind::alloc, 0x60000, 2048);
                r.pop();
            }
            r.push(layer0, backward);
            r.block(EventKind::alloc, 0x7000, 100);
            r.block(EventKind::free, 0x7000);
            r.pop();
        }
        events = r.w.events_written();
        FooterRecord f;
        f.events = events;
        r.w.close(f);
        (void)mark;
        const std::vector<Event> carried =
            carried_events(head, cut, mark, cut.events - head.events, cut.offset - head.offset);
        REQUIRE_FALSE(carried.empty());
        // Close "outer", open it again; free step 2's block, carry step 7's
        // and the late layer's; the mark.
        CHECK(carried.size() == 1 + 1 + 1 + 2 + 1);
        uint64_t new_cut = 0, size = 0;
        std::string error;
        REQUIRE_MESSAGE(write_compacted(whole, compacted, head.offset, cut.offset, carried, new_cut,
                                        size, error),
                        error);
        CHECK(size == fs::file_size(compacted));
        CHECK(new_cut < cut.offset);
        CHECK(size == new_cut + (fs::file_size(whole) - cut.offset));
    }
    const Trace w = load_trace(whole), b = load_trace(compacted);
    CHECK_FALSE(b.truncated);
    CHECK(b.header.host == "node-1");
    CHECK(b.strings == w.strings);  // the dropped part's definitions are kept
    REQUIRE(b.events.size() == head.events + 6 + (events - cut.events));
    for (size_t i = 0; i < head.events; ++i)
        CHECK(b.events[i].seq == w.events[i].seq);

    const TraceAnalysis aw = analyze(w), ab = analyze(b);
    CHECK(ab.bounded.gaps == 1);
    CHECK(ab.bounded.events_dropped == cut.events - head.events);
    CHECK(ab.bounded.last_step_before == 2);
    CHECK(ab.bounded.first_step_after == 8);
    CHECK(ab.bounded.carried_allocations == 2);
    CHECK(ab.bounded.carried_bytes == (4096 + 7) + (1 << 20));
    CHECK(ab.bounded.carried_scopes == 1);
    CHECK(aw.bounded.gaps == 0);
    // What is live at the end, and each step from the cut on, as in the whole.
    CHECK(ab.pool(Pool::device_block)->live_bytes_at_exit ==
          aw.pool(Pool::device_block)->live_bytes_at_exit);
    std::vector<StepMemory> sw = step_memory(w), sb = step_memory(b);
    std::erase_if(sw, [](const StepMemory& m) { return m.step < 8; });
    std::erase_if(sb, [](const StepMemory& m) { return m.step < 8; });
    CHECK(sb == sw);
    REQUIRE(sw.size() == 4);
    // The tail's allocations carry their tags and the late layer's name.
    const auto late = std::find_if(b.events.begin(), b.events.end(), [&](const Event& e) {
        return (e.flags & kFlagCarried) && e.kind == EventKind::alloc && e.size == (1u << 20);
    });
    REQUIRE(late != b.events.end());
    CHECK(b.str(late->layer) == "late.layer");
    CHECK(late->step == 8);
}

TEST_CASE("carried events that cannot fit below the tail's first seq make the cut unusable") {
    TraceCheckpoint head, cut;
    head.last_seq = 10;
    cut.last_seq = 12;  // room for 2
    cut.live = {{Pool::device_block, LiveRecord{.address = 1, .size = 8, .seq = 11}},
                {Pool::device_block, LiveRecord{.address = 2, .size = 8, .seq = 12}}};
    CHECK(carried_events(head, cut, 1, 2, 0).empty());  // 2 allocs and the mark
    cut.last_seq = 13;
    const std::vector<Event> fits = carried_events(head, cut, 1, 2, 0);
    REQUIRE(fits.size() == 3);
    CHECK(fits.front().seq == 11);
    CHECK(fits.back().seq == 13);
    CHECK(fits.back().kind == EventKind::mark);
}

TEST_CASE("sizes for --max-trace-size are bytes or powers of 1024") {
    uint64_t v = 0;
    CHECK((parse_size("1M", v) && v == 1u << 20));
    CHECK((parse_size("512K", v) && v == 512u << 10));
    CHECK((parse_size("2GiB", v) && v == uint64_t(2) << 30));
    CHECK((parse_size("65536", v) && v == 65536));
    CHECK((parse_size("0", v) && v == 0));
    for (const char* bad : {"", "M", "1.5G", "-1", "10X", "1M ", "99999999999999999999"})
        CHECK_FALSE(parse_size(bad, v));
    CHECK_FALSE(parse_size("17000000T", v));  // overflows 64 bits
}

TEST_CASE("a carried segment that held a block is the allocator's reserve after the gap") {
    // The segment came and held a block in the dropped part: its carried
    // alloc is flagged, and SegmentOwners counts it as the allocator's.
    TraceCheckpoint head, cut;
    head.last_seq = 10;
    cut.last_seq = 100;
    LiveRecord held{.address = 0x1000000, .size = 2 << 20, .seq = 20};
    LiveRecord workspace{.address = 0x9000000, .size = 1 << 20, .seq = 21};
    held.memory = workspace.memory = MemoryKind::device;
    held.api = workspace.api = Api::cudaMalloc;
    cut.live = {{Pool::device_segment, held}, {Pool::device_segment, workspace}};
    cut.held_segments = {held.address};
    const std::vector<Event> carried = carried_events(head, cut, 1, 80, 0);
    REQUIRE(carried.size() == 3);
    Replay replay;
    SegmentOwners owners;
    for (const Event& e : carried)
        replay.apply(e, [&](const LiveChange& c) { owners.apply(c); });
    CHECK(pool_of(carried[0]) == Pool::device_segment);
    CHECK((carried[0].flags & kFlagHeldBlock) != 0);
    CHECK((carried[1].flags & kFlagHeldBlock) == 0);
    CHECK(owners.allocator_bytes() == 2u << 20);
    CHECK(owners.held(held.address));
    CHECK_FALSE(owners.held(workspace.address));
}
