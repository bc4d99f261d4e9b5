#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

#include "live_table.h"

using namespace allocscope;

namespace {

LiveRecord rec(uint64_t address, uint64_t size, uint64_t seq = 0) {
    LiveRecord r;
    r.address = address;
    r.size = size;
    r.seq = seq;
    return r;
}

}  // namespace

TEST_CASE("an empty table has nothing live and frees nothing") {
    LiveTable t;
    CHECK(t.live_bytes() == 0);
    CHECK(t.live_count() == 0);
    CHECK_FALSE(t.contains(0x1000));
    CHECK(t.snapshot().empty());
}

TEST_CASE("live bytes and count are the sum and number of live allocations") {
    LiveTable t;
    CHECK(t.insert(rec(0x1000, 100)));
    CHECK(t.insert(rec(0x2000, 250)));
    CHECK(t.insert(rec(0x3000, 1)));
    CHECK(t.live_bytes() == 351);
    CHECK(t.live_count() == 3);
    CHECK(t.contains(0x2000));

    LiveRecord removed;
    CHECK(t.remove(0x2000, &removed) == FreeOutcome::freed);
    CHECK(removed.address == 0x2000);
    CHECK(removed.size == 250);
    CHECK(t.live_bytes() == 101);
    CHECK(t.live_count() == 2);
    CHECK_FALSE(t.contains(0x2000));

    CHECK(t.remove(0x1000, nullptr) == FreeOutcome::freed);
    CHECK(t.remove(0x3000, nullptr) == FreeOutcome::freed);
    CHECK(t.live_bytes() == 0);
    CHECK(t.live_count() == 0);
    CHECK(t.unknown_frees() == 0);
    CHECK(t.double_frees() == 0);
    CHECK(t.replaced() == 0);
}

TEST_CASE("a free of an unknown pointer is counted and passed through") {
    LiveTable t;
    t.insert(rec(0x1000, 64));
    LiveRecord removed = rec(0xAAAA, 7);
    CHECK(t.remove(0xBEEF000, &removed) == FreeOutcome::unknown);
    CHECK(t.remove(0, &removed) == FreeOutcome::unknown);
    CHECK(t.unknown_frees() == 2);
    CHECK(t.double_frees() == 0);
    CHECK(removed.address == 0xAAAA);  // left untouched
    CHECK(t.live_bytes() == 64);
    CHECK(t.live_count() == 1);
}

TEST_CASE("a second free of the same address is counted as a double free") {
    LiveTable t;
    t.insert(rec(0x1000, 64));
    CHECK(t.remove(0x1000, nullptr) == FreeOutcome::freed);
    CHECK(t.remove(0x1000, nullptr) == FreeOutcome::double_free);
    CHECK(t.remove(0x1000, nullptr) == FreeOutcome::double_free);
    CHECK(t.double_frees() == 2);
    CHECK(t.unknown_frees() == 0);
    CHECK(t.live_bytes() == 0);
    CHECK(t.live_count() == 0);
}

TEST_CASE("an address reused after its free is tracked cleanly") {
    LiveTable t;
    for (int round = 0; round < 5; ++round) {
        CAPTURE(round);
        CHECK(t.insert(rec(0x7000, 100 + round, round)));
        CHECK(t.live_bytes() == 100 + round);
        LiveRecord removed;
        CHECK(t.remove(0x7000, &removed) == FreeOutcome::freed);
        CHECK(removed.size == 100 + round);
        CHECK(removed.seq == static_cast<uint64_t>(round));
    }
    CHECK(t.live_bytes() == 0);
    CHECK(t.live_count() == 0);
    CHECK(t.unknown_frees() == 0);
    CHECK(t.double_frees() == 0);
    CHECK(t.replaced() == 0);
}

TEST_CASE("an allocation over a live address replaces it and reports the missed free") {
    LiveTable t;
    CHECK(t.insert(rec(0x1000, 100, 1)));
    CHECK_FALSE(t.insert(rec(0x1000, 300, 2)));
    CHECK(t.replaced() == 1);
    CHECK(t.live_count() == 1);
    CHECK(t.live_bytes() == 300);
    LiveRecord removed;
    CHECK(t.remove(0x1000, &removed) == FreeOutcome::freed);
    CHECK(removed.seq == 2);
    CHECK(removed.size == 300);
    CHECK(t.live_bytes() == 0);
    CHECK(t.live_count() == 0);
}

TEST_CASE("a snapshot holds exactly the live records with all their fields") {
    LiveTable t;
    LiveRecord a;
    a.address = 0x10000;
    a.size = 4096;
    a.seq = 11;
    a.step = 3;
    a.stream = 0x55;
    a.stack = 9;
    a.layer = 4;
    a.phase = 2;
    a.tid = 1234;
    a.device = 1;
    a.memory = MemoryKind::managed;
    a.api = Api::cudaMallocManaged;
    t.insert(a);
    t.insert(rec(0x20000, 10, 12));
    t.insert(rec(0x30000, 20, 13));
    t.remove(0x20000, nullptr);

    std::vector<LiveRecord> snap = t.snapshot();
    REQUIRE(snap.size() == 2);
    std::sort(snap.begin(), snap.end(),
              [](const LiveRecord& x, const LiveRecord& y) { return x.address < y.address; });
    CHECK(snap[0].address == a.address);
    CHECK(snap[0].size == a.size);
    CHECK(snap[0].seq == a.seq);
    CHECK(snap[0].step == a.step);
    CHECK(snap[0].stream == a.stream);
    CHECK(snap[0].stack == a.stack);
    CHECK(snap[0].layer == a.layer);
    CHECK(snap[0].phase == a.phase);
    CHECK(snap[0].tid == a.tid);
    CHECK(snap[0].device == a.device);
    CHECK(snap[0].memory == a.memory);
    CHECK(snap[0].api == a.api);
    CHECK(snap[1].address == 0x30000);
    CHECK(snap[1].size == 20);
}

TEST_CASE("many addresses with interleaved frees survive rehashing and tombstones") {
    LiveTable t;
    constexpr uint64_t kCount = 50000;
    auto addr = [](uint64_t i) { return 0x7f0000000000ull + i * 256; };
    uint64_t bytes = 0;
    for (uint64_t i = 0; i < kCount; ++i) {
        REQUIRE(t.insert(rec(addr(i), i + 1, i)));
        bytes += i + 1;
        // Free every third address right away: the table fills with
        // tombstones that later inserts and rehashes must cope with.
        if (i % 3 == 0) {
            REQUIRE(t.remove(addr(i), nullptr) == FreeOutcome::freed);
            bytes -= i + 1;
        }
    }
    CHECK(t.live_bytes() == bytes);
    CHECK(t.live_count() == kCount - (kCount + 2) / 3);
    CHECK(t.snapshot().size() == t.live_count());

    for (uint64_t i = 0; i < kCount; ++i) {
        CAPTURE(i);
        REQUIRE(t.contains(addr(i)) == (i % 3 != 0));
    }
    // Reuse the freed addresses, then free everything.
    for (uint64_t i = 0; i < kCount; i += 3)
        REQUIRE(t.insert(rec(addr(i), 1, i)));
    CHECK(t.live_count() == kCount);
    for (uint64_t i = 0; i < kCount; ++i)
        REQUIRE(t.remove(addr(i), nullptr) == FreeOutcome::freed);
    CHECK(t.live_bytes() == 0);
    CHECK(t.live_count() == 0);
    CHECK(t.unknown_frees() == 0);
    CHECK(t.double_frees() == 0);
    CHECK(t.replaced() == 0);
    CHECK(t.snapshot().empty());
}

TEST_CASE("a free after its tombstone was dropped by a rehash counts as unknown, not double") {
    LiveTable t;
    t.insert(rec(0x1000, 8));
    CHECK(t.remove(0x1000, nullptr) == FreeOutcome::freed);
    // Enough inserts to rehash the table, dropping the tombstone.
    for (uint64_t i = 0; i < 100000; ++i)
        t.insert(rec(0x100000000ull + i * 64, 1));
    CHECK(t.remove(0x1000, nullptr) == FreeOutcome::unknown);
    CHECK(t.unknown_frees() == 1);
    CHECK(t.double_frees() == 0);
    CHECK(t.live_count() == 100000);
    CHECK(t.live_bytes() == 100000);
}

TEST_CASE("records stay with their addresses while the table shrinks and fills again") {
    LiveTable t;
    auto addr = [](uint64_t i) { return 0x7f0000000000ull + i * 512; };
    std::map<uint64_t, uint64_t> expected;  // address -> size
    for (uint64_t i = 0; i < 20000; ++i) {
        REQUIRE(t.insert(rec(addr(i), i + 1, i)));
        expected[addr(i)] = i + 1;
    }
    // Most freed: the next new addresses rehash the table smaller.
    for (uint64_t i = 0; i < 20000; ++i) {
        if (i % 100 == 0) continue;
        LiveRecord removed;
        REQUIRE(t.remove(addr(i), &removed) == FreeOutcome::freed);
        CHECK(removed.size == i + 1);
        expected.erase(addr(i));
    }
    for (uint64_t i = 20000; i < 60000; ++i) {
        REQUIRE(t.insert(rec(addr(i), 3 * i, i)));
        expected[addr(i)] = 3 * i;
        if (i % 2 == 0) {
            LiveRecord removed;
            REQUIRE(t.remove(addr(i), &removed) == FreeOutcome::freed);
            CHECK(removed.size == 3 * i);
            expected.erase(addr(i));
        }
    }
    std::map<uint64_t, uint64_t> seen;
    for (const LiveRecord& r : t.snapshot())
        seen[r.address] = r.size;
    CHECK(seen == expected);
    CHECK(t.live_count() == expected.size());
    for (const auto& [address, size] : expected) {
        LiveRecord removed;
        REQUIRE(t.remove(address, &removed) == FreeOutcome::freed);
        CHECK(removed.address == address);
        CHECK(removed.size == size);
    }
    CHECK(t.live_count() == 0);
    CHECK(t.live_bytes() == 0);
}

TEST_CASE("each live record keeps its note through frees of others, replacement and rehashes") {
    LiveTable t;
    // Notes by address, set as each record is inserted; every tenth freed
    // again, so tombstones pile up and both kinds of rehash run (in place
    // and to a new size, which packs the records and moves their indexes).
    std::map<uint64_t, uint64_t> want;
    for (uint64_t i = 0; i < 5000; ++i) {
        const uint64_t address = 0x100000 + i * 0x100;
        CHECK(t.insert(rec(address, 64, i)));
        CHECK(t.note(t.last_index()) == 0);  // a new record's
        t.set_note(t.last_index(), i * 7 + 1);
        want[address] = i * 7 + 1;
        if (i % 10 != 0) continue;
        const uint64_t gone = 0x100000 + (i / 2) * 0x100;
        if (!want.count(gone)) continue;
        LiveRecord removed;
        REQUIRE(t.remove(gone, &removed) == FreeOutcome::freed);
        // Still readable at the removed record's index until the next change.
        CHECK(t.note(t.last_index()) == want[gone]);
        want.erase(gone);
    }
    // Replacing a live record keeps its index and note until set.
    const uint64_t address = want.begin()->first;
    const uint64_t note = want.begin()->second;
    LiveRecord old;
    CHECK_FALSE(t.insert(rec(address, 128, 99999), &old));
    CHECK(t.note(t.last_index()) == note);
    // Every live record's note, read where a remove finds it.
    size_t checked = 0;
    for (const auto& [a, n] : want) {
        REQUIRE(t.remove(a, nullptr) == FreeOutcome::freed);
        CHECK(t.note(t.last_index()) == n);
        ++checked;
    }
    CHECK(checked == want.size());
    CHECK(t.live_count() == 0);
}
