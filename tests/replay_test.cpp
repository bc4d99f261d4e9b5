#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "event.h"
#include "replay.h"

using namespace allocscope;

namespace {

// Builds events with increasing seq, as a trace holds them.
class Stream {
  public:
    explicit Stream(Replay& replay) : replay_(replay) {}

    Event alloc(uint64_t address, uint64_t size, Level level = Level::segment,
                MemoryKind memory = MemoryKind::device, Api api = Api::cudaMalloc) {
        Event e = next(EventKind::alloc);
        e.address = address;
        e.size = size;
        e.level = level;
        e.memory = memory;
        e.api = api;
        CHECK(replay_.apply(e) == FreeOutcome::freed);
        return e;
    }
    FreeOutcome free(uint64_t address, Level level = Level::segment,
                     MemoryKind memory = MemoryKind::none, Api api = Api::cudaFree,
                     int32_t result = 0) {
        Event e = next(EventKind::free);
        e.address = address;
        e.level = level;
        e.memory = memory;
        e.api = api;
        e.result = result;
        return replay_.apply(e);
    }
    Event block_alloc(uint64_t address, uint64_t size) {
        return alloc(address, size, Level::block, MemoryKind::device, Api::block_alloc);
    }
    FreeOutcome block_free(uint64_t address) {
        return free(address, Level::block, MemoryKind::none, Api::block_free);
    }
    Event host_alloc(uint64_t address, uint64_t size) {
        return alloc(address, size, Level::segment, MemoryKind::host_pinned, Api::cudaMallocHost);
    }
    FreeOutcome host_free(uint64_t address) {
        return free(address, Level::segment, MemoryKind::none, Api::cudaFreeHost);
    }
    void oom(uint64_t size) {
        Event e = next(EventKind::oom);
        e.size = size;
        e.level = Level::segment;
        e.memory = MemoryKind::device;
        e.api = Api::cudaMalloc;
        e.result = 2;  // cudaErrorMemoryAllocation
        CHECK(replay_.apply(e) == FreeOutcome::freed);
    }
    void other(EventKind kind) {
        Event e = next(kind);
        e.address = 0x1000;  // must not be taken for an allocation
        e.size = 1 << 20;
        CHECK(replay_.apply(e) == FreeOutcome::freed);
    }

  private:
    Event next(EventKind kind) {
        Event e;
        e.seq = ++seq_;
        e.t_ns = seq_ * 1000;
        e.kind = kind;
        e.tid = 7;
        e.device = 0;
        return e;
    }

    Replay& replay_;
    uint64_t seq_ = 0;
};

constexpr uint64_t kMiB = 1 << 20;

}  // namespace

TEST_CASE("a fresh replay has empty totals in every pool") {
    Replay r;
    for (Pool p : {Pool::device_segment, Pool::device_block, Pool::host_pinned}) {
        CAPTURE(to_string(p));
        CHECK(r.totals(p).live_bytes == 0);
        CHECK(r.totals(p).peak_bytes == 0);
        CHECK(r.totals(p).allocations == 0);
    }
    CHECK(r.unknown_frees() == 0);
    CHECK(r.double_frees() == 0);
    CHECK(r.failed_frees() == 0);
    CHECK(r.oom_events() == 0);
    CHECK(r.largest_failed_request() == 0);
}

TEST_CASE("allocations are pooled by level and memory kind") {
    CHECK(pool_of(Level::segment, MemoryKind::device) == Pool::device_segment);
    CHECK(pool_of(Level::segment, MemoryKind::managed) == Pool::device_segment);
    CHECK(pool_of(Level::segment, MemoryKind::host_pinned) == Pool::host_pinned);
    CHECK(pool_of(Level::block, MemoryKind::device) == Pool::device_block);
    CHECK(std::string(to_string(Pool::device_segment)) == "segment");
    CHECK(std::string(to_string(Pool::device_block)) == "block");
    CHECK(std::string(to_string(Pool::host_pinned)) == "host-pinned");
}

TEST_CASE("the peak is the highest live total and its event the allocation that reached it") {
    Replay r;
    Stream s(r);
    s.alloc(0xA000, 10 * kMiB);
    const Event peak = s.alloc(0xB000, 30 * kMiB);  // live 40 MiB: the peak
    CHECK(s.free(0xA000) == FreeOutcome::freed);    // live 30
    s.alloc(0xC000, 5 * kMiB);                      // live 35
    s.alloc(0xD000, 5 * kMiB);                      // live 40 again: not a new peak
    CHECK(s.free(0xB000) == FreeOutcome::freed);    // live 10

    const PoolTotals& t = r.totals(Pool::device_segment);
    CHECK(t.peak_bytes == 40 * kMiB);
    CHECK(t.peak_event.seq == peak.seq);
    CHECK(t.peak_event.address == 0xB000);
    CHECK(t.peak_event.size == 30 * kMiB);
    CHECK(t.live_bytes == 10 * kMiB);
    CHECK(t.live_count == 2);
    CHECK(t.allocated_bytes == 50 * kMiB);
    CHECK(t.allocations == 4);
    CHECK(r.table(Pool::device_segment).contains(0xC000));
    CHECK(r.table(Pool::device_segment).contains(0xD000));
    CHECK_FALSE(r.table(Pool::device_segment).contains(0xB000));
}

TEST_CASE("segments, blocks and host pinned memory are accounted separately") {
    Replay r;
    Stream s(r);
    s.alloc(0x10000000, 64 * kMiB);       // a segment...
    s.block_alloc(0x10000000, 8 * kMiB);  // ...and blocks carved from it
    const Event block_peak = s.block_alloc(0x10800000, 16 * kMiB);
    const Event host_peak = s.host_alloc(0x7f0000000000, 2 * kMiB);
    CHECK(s.block_free(0x10000000) == FreeOutcome::freed);
    CHECK(s.host_free(0x7f0000000000) == FreeOutcome::freed);
    s.host_alloc(0x7f0000200000, 1 * kMiB);

    const PoolTotals& seg = r.totals(Pool::device_segment);
    CHECK(seg.peak_bytes == 64 * kMiB);
    CHECK(seg.live_bytes == 64 * kMiB);
    CHECK(seg.live_count == 1);
    CHECK(seg.allocations == 1);

    const PoolTotals& blk = r.totals(Pool::device_block);
    CHECK(blk.peak_bytes == 24 * kMiB);
    CHECK(blk.peak_event.seq == block_peak.seq);
    CHECK(blk.live_bytes == 16 * kMiB);
    CHECK(blk.live_count == 1);
    CHECK(blk.allocated_bytes == 24 * kMiB);
    CHECK(blk.allocations == 2);

    const PoolTotals& host = r.totals(Pool::host_pinned);
    CHECK(host.peak_bytes == 2 * kMiB);
    CHECK(host.peak_event.seq == host_peak.seq);
    CHECK(host.live_bytes == 1 * kMiB);
    CHECK(host.live_count == 1);
    CHECK(host.allocated_bytes == 3 * kMiB);

    // A block free at the segment's address released the block, not the segment.
    CHECK(r.table(Pool::device_segment).contains(0x10000000));
    CHECK_FALSE(r.table(Pool::device_block).contains(0x10000000));
    CHECK(r.unknown_frees() == 0);
}

TEST_CASE("a free carrying its memory kind goes to that pool") {
    Replay r;
    Stream s(r);
    s.host_alloc(0x5000, 4096);
    CHECK(s.free(0x5000, Level::segment, MemoryKind::host_pinned, Api::cudaFreeHost) ==
          FreeOutcome::freed);
    CHECK(r.totals(Pool::host_pinned).live_bytes == 0);
    CHECK(r.unknown_frees() == 0);
}

TEST_CASE("unknown and double frees are counted and release nothing") {
    Replay r;
    Stream s(r);
    s.alloc(0xA000, 100);
    s.block_alloc(0xB000, 50);
    CHECK(s.free(0xDEAD) == FreeOutcome::unknown);
    CHECK(s.block_free(0xDEAD) == FreeOutcome::unknown);
    CHECK(s.host_free(0xA000) == FreeOutcome::unknown);  // device memory, wrong pool
    CHECK(s.free(0xA000) == FreeOutcome::freed);
    CHECK(s.free(0xA000) == FreeOutcome::double_free);
    CHECK(s.block_free(0xB000) == FreeOutcome::freed);
    CHECK(s.block_free(0xB000) == FreeOutcome::double_free);
    CHECK(r.unknown_frees() == 3);
    CHECK(r.double_frees() == 2);
    CHECK(r.totals(Pool::device_segment).live_bytes == 0);
    CHECK(r.totals(Pool::device_block).live_bytes == 0);
    CHECK(r.totals(Pool::device_segment).peak_bytes == 100);
}

TEST_CASE("a free whose real call failed releases nothing and is counted as failed") {
    Replay r;
    Stream s(r);
    const Event a = s.alloc(0xA000, 4 * kMiB);
    s.free(0xA000, Level::segment, MemoryKind::none, Api::cudaFree, /*result=*/1);
    CHECK(r.failed_frees() == 1);
    const PoolTotals& t = r.totals(Pool::device_segment);
    CHECK(t.live_bytes == 4 * kMiB);
    CHECK(t.live_count == 1);
    CHECK(r.table(Pool::device_segment).contains(0xA000));
    // The record is the original allocation's, so a later free matches it.
    const std::vector<LiveRecord> live = r.table(Pool::device_segment).snapshot();
    REQUIRE(live.size() == 1);
    CHECK(live[0].seq == a.seq);
    CHECK(s.free(0xA000) == FreeOutcome::freed);
    CHECK(t.live_bytes == 0);
    CHECK(r.double_frees() == 0);
    CHECK(r.unknown_frees() == 0);
    CHECK(r.failed_frees() == 1);
}

TEST_CASE("a free hands back the record of the allocation it released, and only then") {
    Replay r;
    Event alloc;
    alloc.seq = 1;
    alloc.kind = EventKind::alloc;
    alloc.level = Level::block;
    alloc.memory = MemoryKind::device;
    alloc.api = Api::block_alloc;
    alloc.address = 0xC000;
    alloc.size = 3 * kMiB;
    alloc.device = 1;
    alloc.stack = 42;
    alloc.layer = 5;
    REQUIRE(r.apply(alloc) == FreeOutcome::freed);

    // As the interposer's free hook leaves it: no size, device or memory kind.
    Event free;
    free.seq = 2;
    free.kind = EventKind::free;
    free.level = Level::block;
    free.api = Api::block_free;
    free.address = 0xC000;
    free.result = 1;  // refused: the record goes back, and still comes out
    LiveRecord got;
    CHECK(r.apply(free, &got) == FreeOutcome::freed);
    CHECK(got.seq == 1);
    CHECK(got.size == 3 * kMiB);
    CHECK(got.device == 1);
    CHECK(got.memory == MemoryKind::device);
    CHECK(got.stack == 42);
    CHECK(got.layer == 5);
    CHECK(r.totals(Pool::device_block).live_bytes == 3 * kMiB);

    free.seq = 3;
    free.result = 0;
    got = LiveRecord{};
    CHECK(r.apply(free, &got) == FreeOutcome::freed);
    CHECK(got.size == 3 * kMiB);
    CHECK(r.totals(Pool::device_block).live_bytes == 0);

    free.seq = 4;
    got = LiveRecord{};
    CHECK(r.apply(free, &got) == FreeOutcome::double_free);
    CHECK(got.seq == 0);  // untouched
    free.address = 0xD000;
    CHECK(r.apply(free, &got) == FreeOutcome::unknown);
    CHECK(got.size == 0);
}

TEST_CASE("out-of-memory events are counted with the largest failed request") {
    Replay r;
    Stream s(r);
    s.alloc(0xA000, kMiB);
    s.oom(3 * kMiB);
    s.oom(80ull << 30);
    s.oom(2 * kMiB);
    CHECK(r.oom_events() == 3);
    CHECK(r.largest_failed_request() == 80ull << 30);
    // A failed allocation adds nothing to the pools.
    const PoolTotals& t = r.totals(Pool::device_segment);
    CHECK(t.live_bytes == kMiB);
    CHECK(t.peak_bytes == kMiB);
    CHECK(t.allocations == 1);
}

TEST_CASE("tag, step, param, mark, map and unmap events leave the accounting alone") {
    Replay r;
    Stream s(r);
    s.alloc(0xA000, 100);
    for (EventKind k : {EventKind::tag_push, EventKind::tag_pop, EventKind::step, EventKind::param,
                        EventKind::mark, EventKind::map, EventKind::unmap}) {
        s.other(k);
    }
    for (Pool p : {Pool::device_segment, Pool::device_block, Pool::host_pinned}) {
        CAPTURE(to_string(p));
        const uint64_t want = p == Pool::device_segment ? 100 : 0;
        CHECK(r.totals(p).live_bytes == want);
        CHECK(r.totals(p).peak_bytes == want);
        CHECK(r.totals(p).allocated_bytes == want);
    }
    CHECK(r.unknown_frees() == 0);
    CHECK(r.oom_events() == 0);
}

TEST_CASE("an allocation over a live address replaces it without inflating live bytes") {
    Replay r;
    Stream s(r);
    s.alloc(0xA000, 100);
    s.alloc(0xA000, 300);  // the free in between was never seen
    const PoolTotals& t = r.totals(Pool::device_segment);
    CHECK(t.live_bytes == 300);
    CHECK(t.live_count == 1);
    CHECK(t.peak_bytes == 300);
    CHECK(t.allocated_bytes == 400);
    CHECK(t.allocations == 2);
    CHECK(r.table(Pool::device_segment).replaced() == 1);
}

TEST_CASE("a long alloc/free sequence ends with the live set it leaves behind") {
    Replay r;
    Stream s(r);
    uint64_t peak = 0;
    uint64_t live = 0;
    uint64_t allocated = 0;
    for (uint64_t i = 0; i < 1000; ++i) {
        s.block_alloc(0x100000 + i * 0x1000, i + 1);
        live += i + 1;
        allocated += i + 1;
        peak = std::max(peak, live);
        if (i % 2 == 1) {
            REQUIRE(s.block_free(0x100000 + (i - 1) * 0x1000) == FreeOutcome::freed);
            live -= i;
        }
    }
    const PoolTotals& t = r.totals(Pool::device_block);
    CHECK(t.live_bytes == live);
    CHECK(t.live_count == 500);
    CHECK(t.peak_bytes == peak);
    CHECK(t.peak_event.size == 1000);  // the last allocation reached the peak
    CHECK(t.allocated_bytes == allocated);
    CHECK(t.allocations == 1000);
}

TEST_CASE(
    "a change names its record's index, whose note a failed free keeps and a new record clears") {
    Replay r;
    std::vector<LiveChange> seen;
    auto apply = [&](uint64_t seq, EventKind kind, int32_t result = 0) {
        Event e;
        e.seq = seq;
        e.kind = kind;
        e.level = Level::block;
        e.memory = MemoryKind::device;
        e.api = kind == EventKind::alloc ? Api::block_alloc : Api::block_free;
        e.address = 0xB000;
        e.size = 512;
        e.result = result;
        r.apply(e, [&](const LiveChange& c) { seen.push_back(c); });
    };
    apply(1, EventKind::alloc);
    REQUIRE(seen.size() == 1);
    const Pool pool = seen[0].pool;
    CHECK(r.note(pool, seen[0].index) == 0);
    r.set_note(pool, seen[0].index, 42);

    apply(2, EventKind::free, /*result=*/1);  // the free failed: the record stays, its note too
    REQUIRE(seen.size() == 2);
    CHECK_FALSE(seen[1].released());
    CHECK(r.note(pool, seen[1].index) == 42);

    apply(3, EventKind::free);
    REQUIRE(seen.size() == 3);
    CHECK(seen[2].released());
    CHECK(r.note(pool, seen[2].index) == 42);  // read during the change

    apply(4, EventKind::alloc);  // the address again: a new record, no note
    REQUIRE(seen.size() == 4);
    CHECK(r.note(pool, seen[3].index) == 0);
}
