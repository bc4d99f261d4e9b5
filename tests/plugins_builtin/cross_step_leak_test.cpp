// cross-step-leak on synthetic streams: a training loop whose live memory at
// each step's start is the same once the first step has created its lazy
// state, with injected leaks (one layer's forward, the optimizer's state,
// one rank only) that the plugin must attribute by (layer, phase, stack).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "plugin_test.h"

using allocscope::test::CollectedFinding;
using allocscope::test::layer;
using allocscope::test::Options;
using allocscope::test::Outcome;
using allocscope::test::plugin;
using allocscope::test::Stream;

namespace {

Outcome drive(const Stream& s, const Options& options = {}, int32_t rank = 0,
              const Stream* baseline = nullptr) {
    return allocscope::test::drive_plugin(baseline, s, options, rank, 2);
}

constexpr uint64_t kAct = 64 * 1024;
constexpr uint64_t kState = 32 * 1024;
constexpr uint64_t kLeak = 32 * 1024;
constexpr uint64_t kExtra = 16 * 1024;
constexpr uint32_t kLeakStack = 7;
constexpr uint32_t kStateStack = 21;
constexpr uint32_t kExtraStack = 22;

// Parameters at init; per step a forward saving one activation per layer,
// a backward (on thread 2) freeing them in reverse and making gradients,
// an optimizer freeing the gradients and creating its state at step 0.
// Addresses are reused LIFO.
struct Loop {
    Stream& s;
    int layers = 3;
    uint32_t level = ALLOCSCOPE_LEVEL_BLOCK;
    // Injections.
    bool leak = false;            // layers.1 forward keeps one block a step (stack 7)
    bool alternate = false;       // ... from stacks 11 and 12 in turn
    bool grow_optimizer = false;  // every step one more state block per layer
    bool unknown_frees = false;   // a free of an address never allocated, every step

    std::vector<uint64_t> free_addresses;
    uint64_t next_address = 0x100000;
    std::vector<uint64_t> act, grad, state;

    explicit Loop(Stream& stream, uint32_t at_level = ALLOCSCOPE_LEVEL_BLOCK)
        : s(stream), level(at_level) {
        for (int i = 0; i < layers; ++i) {
            s.push(layer(i).c_str(), "init");
            alloc(128 * 1024, 1);
            s.pop();
        }
    }

    uint64_t alloc(uint64_t size, uint32_t tid, std::optional<uint32_t> stack = std::nullopt) {
        uint64_t a;
        if (!free_addresses.empty()) {
            a = free_addresses.back();
            free_addresses.pop_back();
        } else {
            a = next_address;
            next_address += 0x100000;
        }
        s.alloc(a, size, tid, level, stack);
        return a;
    }
    void release(uint64_t a, uint32_t tid) {
        s.free(a, tid, level);
        free_addresses.push_back(a);
    }

    void step(uint64_t number) {
        s.step(number);
        for (int i = 0; i < layers; ++i) {
            s.push(layer(i).c_str(), "forward");
            act.push_back(alloc(kAct, 1));
            if (i == 1 && leak) alloc(kLeak, 1, kLeakStack);
            if (i == 1 && alternate) alloc(kLeak, 1, number % 2 ? 12u : 11u);
            s.pop();
        }
        for (int i = layers - 1; i >= 0; --i) {
            s.push(layer(i).c_str(), "backward", 2);
            release(act.back(), 2);
            act.pop_back();
            grad.push_back(alloc(kAct / 2, 2));
            if (unknown_frees) s.free(0xdead0000 + number, 2, level);
            s.pop(2);
        }
        s.push("optimizer", "optimizer");
        for (int i = 0; i < layers; ++i) {
            s.push(layer(i).c_str(), nullptr);
            if (state.size() <= size_t(i))
                state.push_back(alloc(kState, 1, kStateStack));  // lazily
            if (grow_optimizer) alloc(kExtra, 1, kExtraStack);
            s.pop();
        }
        for (uint64_t g : grad)
            release(g, 1);
        grad.clear();
        s.pop();
    }

    void run(int steps) {
        for (int k = 0; k < steps; ++k)
            step(uint64_t(k));
    }
};

}  // namespace

TEST_CASE("the plugin struct: ABI, name, the event kinds it needs, one exported symbol") {
    const allocscope_plugin_v2* p = plugin();
    CHECK(p->struct_size == sizeof(allocscope_plugin_v2));
    CHECK(p->abi_version == ALLOCSCOPE_PLUGIN_V2_ABI_VERSION);
    CHECK(std::string(p->name) == "cross-step-leak");
    CHECK(p->event_mask == (ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_ALLOC) |
                            ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_FREE) |
                            ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_STEP)));
    CHECK(allocscope::test::plugin_symbols_without_asan() ==
          std::vector<std::string>{"allocscope_plugin_v2"});
}

TEST_CASE("a clean loop: the first step's lazy state is not a leak") {
    Stream s;
    Loop loop(s);
    loop.unknown_frees = true;  // ignored, not subtracted from anything
    loop.run(8);
    const Outcome o = drive(s);
    CHECK(o.enabled);
    CHECK(o.logs.empty());
    CHECK(o.findings.empty());
}

TEST_CASE("a block kept every step by one layer's forward is attributed to its stack") {
    Stream s;
    Loop loop(s);
    loop.leak = true;
    loop.run(6);
    const Outcome o = drive(s, {}, 1);
    REQUIRE(o.findings.size() == 1);
    const CollectedFinding& f = o.findings[0];
    CHECK(f.plugin == "cross-step-leak");
    CHECK(f.rank == 1);
    CHECK(f.severity == ALLOCSCOPE_SEVERITY_WARNING);
    CHECK(f.layer == "layers.1");
    CHECK(f.phase == "forward");
    // Sampled at the starts of steps 0..5: five growths of one block (step
    // 5's block comes after the last sample).
    CHECK(f.bytes == 5 * kLeak);
    CHECK(f.count == 5);
    CHECK(f.summary.find("(stack 7)") != std::string::npos);
    CHECK(f.summary.find("grew at 5 consecutive step changes") != std::string::npos);
    CHECK(f.summary.find("0 B at the start of step 0 to 160.0 KiB (163840 B) at the start of "
                         "step 5") != std::string::npos);
    REQUIRE(f.evidence.size() == 5);
    for (size_t k = 0; k < 5; ++k) {
        CAPTURE(k);
        CHECK(f.evidence[k].size == kLeak);
        CHECK(f.evidence[k].step == 4 - k);  // newest first
        CHECK(f.evidence[k].stack_id == kLeakStack);
        CHECK(f.evidence[k].layer == "layers.1");
        CHECK(f.evidence[k].free_seq == 0);
    }
}

TEST_CASE("optimizer state that grows every step: one finding per layer") {
    Stream s;
    Loop loop(s);
    loop.grow_optimizer = true;
    loop.run(5);
    const Outcome o = drive(s);
    REQUIRE(o.findings.size() == 3);
    for (int i = 0; i < 3; ++i) {
        const CollectedFinding& f = o.findings[size_t(i)];
        CAPTURE(i);
        CHECK(f.layer == layer(i));
        CHECK(f.phase == "optimizer");
        CHECK(f.bytes == 4 * kExtra);  // the lazy moments have their own stack
        CHECK(f.count == 4);
        CHECK(f.summary.find("(stack 22)") != std::string::npos);
        REQUIRE(f.evidence.size() == 4);
        CHECK(f.evidence[0].size == kExtra);
        CHECK(f.evidence[0].stack_id == kExtraStack);
    }
}

TEST_CASE("a leak on one rank only is found on that rank only") {
    for (int rank : {0, 1}) {
        CAPTURE(rank);
        Stream s;
        Loop loop(s);
        loop.leak = rank == 1;
        loop.run(5);
        const Outcome o = drive(s, {}, rank);
        if (rank == 0) {
            CHECK(o.findings.empty());
        } else {
            REQUIRE(o.findings.size() == 1);
            CHECK(o.findings[0].rank == 1);
            CHECK(o.findings[0].bytes == 4 * kLeak);
        }
    }
}

TEST_CASE("steps: how many consecutive growing step changes make a finding") {
    Stream s;
    Loop loop(s);
    loop.leak = true;
    loop.run(4);  // samples at steps 0..3: three growths
    for (auto [steps, found] : {std::pair<const char*, size_t>{"2", 1}, {"3", 1}, {"4", 0}}) {
        CAPTURE(steps);
        CHECK(drive(s, {{"steps", steps}}).findings.size() == found);
    }
    // With steps=1 the lazy state's one growth is reported too: each
    // layer's optimizer moments, born in step 0.
    const Outcome o = drive(s, {{"steps", "1"}});
    REQUIRE(o.findings.size() == 4);
    CHECK(o.findings[0].layer == "layers.0");
    CHECK(o.findings[0].phase == "optimizer");
    CHECK(o.findings[0].bytes == kState);
    CHECK(o.findings[0].summary.find("grew at 1 consecutive") != std::string::npos);
}

TEST_CASE("min_growth: growth over the run below it is not reported") {
    Stream s;
    Loop loop(s);
    loop.leak = true;
    loop.run(6);  // +160 KiB over five step changes
    CHECK(drive(s, {{"min_growth", "160KiB"}}).findings.size() == 1);
    CHECK(drive(s, {{"min_growth", "163841"}}).findings.empty());
}

TEST_CASE("growth that stops, or falls back, is not a run") {
    Stream s;
    Loop loop(s);
    std::vector<uint64_t> held;
    for (int k = 0; k < 8; ++k) {
        loop.step(uint64_t(k));
        s.push("layers.2", "forward");
        if (k == 2 && !held.empty()) {  // falls back after two growths
            s.free(held.back());
            held.pop_back();
        } else {
            held.push_back(0x70000000 + uint64_t(k) * 0x10000);
            s.alloc(held.back(), 4096);
        }
        s.pop();
    }
    // Runs: steps 1-2 (two), then 4-7 (four, the longest).
    const Outcome o = drive(s, {{"steps", "4"}});
    REQUIRE(o.findings.size() == 1);
    CHECK(o.findings[0].summary.find("grew at 4 consecutive step changes, 4.00 KiB (4096 B) "
                                     "at the start of step 3") != std::string::npos);
    CHECK(o.findings[0].bytes == 4 * 4096);
    CHECK(drive(s, {{"steps", "5"}}).findings.empty());
}

TEST_CASE("a leak from call sites in turn is reported once for its tag") {
    Stream s;
    Loop loop(s);
    loop.alternate = true;
    loop.run(6);
    const Outcome o = drive(s);
    REQUIRE(o.findings.size() == 1);
    CHECK(o.findings[0].layer == "layers.1");
    CHECK(o.findings[0].summary.find("(all stacks)") != std::string::npos);
    CHECK(o.findings[0].bytes == 5 * kLeak);
    REQUIRE(o.findings[0].evidence.size() == 5);
    CHECK(o.findings[0].evidence[0].stack_id == 11);  // newest first: step 4's, an even step
    CHECK(o.findings[0].evidence[1].stack_id == 12);
}

TEST_CASE("untagged leaks are attributed to no tag") {
    Stream s;
    Loop loop(s);
    for (int k = 0; k < 5; ++k) {
        loop.step(uint64_t(k));
        s.alloc(0x90000000 + uint64_t(k) * 0x1000, 512, 5, ALLOCSCOPE_LEVEL_BLOCK, 0u);
    }
    const Outcome o = drive(s);
    REQUIRE(o.findings.size() == 1);
    CHECK(o.findings[0].layer.empty());
    CHECK(o.findings[0].phase.empty());
    CHECK(o.findings[0].summary.find("(untagged) (stack 0)") == 0);
    CHECK(o.findings[0].bytes == 4 * 512);
}

TEST_CASE("levels: segments only when the stream has no block events") {
    {
        // A caching allocator's segments may grow while its blocks do not.
        Stream s;
        Loop loop(s);
        for (int k = 0; k < 5; ++k) {
            loop.step(uint64_t(k));
            s.push("layers.0", "forward");
            s.alloc(0x7000000000 + uint64_t(k) * 0x200000, 2 << 20, 1, ALLOCSCOPE_LEVEL_SEGMENT);
            s.pop();
        }
        CHECK(drive(s).findings.empty());
    }
    {
        // Every tensor a cudaMalloc: segments are what there is.
        Stream s;
        Loop loop(s, ALLOCSCOPE_LEVEL_SEGMENT);
        loop.leak = true;
        loop.run(5);
        const Outcome o = drive(s);
        REQUIRE(o.findings.size() == 1);
        CHECK(o.findings[0].summary.find("live segment bytes") != std::string::npos);
        CHECK(o.findings[0].bytes == 4 * kLeak);
    }
    {
        // A segment free at a leaked block's address frees no block.
        Stream s;
        Loop loop(s);
        loop.leak = true;
        for (int k = 0; k < 5; ++k) {
            loop.step(uint64_t(k));
            s.free(0x100000 * uint64_t(k + 1), 1, ALLOCSCOPE_LEVEL_SEGMENT);
        }
        REQUIRE(drive(s).findings.size() == 1);
        CHECK(drive(s).findings[0].bytes == 4 * kLeak);
    }
}

TEST_CASE("baseline mode: only the run's stream is measured") {
    Stream leaky, clean;
    Loop a(leaky), b(clean);
    a.leak = true;
    a.run(5);
    b.run(5);
    CHECK(drive(clean, {}, 0, &leaky).findings.empty());
    REQUIRE(drive(leaky, {}, 0, &clean).findings.size() == 1);
}

TEST_CASE("an invalid option disables the plugin with one message naming it") {
    Stream s;
    Loop loop(s);
    loop.leak = true;
    loop.run(5);
    for (auto [key, value] : {std::pair<const char*, const char*>{"steps", "0"},
                              {"steps", "three"},
                              {"steps", "-2"},
                              {"min_growth", "a lot"}}) {
        CAPTURE(key);
        CAPTURE(value);
        const Outcome o = drive(s, {{key, value}});
        CHECK(!o.enabled);
        CHECK(o.failed_call == "init");
        CHECK(o.findings.empty());
        REQUIRE(o.logs.size() == 1);
        CHECK(o.logs[0].find(std::string("cross-step-leak: init: option ") + key + "=" + value) ==
              0);
    }
}
