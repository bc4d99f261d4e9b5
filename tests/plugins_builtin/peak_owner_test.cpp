// peak-owner on synthetic streams: the owners of live memory at the peak,
// by tag and by stack, exactly as they were at the peak however the stream
// goes on afterwards.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "plugin_test.h"

using allocscope::test::CollectedFinding;
using allocscope::test::Options;
using allocscope::test::Outcome;
using allocscope::test::plugin;
using allocscope::test::Stream;

namespace {

Outcome drive(const Stream& s, const Options& options = {}, int32_t rank = 0,
              const Stream* baseline = nullptr) {
    return allocscope::test::drive_plugin(baseline, s, options, rank, 4);
}

constexpr uint64_t KiB = 1024;
constexpr uint32_t B = ALLOCSCOPE_LEVEL_BLOCK;
constexpr uint32_t S = ALLOCSCOPE_LEVEL_SEGMENT;

std::vector<const CollectedFinding*> by(const Outcome& o, const char* what) {
    std::vector<const CollectedFinding*> out;
    for (const CollectedFinding& f : o.findings) {
        if (f.summary.find(std::string(" by ") + what + " at the ") != std::string::npos) {
            out.push_back(&f);
        }
    }
    return out;
}

// Peak 360 KiB of blocks after the fourth allocation; afterwards memory
// changes hands (a 150 KiB backward allocation) but never gets as high.
struct Scenario {
    Stream s;
    uint64_t a = 0, b = 0, c = 0, d = 0, e = 0;  // alloc seqs
    uint64_t free_a = 0, free_b = 0, free_c = 0;

    Scenario() {
        s.step(0);
        s.push("layers.0", "forward");
        a = s.alloc(0x1000, 100 * KiB, 1, B, 1);
        b = s.alloc(0x2000, 50 * KiB, 1, B, 2);
        s.pop();
        s.free(0xdead, 1);  // unknown: no effect, no snapshot
        s.push("layers.1", "forward");
        c = s.alloc(0x3000, 200 * KiB, 1, B, 1);
        s.pop();
        d = s.alloc(0x4000, 10 * KiB, 3, B, 0);  // untagged, another thread
        s.step(1);
        free_c = s.free(0x3000, 2);  // the backward thread
        s.push("layers.1", "backward", 2);
        e = s.alloc(0x3000, 150 * KiB, 2, B, 3);  // the address again
        s.pop(2);
        free_b = s.free(0x2000, 2);
        free_a = s.free(0x1000, 2);
    }
};

}  // namespace

TEST_CASE("the plugin struct: ABI, name, the event kinds it needs, one exported symbol") {
    const allocscope_plugin_v2* p = plugin();
    CHECK(p->struct_size == sizeof(allocscope_plugin_v2));
    CHECK(p->abi_version == ALLOCSCOPE_PLUGIN_V2_ABI_VERSION);
    CHECK(std::string(p->name) == "peak-owner");
    CHECK(p->event_mask == (ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_ALLOC) |
                            ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_FREE)));
    CHECK(allocscope::test::plugin_symbols_without_asan() ==
          std::vector<std::string>{"allocscope_plugin_v2"});
}

TEST_CASE("owners at the peak, by tag, phase and stack, with their biggest allocations") {
    Scenario sc;
    const Outcome o = drive(sc.s, {}, 3);
    CHECK(o.enabled);
    CHECK(o.logs.empty());
    REQUIRE(o.findings.size() == 8);
    for (const CollectedFinding& f : o.findings) {
        CHECK(f.plugin == "peak-owner");
        CHECK(f.rank == 3);
        CHECK(f.severity == ALLOCSCOPE_SEVERITY_INFO);
        CHECK(f.summary.find("block peak of 360.0 KiB (368640 B) (step 0, seq " +
                             std::to_string(sc.d) + ")") != std::string::npos);
    }
    const auto tags = by(o, "tag");
    REQUIRE(tags.size() == 3);
    CHECK(tags[0]->layer == "layers.1");
    CHECK(tags[0]->phase == "forward");
    CHECK(tags[0]->bytes == 200 * KiB);
    CHECK(tags[0]->count == 1);
    CHECK(tags[0]->summary.find("#1 by tag") == 0);
    CHECK(tags[0]->summary.find("layers.1 forward owns 200.0 KiB (204800 B) (55.6%) in 1 "
                                "allocations") != std::string::npos);
    REQUIRE(tags[0]->evidence.size() == 1);
    CHECK(tags[0]->evidence[0].alloc_seq == sc.c);
    CHECK(tags[0]->evidence[0].free_seq == sc.free_c);  // freed after the peak
    CHECK(tags[1]->layer == "layers.0");
    CHECK(tags[1]->bytes == 150 * KiB);
    CHECK(tags[1]->count == 2);
    REQUIRE(tags[1]->evidence.size() == 2);
    CHECK(tags[1]->evidence[0].alloc_seq == sc.a);  // biggest first
    CHECK(tags[1]->evidence[0].size == 100 * KiB);
    CHECK(tags[1]->evidence[0].free_seq == sc.free_a);
    CHECK(tags[1]->evidence[1].alloc_seq == sc.b);
    CHECK(tags[1]->evidence[1].stack_id == 2);
    CHECK(tags[2]->layer.empty());
    CHECK(tags[2]->bytes == 10 * KiB);
    CHECK(tags[2]->summary.find("(untagged) owns") != std::string::npos);
    CHECK(tags[2]->evidence[0].free_seq == 0);  // alive at the end

    const auto phases = by(o, "phase");
    REQUIRE(phases.size() == 2);
    CHECK(phases[0]->layer.empty());  // every layer's
    CHECK(phases[0]->phase == "forward");
    CHECK(phases[0]->bytes == 350 * KiB);  // a, b and c
    CHECK(phases[0]->count == 3);
    CHECK(phases[0]->summary.find("forward (every layer) owns 350.0 KiB (358400 B) (97.2%)") !=
          std::string::npos);
    REQUIRE(phases[0]->evidence.size() == 3);
    CHECK(phases[0]->evidence[0].alloc_seq == sc.c);
    CHECK(phases[0]->evidence[2].alloc_seq == sc.b);
    CHECK(phases[1]->phase.empty());
    CHECK(phases[1]->bytes == 10 * KiB);
    CHECK(phases[1]->summary.find("(no phase) (every layer)") != std::string::npos);

    const auto stacks = by(o, "stack");
    REQUIRE(stacks.size() == 3);
    CHECK(stacks[0]->bytes == 300 * KiB);  // stack 1: a and c
    CHECK(stacks[0]->count == 2);
    CHECK(stacks[0]->layer == "layers.1");  // its biggest allocation's tag
    CHECK(stacks[0]->summary.find("stack 1 (biggest: layers.1 forward) owns 300.0 KiB") !=
          std::string::npos);
    REQUIRE(stacks[0]->evidence.size() == 2);
    CHECK(stacks[0]->evidence[0].alloc_seq == sc.c);
    CHECK(stacks[0]->evidence[1].alloc_seq == sc.a);
    CHECK(stacks[0]->evidence[1].layer == "layers.0");
    CHECK(stacks[1]->bytes == 50 * KiB);
    CHECK(stacks[2]->bytes == 10 * KiB);
    CHECK(stacks[2]->summary.find("no stack (biggest: (untagged))") != std::string::npos);
}

TEST_CASE("top: how many owners of each kind") {
    Scenario sc;
    const Outcome o = drive(sc.s, {{"top", "1"}});
    REQUIRE(o.findings.size() == 3);
    CHECK(by(o, "tag").at(0)->bytes == 200 * KiB);
    CHECK(by(o, "phase").at(0)->bytes == 350 * KiB);
    CHECK(by(o, "stack").at(0)->bytes == 300 * KiB);
    CHECK(drive(sc.s, {{"top", "2"}}).findings.size() == 6);
    CHECK(drive(sc.s, {{"top", "50"}}).findings.size() == 8);
}

TEST_CASE("a later, higher peak replaces the first; an equal one does not") {
    for (auto [size, peak] : {std::pair<uint64_t, uint64_t>{210 * KiB, 360 * KiB},  // 360: equal
                              {211 * KiB, 361 * KiB}}) {
        CAPTURE(size);
        Scenario sc;
        sc.s.push("optimizer", "optimizer");
        // Live now: d (10) + e (150); + size.
        sc.s.alloc(0x9000, size - 10 * KiB, 1, B, 4);
        sc.s.pop();
        const Outcome o = drive(sc.s);
        const auto tags = by(o, "tag");
        REQUIRE(!tags.empty());
        CHECK(tags[0]->summary.find("block peak of " + std::to_string(peak / KiB) + ".0 KiB") !=
              std::string::npos);
        if (peak == 360 * KiB) {
            CHECK(tags[0]->layer == "layers.1");
            CHECK(tags[0]->phase == "forward");
        } else {
            // Snapshotted at finish: the stream ends at the new peak.
            REQUIRE(tags.size() == 3);
            CHECK(tags[0]->layer == "optimizer");
            CHECK(tags[0]->bytes == 201 * KiB);
            CHECK(tags[1]->layer == "layers.1");
            CHECK(tags[1]->phase == "backward");
            CHECK(tags[1]->bytes == 150 * KiB);
            CHECK(tags[1]->evidence[0].alloc_seq == sc.e);
            CHECK(tags[2]->bytes == 10 * KiB);
            const auto phases = by(o, "phase");
            REQUIRE(phases.size() == 3);
            CHECK(phases[0]->phase == "optimizer");
            CHECK(phases[1]->phase == "backward");
            CHECK(phases[2]->phase.empty());
        }
    }
}

TEST_CASE("a climb with frees on the way: the snapshot is the state at the peak exactly") {
    // Each round allocates two blocks and frees the older: live bytes climb
    // by one block a round, and every free follows a new peak.
    Stream s;
    std::vector<uint64_t> addresses;
    uint64_t next = 0x100000;
    for (int round = 0; round < 50; ++round) {
        const std::string layer = "layers." + std::to_string(round % 5);
        s.push(layer.c_str(), "forward");
        for (int k = 0; k < 2; ++k) {
            addresses.push_back(next);
            s.alloc(next, 4096, 1, B, uint32_t(round % 5 + 1));
            next += 0x1000;
        }
        s.pop();
        s.free(addresses[size_t(round)]);
    }
    const Outcome o = drive(s, {{"top", "5"}});
    // Peak: after the last round's second allocation, 51 blocks: the
    // frees took blocks 0..48 (by allocation order), leaving 49..99 but
    // the last free (of 49) came after the peak. Blocks 49..99 by layer:
    // block j was allocated in round j / 2.
    std::map<std::string, uint64_t> expected;
    for (int j = 49; j < 100; ++j)
        expected["layers." + std::to_string((j / 2) % 5)] += 4096;
    const auto tags = by(o, "tag");
    REQUIRE(tags.size() == 5);
    uint64_t total = 0;
    for (const CollectedFinding* f : tags) {
        CAPTURE(f->layer);
        CHECK(f->bytes == expected[f->layer]);
        total += f->bytes;
    }
    CHECK(total == 51 * 4096);
}

TEST_CASE("segments are reported as their own level, when there are any") {
    Scenario sc;
    {
        const Outcome o = drive(sc.s);
        for (const CollectedFinding& f : o.findings)
            CHECK(f.summary.find("segment peak") == std::string::npos);
    }
    Stream& s = sc.s;
    s.push("layers.0", "forward");
    s.alloc(0x7000000000, 2 << 20, 1, S, 9);
    s.alloc(0x7000200000, 20 << 20, 1, S, 9);
    s.pop();
    s.free(0x7000000000, 1, S);
    s.free(0x1000, 1, S);  // a segment free at a block's address: unknown segment
    const Outcome o = drive(s);
    std::vector<const CollectedFinding*> segments;
    for (const CollectedFinding& f : o.findings) {
        if (f.summary.find("segment peak of 22.0 MiB (23068672 B)") != std::string::npos) {
            segments.push_back(&f);
        }
    }
    REQUIRE(segments.size() == 3);  // one tag, one phase, one stack
    for (const CollectedFinding* f : segments) {
        CHECK(f->bytes == 22u << 20);
        CHECK(f->count == 2);
        REQUIRE(f->evidence.size() == 2);
        CHECK(f->evidence[0].size == 20u << 20);
        CHECK(f->evidence[1].free_seq != 0);
    }
    CHECK(o.findings.size() == 11);  // and the blocks' eight, unchanged
}

TEST_CASE("baseline mode: only the run's stream is measured") {
    Stream baseline;
    baseline.push("huge", "forward");
    baseline.alloc(0x1000, 1 << 30);
    baseline.pop();
    Scenario sc;
    const Outcome o = drive(sc.s, {}, 0, &baseline);
    REQUIRE(o.findings.size() == 8);
    for (const CollectedFinding& f : o.findings)
        CHECK(f.layer != "huge");
}

TEST_CASE("a stream without allocations has no owners") {
    Stream s;
    s.step(0);
    s.push("layers.0", "forward");
    s.free(0x1234);
    s.pop();
    const Outcome o = drive(s);
    CHECK(o.enabled);
    CHECK(o.findings.empty());
}

TEST_CASE("an invalid option disables the plugin with one message naming it") {
    Scenario sc;
    for (const char* value : {"0", "ten", "-1", "5K"}) {
        CAPTURE(value);
        const Outcome o = drive(sc.s, {{"top", value}});
        CHECK(!o.enabled);
        CHECK(o.failed_call == "init");
        CHECK(o.findings.empty());
        REQUIRE(o.logs.size() == 1);
        CHECK(o.logs[0].find(std::string("peak-owner: init: option top=") + value) == 0);
    }
}
