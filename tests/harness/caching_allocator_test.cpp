// The harness's caching allocator against PyTorch's accounting rules. The
// expected numbers are worked out by hand from those rules
// (c10/cuda/CUDACachingAllocator.cpp) next to each step.
#include <allocscope/allocscope.h>
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "alloc/caching_allocator.h"
#include "cuda_decls.h"

using namespace allocscope::harness::alloc;

namespace {

constexpr size_t MiB = size_t{1} << 20;

// sim_cudart reads its memory limit once, at the first runtime call; set it
// before main so the runtime tests below run on a 64 MiB device.
const int sim_limit_set = setenv("ALLOCSCOPE_SIM_MEMORY_LIMIT", "67108864", 1);

// Hands out addresses without memory behind them (the allocator never
// touches the memory it manages), 2 MiB-aligned with a gap between segments
// so that no two segments are adjacent.
struct FakeDevice {
    size_t capacity = SIZE_MAX;
    size_t in_use = 0;
    uintptr_t next = uintptr_t{1} << 40;
    std::map<uintptr_t, size_t> live;
    std::vector<size_t> requests;  // every segment size asked for, failed ones too
    int failures = 0;
    int releases = 0;

    SegmentSource source() {
        return {[this](size_t bytes) -> void* {
                    requests.push_back(bytes);
                    if (bytes > capacity - in_use) {
                        ++failures;
                        return nullptr;
                    }
                    uintptr_t base = next;
                    next += (bytes + kRoundLarge - 1) / kRoundLarge * kRoundLarge + kRoundLarge;
                    live[base] = bytes;
                    in_use += bytes;
                    return reinterpret_cast<void*>(base);
                },
                [this](void* ptr) {
                    auto it = live.find(reinterpret_cast<uintptr_t>(ptr));
                    if (it == live.end()) throw std::logic_error("release of an unknown segment");
                    in_use -= it->second;
                    live.erase(it);
                    ++releases;
                }};
    }
};

struct Event {
    bool alloc;
    void* ptr;
    size_t size;  // 0 for a free
    int device;   // -1 for a free
    Stream stream;
    bool operator==(const Event&) const = default;
};

// Relies on the allocator calling its sink under its lock: no lock here.
struct EventLog {
    std::vector<Event> events;
    std::vector<size_t> ooms;  // the sizes of the requests given up on
    BlockEventSink sink() {
        return {[this](void* ptr, size_t size, int device, Stream stream) {
                    events.push_back({true, ptr, size, device, stream});
                },
                [this](void* ptr) {
                    events.push_back({false, ptr, 0, -1, nullptr});
                },
                [this](size_t size, int, Stream) { ooms.push_back(size); }};
    }
};

BlockEventSink ignore_events() {
    return {[](void*, size_t, int, Stream) {}, [](void*) {}, nullptr};
}

void* at(void* base, size_t offset) {
    return static_cast<char*>(base) + offset;
}

Stream stream_id(uintptr_t id) {
    return reinterpret_cast<Stream>(id);
}

}  // namespace

// allocscope's hook ABI, defined by this test program (exported with
// --export-dynamic) where liballocscope.so would define it: the production
// sink finds these through allocscope_dl.h's dlsym lookup.
std::vector<Event> g_hook_events;
extern "C" void allocscope_block_alloc(void* ptr, size_t size, int device, void* stream) {
    g_hook_events.push_back({true, ptr, size, device, stream});
}
extern "C" void allocscope_block_free(void* ptr) {
    g_hook_events.push_back({false, ptr, 0, -1, nullptr});
}
struct HookOom {
    size_t size;
    int device;
    uint64_t device_free;
    bool operator==(const HookOom&) const = default;
};
std::vector<HookOom> g_hook_ooms;
extern "C" void allocscope_block_oom(size_t size, int device, void*, uint64_t device_free) {
    g_hook_ooms.push_back({size, device, device_free});
}

TEST_CASE("request sizes are rounded up to a multiple of 512 B, at least 512 B") {
    CHECK(round_size(0) == 512);
    CHECK(round_size(1) == 512);
    CHECK(round_size(512) == 512);
    CHECK(round_size(513) == 1024);
    CHECK(round_size(1000) == 1024);
    CHECK(round_size(MiB + 1) == MiB + 512);

    FakeDevice device;
    CachingAllocator allocator(0, device.source(), ignore_events());
    void* p = allocator.allocate(1);
    CHECK(allocator.stats().allocated_bytes.current == 512);
    CHECK(allocator.stats().requested_bytes.current == 1);
    allocator.free(p);
}

TEST_CASE("a zero-byte request returns nullptr without a block or an event") {
    FakeDevice device;
    EventLog log;
    CachingAllocator allocator(0, device.source(), log.sink());
    CHECK(allocator.allocate(0) == nullptr);
    allocator.free(nullptr);
    CHECK(device.requests.empty());
    CHECK(log.events.empty());
    CHECK(allocator.stats().allocations.current == 0);
}

TEST_CASE(
    "segments: 2 MiB for the small pool, 20 MiB below 10 MiB, the request rounded to "
    "2 MiB from 10 MiB") {
    struct Case {
        size_t request;
        size_t segment;
        PoolKind pool;
        size_t block;  // the allocated block: rounded, plus an unsplit remainder
    };
    const Case cases[] = {
        {1, 2 * MiB, PoolKind::small, 512},
        {MiB, 2 * MiB, PoolKind::small, MiB},  // kSmallSize itself is small
        {MiB + 1, 20 * MiB, PoolKind::large, MiB + 512},
        {10 * MiB - 512, 20 * MiB, PoolKind::large, 10 * MiB - 512},
        {10 * MiB - 511, 10 * MiB, PoolKind::large, 10 * MiB},  // rounds to 10 MiB
        {10 * MiB + 1, 12 * MiB, PoolKind::large, 10 * MiB + 512},
        {33 * MiB, 34 * MiB, PoolKind::large, 34 * MiB},  // 1 MiB remainder: not split
    };
    for (const Case& c : cases) {
        CAPTURE(c.request);
        CHECK(segment_size_for(round_size(c.request)) == c.segment);
        FakeDevice device;
        CachingAllocator allocator(0, device.source(), ignore_events());
        void* p = allocator.allocate(c.request);
        CHECK(device.requests == std::vector<size_t>{c.segment});
        auto segments = allocator.snapshot();
        REQUIRE(segments.size() == 1);
        CHECK(segments[0].base == p);
        CHECK(segments[0].size == c.segment);
        CHECK(segments[0].pool == c.pool);
        CHECK(segments[0].blocks[0].size == c.block);
        CHECK(allocator.stats().allocated_bytes.current == c.block);
        CHECK(allocator.stats().reserved_bytes.current == c.segment);
        allocator.free(p);
    }
}

TEST_CASE("three 1000-byte tensors: allocated 3 x 1024, reserved 2 MiB, packed in one segment") {
    FakeDevice device;
    CachingAllocator allocator(0, device.source(), ignore_events());
    void* a = allocator.allocate(1000);
    void* b = allocator.allocate(1000);
    void* c = allocator.allocate(1000);
    CHECK(b == at(a, 1024));
    CHECK(c == at(a, 2048));
    MemoryStats s = allocator.stats();
    CHECK(s.allocated_bytes.current == 3 * 1024);
    CHECK(s.requested_bytes.current == 3000);
    CHECK(s.reserved_bytes.current == 2 * MiB);
    CHECK(s.allocations.current == 3);
    CHECK(s.segments.current == 1);
    auto segments = allocator.snapshot();
    REQUIRE(segments.size() == 1);
    REQUIRE(segments[0].blocks.size() == 4);
    CHECK(segments[0].allocated_size == 3 * 1024);
    CHECK(segments[0].blocks[3].ptr == at(a, 3072));
    CHECK(segments[0].blocks[3].size == 2 * MiB - 3072);
    CHECK_FALSE(segments[0].blocks[3].allocated);
    for (void* p : {a, b, c})
        allocator.free(p);
}

TEST_CASE("a freed block is handed out again to the next request of its size on its stream") {
    FakeDevice device;
    CachingAllocator allocator(0, device.source(), ignore_events());
    void* a = allocator.allocate(1000);
    void* b = allocator.allocate(1000);
    void* c = allocator.allocate(1000);
    allocator.free(b);
    // Best fit: the 1024 B hole between a and c beats the segment's tail.
    CHECK(allocator.allocate(900) == b);
    void* big = allocator.allocate(3 * MiB);
    allocator.free(big);
    CHECK(allocator.allocate(3 * MiB) == big);
    CHECK(device.requests.size() == 2);
    for (void* p : {a, b, c, big})
        allocator.free(p);
}

TEST_CASE("best fit takes the smallest free block that is large enough and splits it") {
    FakeDevice device;
    CachingAllocator allocator(0, device.source(), ignore_events());
    void* hole4k = allocator.allocate(4096);
    void* wall1 = allocator.allocate(512);
    void* hole2k = allocator.allocate(2048);
    void* wall2 = allocator.allocate(512);
    CHECK(wall1 == at(hole4k, 4096));
    CHECK(wall2 == at(hole2k, 2048));
    allocator.free(hole4k);
    allocator.free(hole2k);
    // 1500 rounds to 1536; the 2048 B hole leaves 512 B, enough to split in
    // the small pool.
    void* p = allocator.allocate(1500);
    CHECK(p == hole2k);
    CHECK(allocator.allocate(512) == at(hole2k, 1536));
    CHECK(allocator.allocate(4000) == hole4k);
    CHECK(device.requests.size() == 1);
    CHECK(allocator.stats().allocated_bytes.current == 4096 + 512 + 1536 + 512 + 512);
}

TEST_CASE("a large block keeps a remainder of up to 1 MiB, which counts as allocated") {
    FakeDevice device;
    EventLog log;
    CachingAllocator allocator(0, device.source(), log.sink());
    // 19 MiB - 512 in a 20 MiB segment: remainder 1 MiB + 512 > 1 MiB, split.
    void* split = allocator.allocate(19 * MiB - 512);
    // 11 MiB in a 12 MiB segment: remainder exactly 1 MiB, not split.
    void* whole = allocator.allocate(11 * MiB);
    auto segments = allocator.snapshot();
    REQUIRE(segments.size() == 2);
    CHECK(segments[0].blocks.size() == 2);
    CHECK(segments[0].blocks[1].size == MiB + 512);
    CHECK(segments[1].blocks.size() == 1);
    MemoryStats s = allocator.stats();
    CHECK(s.allocated_bytes.current == (19 * MiB - 512) + 12 * MiB);
    CHECK(s.requested_bytes.current == (19 * MiB - 512) + 11 * MiB);
    REQUIRE(log.events.size() == 2);
    CHECK(log.events[1].size == 12 * MiB);
    allocator.free(split);
    allocator.free(whole);
}

TEST_CASE("a freed middle block merges with both free neighbours into one free segment") {
    FakeDevice device;
    CachingAllocator allocator(0, device.source(), ignore_events());
    void* a = allocator.allocate(1000);
    void* b = allocator.allocate(1000);
    void* c = allocator.allocate(1000);
    allocator.free(a);  // b is in use: a stays a block of its own
    allocator.free(c);  // merges with the free tail
    auto blocks = allocator.snapshot()[0].blocks;
    REQUIRE(blocks.size() == 3);
    CHECK(blocks[0].size == 1024);
    CHECK(blocks[2].ptr == c);
    CHECK(blocks[2].size == 2 * MiB - 2048);

    allocator.free(b);
    auto segments = allocator.snapshot();
    REQUIRE(segments.size() == 1);
    REQUIRE(segments[0].blocks.size() == 1);
    CHECK(segments[0].blocks[0].ptr == a);
    CHECK(segments[0].blocks[0].size == 2 * MiB);
    CHECK_FALSE(segments[0].blocks[0].allocated);
    CHECK(allocator.stats().allocated_bytes.current == 0);
    CHECK(allocator.stats().reserved_bytes.current == 2 * MiB);  // cached, not returned
    CHECK(device.releases == 0);
}

TEST_CASE("streams do not share cached blocks") {
    FakeDevice device;
    CachingAllocator allocator(0, device.source(), ignore_events());
    const Stream s1 = stream_id(0x1000), s2 = stream_id(0x2000);
    void* p1 = allocator.allocate(1000, s1);
    allocator.free(p1);
    void* p2 = allocator.allocate(1000, s2);  // s1's free segment is not s2's
    CHECK(p2 != p1);
    CHECK(device.requests.size() == 2);
    allocator.free(p2);
    CHECK(allocator.allocate(1000, s1) == p1);
    CHECK(allocator.allocate(5 * MiB, s2) != nullptr);
    CHECK(allocator.allocate(5 * MiB, s1) != nullptr);
    CHECK(device.requests.size() == 4);  // one large segment per stream
    auto segments = allocator.snapshot();
    REQUIRE(segments.size() == 4);
    CHECK(segments[0].stream == s1);
    CHECK(segments[1].stream == s2);
    CHECK(segments[2].stream == s2);
    CHECK(segments[3].stream == s1);
}

TEST_CASE("allocated, reserved and their peaks follow PyTorch for a scripted sequence") {
    FakeDevice device;
    CachingAllocator allocator(0, device.source(), ignore_events());
    auto check = [&](size_t allocated, size_t allocated_peak, size_t reserved,
                     size_t reserved_peak) {
        MemoryStats s = allocator.stats();
        CHECK(s.allocated_bytes.current == allocated);
        CHECK(s.allocated_bytes.peak == allocated_peak);
        CHECK(s.reserved_bytes.current == reserved);
        CHECK(s.reserved_bytes.peak == reserved_peak);
    };
    void* a = allocator.allocate(1000);  // 1024 in a new 2 MiB small segment
    check(1024, 1024, 2 * MiB, 2 * MiB);
    void* b = allocator.allocate(3 * MiB);  // new 20 MiB segment, 17 MiB split off
    check(1024 + 3 * MiB, 1024 + 3 * MiB, 22 * MiB, 22 * MiB);
    // 12 MiB + 512 fits the cached 17 MiB remainder, so no exact segment;
    // 5 MiB - 512 > 1 MiB is split off again.
    void* c = allocator.allocate(12 * MiB + 1);
    CHECK(c == at(b, 3 * MiB));
    check(1024 + 15 * MiB + 512, 1024 + 15 * MiB + 512, 22 * MiB, 22 * MiB);
    allocator.free(b);  // a 3 MiB hole: c, its neighbour, is in use
    check(1024 + 12 * MiB + 512, 1024 + 15 * MiB + 512, 22 * MiB, 22 * MiB);
    // Neither the 3 MiB hole nor the 5 MiB - 512 tail fits 5 MiB: a new
    // 20 MiB segment.
    void* d = allocator.allocate(5 * MiB);
    check(1024 + 17 * MiB + 512, 1024 + 17 * MiB + 512, 42 * MiB, 42 * MiB);
    allocator.free(c);  // merges with the hole and the tail: b's segment is free
    check(1024 + 5 * MiB, 1024 + 17 * MiB + 512, 42 * MiB, 42 * MiB);
    allocator.empty_cache();  // only b's segment is entirely free
    check(1024 + 5 * MiB, 1024 + 17 * MiB + 512, 22 * MiB, 42 * MiB);
    allocator.reset_peak_stats();
    check(1024 + 5 * MiB, 1024 + 5 * MiB, 22 * MiB, 22 * MiB);
    // 1 MiB is a small request: it fits the 2 MiB - 1024 tail of a's segment.
    void* e = allocator.allocate(MiB);
    CHECK(e == at(a, 1024));
    check(1024 + 6 * MiB, 1024 + 6 * MiB, 22 * MiB, 22 * MiB);
    MemoryStats s = allocator.stats();
    CHECK(s.allocations.current == 3);
    CHECK(s.allocations.peak == 3);
    CHECK(s.segments.current == 2);
    CHECK(s.requested_bytes.current == 1000 + 5 * MiB + MiB);
    CHECK(device.requests == std::vector<size_t>{2 * MiB, 20 * MiB, 20 * MiB});
    for (void* p : {a, d, e})
        allocator.free(p);
}

TEST_CASE("empty_cache returns only segments with no block in use") {
    FakeDevice device;
    CachingAllocator allocator(0, device.source(), ignore_events());
    void* kept = allocator.allocate(1000);
    void* freed = allocator.allocate(1000);
    void* large = allocator.allocate(12 * MiB);
    allocator.free(freed);  // its segment still holds `kept`
    allocator.free(large);
    allocator.empty_cache();
    CHECK(device.releases == 1);
    CHECK(device.live.size() == 1);
    CHECK(allocator.stats().reserved_bytes.current == 2 * MiB);
    CHECK(allocator.snapshot().size() == 1);
    allocator.free(kept);
    allocator.empty_cache();
    CHECK(device.live.empty());
    CHECK(allocator.stats().reserved_bytes.current == 0);
    CHECK(allocator.stats().segments.current == 0);
}

TEST_CASE(
    "when no segment can be had, cached segments are released and the request retried "
    "once, then it is out of memory") {
    FakeDevice device;
    device.capacity = 24 * MiB;
    EventLog log;
    CachingAllocator allocator(0, device.source(), log.sink());
    void* x = allocator.allocate(12 * MiB);  // exact 12 MiB segment
    allocator.free(x);                       // cached
    void* small = allocator.allocate(1000);  // 2 MiB segment, kept split and in use
    // 12 + 2 + 14 > 24: the first attempt fails, x's cached segment goes back,
    // the retry succeeds.
    void* y = allocator.allocate(14 * MiB);
    CHECK(device.requests == std::vector<size_t>{12 * MiB, 2 * MiB, 14 * MiB, 14 * MiB});
    CHECK(device.failures == 1);
    CHECK(device.releases == 1);
    MemoryStats s = allocator.stats();
    CHECK(s.num_alloc_retries == 1);
    CHECK(s.num_ooms == 0);
    CHECK(s.reserved_bytes.current == 16 * MiB);

    // 16 + 12 > 24 and nothing is releasable: the split small segment stays.
    const size_t events_before = log.events.size();
    try {
        allocator.allocate(12 * MiB);
        FAIL("expected OutOfMemoryError");
    } catch (const OutOfMemoryError& e) {
        CHECK(e.requested == 12 * MiB);
        CHECK(e.segment_size == 12 * MiB);
    }
    s = allocator.stats();
    CHECK(s.num_alloc_retries == 2);
    CHECK(s.num_ooms == 1);
    CHECK(s.reserved_bytes.current == 16 * MiB);
    CHECK(s.allocated_bytes.current == 1024 + 14 * MiB);
    CHECK(device.releases == 1);
    CHECK(log.events.size() == events_before);
    CHECK(log.ooms == std::vector<size_t>{12 * MiB});  // reported once, after the retry
    allocator.free(small);
    allocator.free(y);
}

TEST_CASE("every block allocation and free reaches the sink with block size, device and stream") {
    FakeDevice device;
    EventLog log;
    const Stream s = stream_id(0x7);
    CachingAllocator allocator(3, device.source(), log.sink());
    void* a = allocator.allocate(1000, s);
    void* b = allocator.allocate(11 * MiB, s);
    allocator.free(a);
    void* c = allocator.allocate(700, s);  // reuses a's block
    allocator.free(b);
    allocator.free(c);
    const std::vector<Event> expected = {
        {true, a, 1024, 3, s},
        {true, b, 12 * MiB, 3, s},  // the unsplit block, as
                                    // memory_allocated counts it
        {false, a, 0, -1, nullptr},
        {true, a, 1024, 3, s},
        {false, b, 0, -1, nullptr},
        {false, a, 0, -1, nullptr},
    };
    CHECK(c == a);
    CHECK(log.events == expected);
}

TEST_CASE("freeing a pointer the allocator did not hand out throws and changes nothing") {
    FakeDevice device;
    EventLog log;
    CachingAllocator allocator(0, device.source(), log.sink());
    void* p = allocator.allocate(1000);
    CHECK_THROWS_AS(allocator.free(at(p, 512)), std::invalid_argument);
    allocator.free(p);
    CHECK_THROWS_AS(allocator.free(p), std::invalid_argument);
    CHECK(log.events.size() == 2);
    CHECK(allocator.stats().allocated_bytes.current == 0);
}

TEST_CASE("destruction returns free segments and leaves those with blocks in use") {
    FakeDevice device;
    {
        CachingAllocator allocator(0, device.source(), ignore_events());
        allocator.allocate(1000);  // never freed
        allocator.free(allocator.allocate(12 * MiB));
    }
    CHECK(device.releases == 1);
    REQUIRE(device.live.size() == 1);
    CHECK(device.live.begin()->second == 2 * MiB);
}

TEST_CASE("threads allocating and freeing at once keep totals exact and events consistent") {
    FakeDevice device;
    std::set<void*> live;  // checked inside the sink, i.e. under the allocator's lock
    bool consistent = true;
    uint64_t events = 0;
    BlockEventSink sink{[&](void* ptr, size_t, int, Stream) {
                            consistent &= live.insert(ptr).second;
                            ++events;
                        },
                        [&](void* ptr) {
                            consistent &= live.erase(ptr) == 1;
                            ++events;
                        },
                        nullptr};
    CachingAllocator allocator(0, device.source(), sink);
    constexpr int kThreads = 8;
    constexpr int kSteps = 3000;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&allocator, t] {
            std::mt19937 rng(static_cast<unsigned>(t));
            // Half the threads share the default stream, half have their own.
            const Stream stream = t % 2 == 0 ? nullptr : stream_id(0x100 * (t + 1));
            std::vector<void*> mine;
            for (int i = 0; i < kSteps; ++i) {
                if (mine.size() < 32 && (mine.empty() || rng() % 2 == 0)) {
                    size_t bytes = rng() % 8 == 0 ? 1 + rng() % (12 * MiB) : 1 + rng() % 65536;
                    mine.push_back(allocator.allocate(bytes, stream));
                } else {
                    size_t k = rng() % mine.size();
                    allocator.free(mine[k]);
                    mine[k] = mine.back();
                    mine.pop_back();
                }
            }
            for (void* p : mine)
                allocator.free(p);
        });
    }
    for (auto& th : threads)
        th.join();
    CHECK(consistent);
    CHECK(live.empty());
    CHECK(events % 2 == 0);
    MemoryStats s = allocator.stats();
    CHECK(s.allocated_bytes.current == 0);
    CHECK(s.requested_bytes.current == 0);
    CHECK(s.allocations.current == 0);
    for (const SegmentInfo& seg : allocator.snapshot())
        CHECK(seg.blocks.size() == 1);
    allocator.empty_cache();
    CHECK(device.live.empty());
    CHECK(allocator.stats().reserved_bytes.current == 0);
}

TEST_CASE(
    "through the CUDA runtime: segments come from cudaMalloc on the allocator's device and "
    "blocks reach allocscope's hooks") {
    g_hook_events.clear();
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    unsigned char* p = nullptr;
    {
        CachingAllocator allocator(1, cuda_runtime_segments(1), allocscope_block_events());
        p = static_cast<unsigned char*>(allocator.allocate(1000));
        REQUIRE(p != nullptr);
        std::memset(p, 0xab, 1000);  // sim_cudart serves host memory
        void* q = allocator.allocate(3000);
        CHECK(q == p + 1024);
        int current = -1;
        REQUIRE(cudaGetDevice(&current) == cudaSuccess);
        CHECK(current == 0);  // the caller's device is restored
        allocator.free(p);
        allocator.free(q);
        const std::vector<Event> expected = {
            {true, p, 1024, 1, nullptr},
            {true, q, 3072, 1, nullptr},
            {false, p, 0, -1, nullptr},
            {false, q, 0, -1, nullptr},
        };
        CHECK(g_hook_events == expected);
    }
    // p is the segment's base; the destructor gave the segment back.
    CHECK(cudaFree(p) == cudaErrorInvalidValue);
}

TEST_CASE(
    "through the CUDA runtime: a failed cudaMalloc releases the cache and is retried, and the "
    "request given up on reaches allocscope's oom hook") {
    REQUIRE(sim_limit_set == 0);  // a 64 MiB sim device
    g_hook_ooms.clear();
    CachingAllocator allocator(0, cuda_runtime_segments(0), allocscope_block_events());
    allocator.free(allocator.allocate(30 * MiB));  // a cached 30 MiB segment, too small below
    void* other = allocator.allocate(40 * MiB);    // 30 + 40 > 64: retried after the release
    CHECK(allocator.stats().num_alloc_retries == 1);
    CHECK(allocator.stats().reserved_bytes.current == 40 * MiB);
    CHECK(g_hook_ooms.empty());  // a retry that succeeds is no out-of-memory error
    CHECK_THROWS_AS(allocator.allocate(30 * MiB), OutOfMemoryError);
    CHECK(allocator.stats().num_ooms == 1);
    CHECK(g_hook_ooms == std::vector<HookOom>{{30 * MiB, 0, 0}});
    allocator.free(other);
}

TEST_CASE("through the CUDA runtime: a failure other than out-of-memory propagates unretried") {
    CachingAllocator allocator(0, cuda_runtime_segments(99), ignore_events());  // no device 99
    CHECK_THROWS_AS(allocator.allocate(1000), std::runtime_error);
    CHECK(allocator.stats().num_alloc_retries == 0);
    CHECK(allocator.stats().reserved_bytes.current == 0);
}
