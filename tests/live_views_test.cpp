// The one live set (core/replay.h) and its views: the writer's fill-in
// (Replay::apply_written), the plugin host's live table (owned, or a view of
// the writer's replay, which must show plugins the same), the analysis and
// the exports' tracker. A cuMemUnmap is one event for its range, split by
// the replay; traces of older versions hold one free per mapping. Each case
// fails when a view disagrees with the replay or the two forms disagree.
#include <doctest/doctest.h>

#include <allocscope/plugin_v2.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "analysis.h"
#include "event.h"
#include "export_live.h"
#include "plugin_host.h"
#include "replay.h"
#include "segment_owners.h"
#include "support.h"
#include "trace_builder.h"
#include "trace_reader.h"

using namespace allocscope;
using allocscope::test::TempDir;
using allocscope::test::TraceBuilder;

namespace {

constexpr uint64_t kMiB = 1 << 20;

void map(TraceBuilder& b, uint64_t address, uint64_t size) {
    Event& e = b.add(EventKind::alloc, 1);
    e.level = Level::segment;
    e.memory = MemoryKind::device;
    e.api = Api::cuMemMap;
    e.address = address;
    e.size = size;
}

// The unmap as the hook records it now: one event for the range.
void unmap_range(TraceBuilder& b, uint64_t address, uint64_t size, int32_t result = 0) {
    Event& e = b.add(EventKind::free, 1);
    e.level = Level::segment;
    e.api = Api::cuMemUnmap;
    e.address = address;
    e.size = size;
    e.flags = kFlagRange;
    e.result = result;
}

// The unmap as older traces hold it: one free per mapping address.
void unmap_one(TraceBuilder& b, uint64_t address, int32_t result = 0) {
    Event& e = b.add(EventKind::free, 1);
    e.level = Level::segment;
    e.api = Api::cuMemUnmap;
    e.address = address;
    e.result = result;
}

// One free a reader sees: where, how much, and whose.
using Freed = std::tuple<uint64_t, uint64_t, uint64_t, FreeOutcome>;

std::vector<Freed> frees_of(const std::vector<Event>& events, Replay& replay) {
    std::vector<Freed> out;
    for (const Event& e : events) {
        replay.apply(e, [&](const LiveChange& c) {
            if (c.kind == LiveChange::Kind::free && !c.failed)
                out.emplace_back(c.address, c.outcome == FreeOutcome::freed ? c.record.size : 0,
                                 c.outcome == FreeOutcome::freed ? c.record.seq : 0, c.outcome);
        });
    }
    return out;
}

// The replay's observable numbers, pool by pool.
struct Numbers {
    std::vector<std::tuple<uint64_t, uint64_t, uint64_t, uint64_t, uint64_t>> pools;
    uint64_t unknown = 0, doubles = 0, failed = 0, direct = 0;
    std::vector<uint64_t> live;  // the live addresses, sorted
    bool operator==(const Numbers&) const = default;
};

Numbers numbers(const Replay& r) {
    Numbers n;
    for (int p = 0; p < kPoolCount; ++p) {
        const PoolTotals& t = r.totals(Pool(p));
        n.pools.emplace_back(t.live_bytes, t.live_count, t.allocated_bytes, t.allocations,
                             t.peak_bytes);
        for (const LiveRecord& rec : r.table(Pool(p)).snapshot())
            n.live.push_back(rec.address);
    }
    std::sort(n.live.begin(), n.live.end());
    n.unknown = r.unknown_frees();
    n.doubles = r.double_frees();
    n.failed = r.failed_frees();
    n.direct = r.direct_driver_live_bytes();
    return n;
}

// A plugin that records every free it sees and the host's live bytes after
// each event.
struct Seen {
    std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> frees;  // address, size, alloc_seq
    std::vector<uint64_t> segment_live, block_live;
    uint64_t foreach_bytes = 0;  // live_foreach's sum at finish
};
Seen* g_seen = nullptr;
const allocscope_host_v2* g_host = nullptr;

allocscope_plugin_status seen_init(const allocscope_host_v2* host, void** state) {
    g_host = host;
    *state = g_seen;
    return ALLOCSCOPE_PLUGIN_OK;
}

allocscope_plugin_status seen_event(void* state, const allocscope_event_v2* e) {
    Seen* s = static_cast<Seen*>(state);
    if (e->kind == ALLOCSCOPE_EVENT_FREE) s->frees.emplace_back(e->address, e->size, e->alloc_seq);
    s->segment_live.push_back(g_host->live_bytes(g_host->ctx, ALLOCSCOPE_LEVEL_SEGMENT));
    s->block_live.push_back(g_host->live_bytes(g_host->ctx, ALLOCSCOPE_LEVEL_BLOCK));
    return ALLOCSCOPE_PLUGIN_OK;
}

allocscope_plugin_status seen_finish(void* state) {
    Seen* s = static_cast<Seen*>(state);
    g_host->live_foreach(
        g_host->ctx, 0,
        [](void* user, const allocscope_live_v2* l) {
            static_cast<Seen*>(user)->foreach_bytes += l->size;
            return 0;
        },
        s);
    return ALLOCSCOPE_PLUGIN_OK;
}

Seen plugin_view(const Trace& trace) {
    Seen seen;
    g_seen = &seen;
    const allocscope_plugin_v2 p{
        sizeof(allocscope_plugin_v2),
        ALLOCSCOPE_PLUGIN_V2_ABI_VERSION,
        "seen",
        "records frees and live bytes",
        ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_ALLOC) | ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_FREE),
        seen_init,
        seen_event,
        nullptr,
        seen_finish};
    HostSettings settings;
    settings.rank = 0;
    settings.warn = [](const std::string& line) { FAIL(line); };
    settings.info = [](const std::string&) {};
    PluginHost host(settings);
    host.add(&p, "inline");
    for (const Event& e : trace.events)
        host.feed(e, trace.strings, trace.params, ALLOCSCOPE_SOURCE_RUN);
    host.finish();
    g_seen = nullptr;
    return seen;
}

// Mappings of 1 MiB at 16, 17, 18 and 20 MiB, a runtime segment at 19 MiB
// and a block inside it, then `unmap` over them, then more traffic.
template <class Unmap>
TraceBuilder vmm_sequence(Unmap&& unmap) {
    TraceBuilder b;
    b.push("layers.0", "forward");
    map(b, 16 * kMiB, kMiB);
    map(b, 17 * kMiB, kMiB);
    map(b, 18 * kMiB, kMiB);
    map(b, 20 * kMiB, kMiB);
    b.segment(19 * kMiB, kMiB);
    b.block(19 * kMiB + 4096, 8192);
    b.pop();
    b.push("layers.1", "backward");
    unmap(b);
    b.block_free(19 * kMiB + 4096);
    b.block_free(19 * kMiB + 4096);  // double free of a block inside a segment
    b.segment_free(33 * kMiB);       // never allocated
    b.pop();
    return b;
}

// [16.5 MiB, 18.5 MiB): the mappings at 17 and 18 MiB start inside it (18's
// whole, though the range covers only half of it); 16's starts before it,
// 20's after it; the runtime segment at 19 MiB is no mapping.
void partial_range(TraceBuilder& b) {
    unmap_range(b, 16 * kMiB + kMiB / 2, 2 * kMiB);
}
void partial_split(TraceBuilder& b) {
    unmap_one(b, 17 * kMiB);
    unmap_one(b, 18 * kMiB);
}

Trace reloaded(const TraceBuilder& b, const std::string& name) {
    TempDir dir;
    return load_trace(b.write(dir.file(name)));
}

}  // namespace

TEST_CASE("a range unmap frees every live mapping that starts inside it, whole, in address order") {
    const TraceBuilder b = vmm_sequence(partial_range);
    Replay replay;
    const std::vector<Freed> frees = frees_of(b.events, replay);
    REQUIRE(frees.size() >= 2);
    CHECK(std::get<0>(frees[0]) == 17 * kMiB);
    CHECK(std::get<1>(frees[0]) == kMiB);
    CHECK(std::get<0>(frees[1]) == 18 * kMiB);
    CHECK(std::get<1>(frees[1]) == kMiB);  // whole, though half of it was in the range
    CHECK(replay.table(Pool::device_segment).contains(16 * kMiB));  // started before the range
    CHECK(replay.table(Pool::device_segment).contains(19 * kMiB));  // not a mapping
    CHECK(replay.table(Pool::device_segment).contains(20 * kMiB));  // after it
    CHECK(replay.mappings() == std::set<uint64_t>{16 * kMiB, 20 * kMiB});
    CHECK(replay.totals(Pool::device_segment).live_bytes == 3 * kMiB);
}

TEST_CASE("a range unmap reads exactly as the one free per mapping that older traces hold") {
    const TraceBuilder range = vmm_sequence(partial_range);
    const TraceBuilder split = vmm_sequence(partial_split);
    Replay a, b;
    std::vector<Freed> fa = frees_of(range.events, a);
    std::vector<Freed> fb = frees_of(split.events, b);
    // The same allocations freed (their seqs differ by the extra event).
    auto key = [](std::vector<Freed>& v) {
        for (Freed& f : v)
            std::get<2>(f) = 0;
        return v;
    };
    CHECK(key(fa) == key(fb));
    CHECK(numbers(a) == numbers(b));
    CHECK(a.mappings() == b.mappings());
}

TEST_CASE("a range covering no live mapping is a free of its address: unknown, then double") {
    TraceBuilder b;
    map(b, 16 * kMiB, kMiB);
    unmap_range(b, 40 * kMiB, 4 * kMiB);  // nothing mapped there
    unmap_range(b, 16 * kMiB, 2 * kMiB);
    unmap_range(b, 16 * kMiB, 2 * kMiB);  // again: its address was freed
    unmap_range(b, 16 * kMiB + 4096, 0);  // an empty range
    Replay replay;
    const std::vector<Freed> frees = frees_of(b.events, replay);
    REQUIRE(frees.size() == 4);
    CHECK(frees[0] == Freed{40 * kMiB, 0, 0, FreeOutcome::unknown});
    CHECK(std::get<3>(frees[1]) == FreeOutcome::freed);
    CHECK(frees[2] == Freed{16 * kMiB, 0, 0, FreeOutcome::double_free});
    CHECK(frees[3] == Freed{16 * kMiB + 4096, 0, 0, FreeOutcome::unknown});
    CHECK(replay.unknown_frees() == 2);
    CHECK(replay.double_frees() == 1);
    CHECK(replay.totals(Pool::device_segment).live_bytes == 0);
    CHECK(replay.mappings().empty());
}

TEST_CASE("a refused range unmap releases nothing and counts a failed free per mapping") {
    TraceBuilder range, split;
    for (TraceBuilder* b : {&range, &split}) {
        map(*b, 16 * kMiB, kMiB);
        map(*b, 17 * kMiB, kMiB);
    }
    unmap_range(range, 16 * kMiB, 2 * kMiB, 1);
    unmap_one(split, 16 * kMiB, 1);
    unmap_one(split, 17 * kMiB, 1);
    Replay a, b;
    frees_of(range.events, a);
    frees_of(split.events, b);
    CHECK(a.failed_frees() == 2);
    CHECK(numbers(a) == numbers(b));
    CHECK(a.mappings().size() == 2);
    // The mappings can still be unmapped.
    unmap_range(range, 16 * kMiB, 2 * kMiB);
    Replay again;
    frees_of(range.events, again);
    CHECK(again.totals(Pool::device_segment).live_bytes == 0);
    CHECK(again.unknown_frees() + again.double_frees() == 0);
}

TEST_CASE("a mapping replaced at its address stays in the mapping index; other memory leaves it") {
    TraceBuilder b;
    map(b, 16 * kMiB, kMiB);
    map(b, 16 * kMiB, 2 * kMiB);  // its unmap was never seen
    Replay replay;
    frees_of(b.events, replay);
    CHECK(replay.mappings() == std::set<uint64_t>{16 * kMiB});
    b.segment(16 * kMiB, kMiB);  // a runtime segment there now
    Replay again;
    frees_of(b.events, again);
    CHECK(again.mappings().empty());
    unmap_range(b, 16 * kMiB, kMiB);  // finds no mapping: a free of the address
    Replay third;
    const std::vector<Freed> frees = frees_of(b.events, third);
    REQUIRE(frees.size() == 1);
    CHECK(std::get<3>(frees[0]) == FreeOutcome::freed);  // the segment's record, by address
}

TEST_CASE("the writer fills a free in from the replay; a range keeps its length") {
    Replay replay;
    TraceBuilder b;
    map(b, 16 * kMiB, kMiB);
    b.events.back().device = 3;
    map(b, 17 * kMiB, kMiB);
    b.events.back().device = 3;
    unmap_range(b, 16 * kMiB, 2 * kMiB);
    b.events.back().device = -1;
    unmap_range(b, 16 * kMiB, 2 * kMiB);
    b.segment(40 * kMiB, 4096);
    b.segment_free(40 * kMiB);
    b.segment_free(41 * kMiB);
    std::vector<Event> written;
    size_t changes = 0;
    for (Event e : b.events) {
        replay.apply_written(e, [&](const LiveChange&) { ++changes; });
        written.push_back(e);
    }
    CHECK(changes == 8);  // 2 maps, 2 unmapped, 1 double, 1 alloc, 1 free, 1 unknown
    const Event& range = written[2];
    CHECK(range.size == 2 * kMiB);  // the range, not a mapping's size
    CHECK(range.device == 3);
    CHECK(range.memory == MemoryKind::device);
    CHECK((range.flags & (kFlagUnknownAddress | kFlagDoubleFree)) == 0);
    CHECK((range.flags & kFlagRange) != 0);
    CHECK((written[3].flags & kFlagDoubleFree) != 0);
    CHECK(written[5].size == 4096);
    CHECK(written[5].memory == MemoryKind::device);
    CHECK((written[6].flags & kFlagUnknownAddress) != 0);
    CHECK(written[6].size == 0);
}

TEST_CASE("a range unmap survives the trace format and reads as its split form in every view") {
    const Trace range = reloaded(vmm_sequence(partial_range), "range.trace");
    const Trace split = reloaded(vmm_sequence(partial_split), "split.trace");
    REQUIRE(std::count_if(range.events.begin(), range.events.end(),
                          [](const Event& e) { return (e.flags & kFlagRange) != 0; }) == 1);

    // The analysis: pools (peak before the unmap, so the same seq), odd frees.
    const TraceAnalysis ra = analyze(range);
    const TraceAnalysis sa = analyze(split);
    CHECK(ra.pools == sa.pools);
    CHECK(ra.unknown_frees == sa.unknown_frees);
    CHECK(ra.double_frees == sa.double_frees);
    CHECK(ra.failed_frees == sa.failed_frees);
    CHECK(ra.groups_at_last_step == sa.groups_at_last_step);
    REQUIRE(ra.tags.size() == sa.tags.size());
    for (size_t i = 0; i < ra.tags.size(); ++i) {
        CHECK(ra.tags[i].allocated_bytes == sa.tags[i].allocated_bytes);
        CHECK(ra.tags[i].retained_scopes == sa.tags[i].retained_scopes);
        CHECK(ra.tags[i].retained_max == sa.tags[i].retained_max);
    }

    // The plugins: the same frees (the range's as one per mapping) and the
    // same live bytes, which are the replay's.
    const Seen rp = plugin_view(range);
    const Seen sp = plugin_view(split);
    auto sizes = [](const Seen& s) {
        std::vector<std::pair<uint64_t, uint64_t>> v;
        for (const auto& [address, size, seq] : s.frees)
            v.emplace_back(address, size);
        return v;
    };
    CHECK(sizes(rp) == sizes(sp));
    CHECK(rp.segment_live.back() == sp.segment_live.back());
    CHECK(rp.block_live.back() == sp.block_live.back());
    CHECK(rp.foreach_bytes == sp.foreach_bytes);
    Replay replay;
    for (const Event& e : range.events)
        replay.apply(e);
    CHECK(rp.segment_live.back() == replay.totals(Pool::device_segment).live_bytes);
    CHECK(rp.block_live.back() == replay.totals(Pool::device_block).live_bytes);
    CHECK(rp.foreach_bytes == replay.totals(Pool::device_segment).live_bytes +
                                  replay.totals(Pool::device_block).live_bytes);
}

TEST_CASE("the views agree with the replay at every event of a mixed sequence") {
    TraceBuilder b;
    b.push("layers.0", "forward");
    b.segment(8 * kMiB, 2 * kMiB);
    b.block(8 * kMiB, 4096);
    b.block(8 * kMiB + 4096, 4096);
    map(b, 16 * kMiB, kMiB);
    map(b, 17 * kMiB, kMiB);
    b.segment(30 * kMiB, 4096, 0, 1, MemoryKind::host_pinned);
    {
        Event& e = b.add(EventKind::alloc, 1);  // a library's driver allocation
        e.level = Level::segment;
        e.memory = MemoryKind::device;
        e.api = Api::cuMemAlloc_v2;
        e.address = 40 * kMiB;
        e.size = 3 * kMiB;
    }
    b.block_free(8 * kMiB);
    b.block_free(8 * kMiB);               // double
    unmap_range(b, 16 * kMiB + 1, kMiB);  // partial: covers 17 MiB's start only
    unmap_range(b, 50 * kMiB, kMiB);      // unknown range
    b.segment_free(8 * kMiB);             // the segment, a block still inside
    b.segment(8 * kMiB, 1 * kMiB);        // reused
    b.pop();

    Replay replay;
    SegmentOwners owners;
    export_detail::LiveTracker tracker;
    uint64_t tracked = 0;
    for (const Event& e : b.events) {
        replay.apply(e, [&](const LiveChange& c) { owners.apply(c); });
        tracker.apply(
            e, [&](const LiveChange& c) { tracked += c.kind == LiveChange::Kind::alloc ? 1 : 0; });
        CHECK(numbers(tracker.replay()) == numbers(replay));
    }
    CHECK(tracked == 8);
    CHECK(replay.direct_driver_live_bytes() == 3 * kMiB);
    CHECK(replay.direct_driver_live_count() == 1);
    CHECK(replay.unknown_frees() == 1);
    CHECK(replay.double_frees() == 1);
    // The segment at 8 MiB was freed and allocated again; no block since.
    CHECK_FALSE(owners.held(8 * kMiB));
    CHECK(owners.allocator_bytes() == 0);

    const Trace trace = reloaded(b, "mixed.trace");
    const TraceAnalysis a = analyze(trace);
    for (const PoolSummary& p : a.pools) {
        CAPTURE(to_string(p.pool));
        CHECK(p.live_bytes_at_exit == replay.totals(p.pool).live_bytes);
        CHECK(p.live_count_at_exit == replay.totals(p.pool).live_count);
        CHECK(p.peak_bytes == replay.totals(p.pool).peak_bytes);
    }
    CHECK(a.unknown_frees == 1);
    CHECK(a.double_frees == 1);
    const Seen seen = plugin_view(trace);
    // Plugins see runtime segments, mappings, host pinned memory and blocks;
    // not the library's driver allocation.
    CHECK(seen.segment_live.back() == replay.totals(Pool::device_segment).live_bytes +
                                          replay.totals(Pool::host_pinned).live_bytes -
                                          replay.direct_driver_live_bytes());
    CHECK(seen.block_live.back() == replay.totals(Pool::device_block).live_bytes);
}

// --- the plugin host as a view of the writer's replay ------------------------

namespace {

// One call a plugin got and what it could read then: the event's fields,
// the host's live bytes per level and its live set (sorted: live_foreach
// promises no order).
struct Call {
    std::string what;  // "event", "step", "finish"
    uint32_t kind = 0;
    uint64_t seq = 0, step = 0, address = 0, size = 0, alloc_seq = 0, alloc_step = 0;
    std::string layer, phase, alloc_layer, alloc_phase;
    uint64_t segment_bytes = 0, block_bytes = 0, all_bytes = 0;
    // address, size, alloc_seq, step, level, stack, layer, phase
    using Live = std::tuple<uint64_t, uint64_t, uint64_t, uint64_t, uint32_t, uint32_t, std::string,
                            std::string>;
    std::vector<Live> live;
    bool operator==(const Call&) const = default;
};

struct Observed {
    std::vector<Call> calls;
    // Interned strings: one text must always come at one address.
    std::map<std::string, const char*> at;
    uint64_t moved_strings = 0;
    uint64_t visited = 0;  // live_foreach's count, summed

    std::string text(const char* p) {
        REQUIRE(p != nullptr);
        auto [it, added] = at.emplace(p, p);
        if (!added && it->second != p) ++moved_strings;
        return p;
    }
};

struct Observer {
    const allocscope_host_v2* host = nullptr;
    Observed* out = nullptr;
};
Observed* g_observed = nullptr;

void record(Observer& o, Call c) {
    const allocscope_host_v2* h = o.host;
    c.segment_bytes = h->live_bytes(h->ctx, ALLOCSCOPE_LEVEL_SEGMENT);
    c.block_bytes = h->live_bytes(h->ctx, ALLOCSCOPE_LEVEL_BLOCK);
    c.all_bytes = h->live_bytes(h->ctx, ALLOCSCOPE_LEVEL_NONE);
    struct Visit {
        Observed* out;
        std::vector<Call::Live>* live;
    } visit{o.out, &c.live};
    o.out->visited += h->live_foreach(
        h->ctx, 0,
        [](void* user, const allocscope_live_v2* l) {
            auto* v = static_cast<Visit*>(user);
            v->live->emplace_back(l->address, l->size, l->alloc_seq, l->step, l->level, l->stack_id,
                                  v->out->text(l->layer), v->out->text(l->phase));
            return 0;
        },
        &visit);
    std::sort(c.live.begin(), c.live.end());
    o.out->calls.push_back(std::move(c));
}

allocscope_plugin_status observer_init(const allocscope_host_v2* host, void** state) {
    *state = new Observer{host, g_observed};
    return ALLOCSCOPE_PLUGIN_OK;
}

allocscope_plugin_status observer_event(void* state, const allocscope_event_v2* e) {
    Observer& o = *static_cast<Observer*>(state);
    Call c;
    c.what = "event";
    c.kind = e->kind;
    c.seq = e->seq;
    c.step = e->step;
    c.address = e->address;
    c.size = e->size;
    c.alloc_seq = e->alloc_seq;
    c.alloc_step = e->alloc_step;
    c.layer = o.out->text(e->layer);
    c.phase = o.out->text(e->phase);
    c.alloc_layer = o.out->text(e->alloc_layer);
    c.alloc_phase = o.out->text(e->alloc_phase);
    record(o, std::move(c));
    return ALLOCSCOPE_PLUGIN_OK;
}

allocscope_plugin_status observer_step(void* state, uint64_t step, uint32_t) {
    Call c;
    c.what = "step";
    c.step = step;
    record(*static_cast<Observer*>(state), std::move(c));
    return ALLOCSCOPE_PLUGIN_OK;
}

allocscope_plugin_status observer_finish(void* state) {
    Observer* o = static_cast<Observer*>(state);
    Call c;
    c.what = "finish";
    record(*o, std::move(c));
    delete o;
    return ALLOCSCOPE_PLUGIN_OK;
}

const allocscope_plugin_v2 kObserver{sizeof(allocscope_plugin_v2),
                                     ALLOCSCOPE_PLUGIN_V2_ABI_VERSION,
                                     "observer",
                                     "records every call and the live set it could read",
                                     ALLOCSCOPE_EVENT_V2_ALL,
                                     observer_init,
                                     observer_event,
                                     observer_step,
                                     observer_finish};

HostSettings quiet_settings() {
    HostSettings settings;
    settings.rank = 0;
    settings.warn = [](const std::string& line) { FAIL(line); };
    settings.info = [](const std::string&) {};
    return settings;
}

// A driver event of `api` at `level` segment: a plain driver allocation or
// free, a physical handle, its release.
void driver(TraceBuilder& b, EventKind kind, Api api, MemoryKind memory, uint64_t address,
            uint64_t size) {
    Event& e = b.add(kind, 1);
    e.level = Level::segment;
    e.api = api;
    e.memory = memory;
    e.address = address;
    e.size = size;
}

// Feeds `b` as the interposer's writer does: each event through a Replay's
// apply_written (the writer's), with the string table growing as strings
// are defined ahead of the events that use them; then to a host that owns
// its table (as before) or to one viewing the writer's Replay.
Observed observe(const TraceBuilder& b, bool viewing, Replay& writer) {
    Observed observed;
    g_observed = &observed;
    std::vector<std::string> strings{""};
    PluginHost host(quiet_settings());
    host.add(&kObserver, "inline");
    if (viewing) host.view_live(writer, strings);
    CHECK(host.viewing() == viewing);
    std::vector<LiveChange> changes;
    for (Event e : b.events) {
        // The definitions the event uses, written before it (a vector that
        // moves as it grows, as the writer's does).
        while (strings.size() <= std::max(e.layer, e.phase))
            strings.push_back(b.strings[strings.size()]);
        if (viewing) host.before_live_change(e);
        changes.clear();
        writer.apply_written(e, [&](const LiveChange& c) { changes.push_back(c); });
        if (viewing) {
            host.feed(e, strings, b.params, changes);
        } else {
            host.feed(e, strings, b.params);
        }
    }
    host.finish();
    g_observed = nullptr;
    CHECK(host.statuses().at(0).enabled);
    return observed;
}

// Allocations of every kind under two tags, a step, then frees of every
// outcome, a range unmap, a failed allocation whose thread's pop waits for
// its next allocation, and a tag defined late.
TraceBuilder host_stream() {
    TraceBuilder b;
    // Strings no tag uses (a dtype, a note): the writer's ids of the tags
    // are not the host's.
    b.str("torch.bfloat16");
    b.str("a note");
    b.push("layers.0", "forward");
    b.segment(8 * kMiB, 2 * kMiB, 1);
    b.block(8 * kMiB, 4096, 2);
    b.block(8 * kMiB + 4096, 4096, 3);
    map(b, 16 * kMiB, kMiB);
    map(b, 17 * kMiB, kMiB);
    map(b, 18 * kMiB, kMiB);
    b.segment(30 * kMiB, 4096, 0, 1, MemoryKind::host_pinned);
    driver(b, EventKind::alloc, Api::cuMemAlloc_v2, MemoryKind::device, 40 * kMiB, 3 * kMiB);
    driver(b, EventKind::alloc, Api::cuMemCreate, MemoryKind::physical, 0x7000, 2 * kMiB);
    b.block(10 * kMiB, 8192, 7);  // a block of a CUDA graph's pool
    b.events.back().flags = kFlagGraphPool;
    b.events.back().aux = 1;
    b.pop();
    b.step(1);
    b.push("layers.1", "backward");
    b.block_free(8 * kMiB);                          // freed
    b.block_free(8 * kMiB);                          // double
    b.segment_free(33 * kMiB);                       // unknown
    b.segment_free(8 * kMiB);                        // refused: nothing freed
    b.events.back().result = 1;                      //
    unmap_range(b, 16 * kMiB + kMiB / 2, 2 * kMiB);  // 17 and 18 MiB
    driver(b, EventKind::free, Api::cuMemFree_v2, MemoryKind::none, 40 * kMiB, 0);
    driver(b, EventKind::free, Api::cuMemRelease, MemoryKind::none, 0x7000, 0);
    b.block(8 * kMiB + 4096, 2048, 4);  // its free never seen: replaces the record
    b.oom(64 * kMiB);
    b.pop();                     // held: the thread is failing
    b.block(9 * kMiB, 8192, 5);  // allocates again: the pop comes first
    b.push("layers.2", "forward");
    b.segment(50 * kMiB, kMiB, 6);
    b.segment_free(8 * kMiB);
    b.block_free(10 * kMiB);  // the graph pool's block
    b.pop();
    return b;
}

}  // namespace

TEST_CASE("a host viewing the writer's replay shows plugins exactly what an owning host shows") {
    const TraceBuilder b = host_stream();
    Replay owner_writer, view_writer;
    const Observed owning = observe(b, false, owner_writer);
    const Observed viewing = observe(b, true, view_writer);

    REQUIRE(owning.calls.size() == viewing.calls.size());
    for (size_t i = 0; i < owning.calls.size(); ++i) {
        CAPTURE(i);
        CAPTURE(owning.calls[i].seq);
        CHECK(owning.calls[i] == viewing.calls[i]);
    }
    CHECK(owning.visited == viewing.visited);
    CHECK(viewing.moved_strings == 0);
    CHECK(owning.moved_strings == 0);

    // What the plugins saw, in numbers: seven frees (the failed one, the
    // driver's and the handle's are not delivered; the range is two; the
    // graph pool's block, never shown, is freed as an unknown address).
    std::vector<const Call*> frees;
    for (const Call& c : viewing.calls)
        if (c.what == "event" && c.kind == ALLOCSCOPE_EVENT_FREE) frees.push_back(&c);
    REQUIRE(frees.size() == 7);
    CHECK(frees[6]->address == 10 * kMiB);
    CHECK(frees[6]->alloc_seq == 0);
    CHECK(frees[6]->alloc_layer.empty());
    for (const Call& c : viewing.calls)
        CHECK_FALSE(
            (c.what == "event" && c.kind == ALLOCSCOPE_EVENT_ALLOC && c.address == 10 * kMiB));
    CHECK(frees[0]->address == 8 * kMiB);
    CHECK(frees[0]->size == 4096);
    CHECK(frees[0]->alloc_seq == 3);  // the first block
    CHECK(frees[0]->alloc_layer == "layers.0");
    CHECK(frees[0]->alloc_phase == "forward");
    CHECK(frees[0]->layer == "layers.1");
    CHECK(frees[1]->alloc_seq == 0);  // double
    CHECK(frees[1]->alloc_layer.empty());
    CHECK(frees[2]->address == 33 * kMiB);  // unknown
    CHECK(frees[2]->alloc_seq == 0);
    CHECK(frees[3]->address == 17 * kMiB);  // the range, one free per mapping
    CHECK(frees[3]->size == kMiB);
    CHECK(frees[3]->alloc_seq == 6);
    CHECK(frees[3]->alloc_layer == "layers.0");
    CHECK(frees[4]->address == 18 * kMiB);
    CHECK(frees[4]->alloc_seq == 7);
    CHECK(frees[3]->segment_bytes == frees[4]->segment_bytes);  // both gone before either
    CHECK(frees[5]->address == 8 * kMiB);
    CHECK(frees[5]->size == 2 * kMiB);
    CHECK(frees[5]->alloc_seq == 2);

    // The pop held after the OOM sees the live set before the allocation
    // that released it; that allocation then sees its block live.
    auto pop = std::find_if(viewing.calls.begin(), viewing.calls.end(), [](const Call& c) {
        return c.what == "event" && c.kind == ALLOCSCOPE_EVENT_TAG_POP && c.layer == "layers.1";
    });
    REQUIRE(pop != viewing.calls.end());
    REQUIRE(pop + 1 != viewing.calls.end());
    CHECK(pop->block_bytes == 2048);  // the block that replaced one; not the 9 MiB one
    CHECK((pop + 1)->kind == ALLOCSCOPE_EVENT_ALLOC);
    CHECK((pop + 1)->address == 9 * kMiB);
    CHECK((pop + 1)->block_bytes == 2048 + 8192);

    // At finish: the mapping at 16 MiB, the pinned memory and the segment at
    // 50 MiB; two blocks. The driver's allocation and the handle never show.
    const Call& last = viewing.calls.back();
    CHECK(last.what == "finish");
    CHECK(last.segment_bytes == kMiB + 4096 + kMiB);
    CHECK(last.block_bytes == 2048 + 8192);
    CHECK(last.all_bytes == last.segment_bytes + last.block_bytes);
    REQUIRE(last.live.size() == 5);
    CHECK(std::get<0>(last.live[0]) == 8 * kMiB + 4096);
    CHECK(std::get<6>(last.live[0]) == "layers.1");
    CHECK(std::get<0>(last.live[4]) == 50 * kMiB);
    CHECK(std::get<6>(last.live[4]) == "layers.2");
    for (const Call& c : viewing.calls)
        for (const Call::Live& l : c.live)
            CHECK(std::get<0>(l) != 40 * kMiB);
    // At the step the writer's table held the driver's 3 MiB and the
    // handle's 2 MiB as well; the plugins saw neither.
    auto step = std::find_if(viewing.calls.begin(), viewing.calls.end(),
                             [](const Call& c) { return c.what == "step"; });
    REQUIRE(step != viewing.calls.end());
    CHECK(step->step == 1);
    CHECK(step->segment_bytes == 2 * kMiB + 3 * kMiB + 4096);
    CHECK(view_writer.totals(Pool::physical).allocations == 1);
    CHECK(view_writer.totals(Pool::device_segment).allocated_bytes ==
          2 * kMiB + 3 * kMiB + 3 * kMiB + kMiB);
}

TEST_CASE("a viewing host given another source's stream drops the view and owns its table") {
    TraceBuilder b;
    b.push("layers.0", "forward");
    b.segment(8 * kMiB, kMiB);
    b.segment(12 * kMiB, 2 * kMiB);
    b.pop();
    Observed observed;
    g_observed = &observed;
    Replay writer;
    std::vector<std::string> strings = b.strings;
    PluginHost host(quiet_settings());
    host.add(&kObserver, "inline");
    host.view_live(writer, strings);
    std::vector<LiveChange> changes;
    for (size_t i = 0; i < b.events.size(); ++i) {
        Event e = b.events[i];
        changes.clear();
        writer.apply_written(e, [&](const LiveChange& c) { changes.push_back(c); });
        // The second allocation comes as another stream's.
        const uint32_t source = i < 2 ? ALLOCSCOPE_SOURCE_RUN : ALLOCSCOPE_SOURCE_BASELINE;
        host.feed(e, strings, b.params, changes, source);
        if (i == 1) CHECK(host.viewing());
    }
    CHECK_FALSE(host.viewing());
    host.finish();
    g_observed = nullptr;
    // The writer's replay holds both; the new stream's table only its own.
    CHECK(writer.totals(Pool::device_segment).live_bytes == 3 * kMiB);
    CHECK(observed.calls.back().segment_bytes == 2 * kMiB);
    REQUIRE(observed.calls.back().live.size() == 1);
    CHECK(std::get<0>(observed.calls.back().live[0]) == 12 * kMiB);
}
