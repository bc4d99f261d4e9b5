// The analysis streamed from a trace's file (analyze/trace_reader.h,
// TraceStream: the events read again pass after pass, never all held) is
// the analysis of the loaded trace, field by field: on every recorded trace
// of the corpus, with the default and with small timelines, and on traces
// cut short, corrupt (unreadable where that is before any event), or grown
// between passes.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "analysis.h"
#include "diff.h"
#include "streamed.h"
#include "support.h"
#include "trace_builder.h"
#include "trace_reader.h"
#include "trace_writer.h"

using namespace allocscope;
using namespace allocscope::test;

namespace {

std::vector<fs::path> corpus_traces() {
    std::vector<fs::path> out;
    for (const auto& e : fs::recursive_directory_iterator(env("CORPUS_DIR"))) {
        if (e.path().extension() == ".trace") out.push_back(e.path());
    }
    std::sort(out.begin(), out.end());
    return out;
}

// A copy of `from` at `to` with its first `bytes` bytes only.
void copy_prefix(const fs::path& from, const fs::path& to, uint64_t bytes) {
    std::ifstream in(from, std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    data.resize(std::min<uint64_t>(bytes, data.size()));
    std::ofstream(to, std::ios::binary | std::ios::trunc) << data;
}

}  // namespace

TEST_CASE("every corpus trace streams to the analysis, step memory and measure it loads to") {
    const std::vector<fs::path> traces = corpus_traces();
    REQUIRE(traces.size() >= 10);
    AnalysisOptions small;
    small.timeline_points = 37;
    small.timeline_layers = 3;
    small.oom_moments = 1;
    small.top_sites = 2;
    for (const fs::path& p : traces) {
        const Trace trace = load_trace(p.string());
        CHECK(!trace.events.empty());
        analyzed(trace);
        analyzed(trace, small);
        measured(trace);
        TraceStream stream(p.string());
        CHECK(step_memory(stream) == step_memory(trace));
        CHECK(stream.tables().strings == trace.strings);
        CHECK(stream.tables().stacks == trace.stacks);
        CHECK(stream.tables().footer.has_value() == trace.footer.has_value());
    }
}

TEST_CASE("analyze gives every corpus trace's step memory from its own passes") {
    for (const fs::path& p : corpus_traces()) {
        CAPTURE(p);
        const Trace trace = load_trace(p.string());
        const std::vector<StepMemory> expected = step_memory(trace);
        for (bool from_file : {true, false}) {
            std::optional<TraceStream> stream;
            if (from_file)
                stream.emplace(p.string());
            else
                stream.emplace(trace);
            std::vector<StepMemory> steps;
            const TraceAnalysis a = analyze(*stream, {}, &steps);
            CHECK(steps == expected);
            check_same_analysis(a, analyze(trace));
        }
    }
}

TEST_CASE("an invalid event inside a block ends the trace after the block's events before it") {
    TempDir t;
    const fs::path path = t.dir / "backwards.trace";
    {
        TraceWriter w;
        std::string error;
        REQUIRE(w.open(path.string(), TraceHeader{}, error));
        Event e;
        for (uint64_t seq : {1, 2, 3, 2}) {  // one block: the fourth goes backwards
            e.seq = seq;
            w.event(e);
        }
        w.close({});
    }
    const Trace loaded = load_trace(path.string());
    REQUIRE(loaded.corrupt);
    CHECK(loaded.events.size() == 3);
    CHECK(loaded.truncation_message.find("sequence goes backwards") != std::string::npos);
    TraceStream stream(path.string());
    for (int pass = 0; pass < 2; ++pass) {  // the first pass counts, the second reads again
        std::vector<uint64_t> seqs;
        stream.for_each([&](const Event& e) { seqs.push_back(e.seq); });
        CHECK(seqs == std::vector<uint64_t>{1, 2, 3});
    }
    CHECK(stream.tables().corrupt);
    CHECK(stream.tables().truncation_message == loaded.truncation_message);
}

TEST_CASE("a trace cut short or corrupt streams its prefix, with the loaded trace's warning") {
    TempDir t;
    const fs::path whole = corpus_traces().front();
    const uint64_t size = fs::file_size(whole);
    const fs::path cut = t.dir / "cut.trace";
    copy_prefix(whole, cut, size * 7 / 10);
    const Trace cut_trace = load_trace(cut.string());
    REQUIRE(cut_trace.truncated);
    REQUIRE(!cut_trace.corrupt);
    CHECK(analyzed(cut_trace).truncated);

    const fs::path corrupt = t.dir / "corrupt.trace";
    fs::copy_file(whole, corrupt);
    {
        std::fstream f(corrupt, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(std::streamoff(size / 2));
        char c = 0;
        f.seekg(std::streamoff(size / 2));
        f.get(c);
        f.seekp(std::streamoff(size / 2));
        f.put(char(~c));
    }
    const Trace corrupt_trace = load_trace(corrupt.string());
    REQUIRE(corrupt_trace.corrupt);
    const TraceAnalysis a = analyzed(corrupt_trace);
    CHECK(a.truncated);
    CHECK(a.truncation_message == corrupt_trace.truncation_message);
}

TEST_CASE("a corrupt record before any event makes the trace unreadable, streamed as loaded") {
    TempDir t;
    const fs::path whole = corpus_traces().front();
    const fs::path path = t.dir / "unreadable.trace";
    fs::copy_file(whole, path);
    {
        // The first record's first payload byte: its checksum fails.
        const auto at = std::streamoff(kTraceHeaderSize + kRecordHeaderSize);
        std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
        char c = 0;
        f.seekg(at);
        f.get(c);
        f.seekp(at);
        f.put(char(~c));
    }
    CHECK_THROWS_AS(load_trace(path.string()), TraceError);
    TraceStream stream(path.string());  // the header reads
    CHECK_THROWS_AS(analyze(stream), TraceError);
    CHECK_FALSE(stream.counted());
    // A pass after it starts afresh and throws the same.
    CHECK_THROWS_AS(trace_shape(stream), TraceError);
    CHECK_THROWS_AS(step_memory(stream), TraceError);
    CHECK_FALSE(stream.counted());
}

TEST_CASE("later passes give the events the first pass counted, though the file has grown") {
    TempDir t;
    const fs::path whole = corpus_traces().front();
    const fs::path path = t.dir / "growing.trace";
    copy_prefix(whole, path, fs::file_size(whole) / 2);
    const Trace half = load_trace(path.string());
    TraceStream stream(path.string());
    const TraceShape shape = trace_shape(stream);  // the first pass: half the file
    CHECK(stream.size() == half.events.size());
    fs::copy_file(whole, path, fs::copy_options::overwrite_existing);
    check_same_analysis(analyze(stream), analyze(half));
    CHECK(step_memory(stream, shape) == step_memory(half));
    CHECK(stream.size() == half.events.size());
}

TEST_CASE("a later pass over a file that lost events since the first throws TraceError") {
    TempDir t;
    const fs::path whole = corpus_traces().front();
    const fs::path path = t.dir / "shrinking.trace";
    fs::copy_file(whole, path);
    TraceStream stream(path.string());
    trace_shape(stream);
    copy_prefix(whole, path, fs::file_size(whole) / 2);
    CHECK_THROWS_AS(analyze(stream), TraceError);
}

TEST_CASE("each timeline sample names its columns' largest live allocations, the older first") {
    // Many allocations of few sizes (equal sizes are ordered by age), frees
    // at random and of the largest live one, some allocations at an address
    // still live (its free never recorded), rises and falls of the total,
    // so that what a group keeps of its largest runs out between samples
    // and is found again, and a sample's moment is taken over by a later
    // one after its groups changed. Stretches of several sizes: few
    // samples (many moments each) to one per few events.
    struct Variant {
        uint64_t seed;
        size_t points;
    };
    for (const Variant v :
         {Variant{33, 97}, Variant{5, 7}, Variant{8, 401}, Variant{21, 1500}, Variant{64, 31}}) {
        CAPTURE(v.seed);
        CAPTURE(v.points);
        TempDir t;
        TraceBuilder b;
        std::mt19937_64 rng(v.seed);
        std::vector<std::pair<uint64_t, uint64_t>> live;  // address, size
        uint64_t next = 0x100000;
        for (uint64_t step = 1; step <= 30; ++step) {
            b.step(step);
            const uint64_t frees = 3 + rng() % 4;  // of 10: the total rises or falls
            for (int l = 0; l < 6; ++l) {
                b.push("model.layers." + std::to_string(l), l % 2 ? "forward" : "backward");
                for (int k = 0; k < 25; ++k) {
                    const uint64_t r = rng() % 10;
                    if (!live.empty() && r < frees - 2) {
                        const size_t at = rng() % live.size();
                        b.block_free(live[at].first);
                        live.erase(live.begin() + std::ptrdiff_t(at));
                    } else if (!live.empty() && r < frees) {
                        auto largest = std::max_element(
                            live.begin(), live.end(),
                            [](const auto& x, const auto& y) { return x.second < y.second; });
                        b.block_free(largest->first);
                        live.erase(largest);
                    } else if (!live.empty() && r == 9 && rng() % 4 == 0) {
                        const size_t at = rng() % live.size();  // its free never recorded
                        live[at].second = 512 * (1 + rng() % 6);
                        b.block(live[at].first, live[at].second);
                    } else {
                        const uint64_t size = 512 * (1 + rng() % 6);
                        b.block(next, size);
                        live.push_back({next, size});
                        next += 0x1000;
                    }
                }
                b.pop();
            }
        }
        const Trace trace = load_trace(b.write(t / "rank0.trace"));
        AnalysisOptions options;
        options.timeline_points = v.points;
        options.timeline_layers = 3;  // the others folded into "(other)"
        options.timeline_allocations = 3;
        const TraceAnalysis a = analyze(trace, options);
        const Timeline& tl = a.timeline;
        REQUIRE(tl.layers.size() == 4);
        REQUIRE(tl.layers.back() == "(other)");
        auto column_of = [&](const std::string& layer) {
            const auto it = std::find(tl.layers.begin(), tl.layers.end(), layer_group(layer));
            return it == tl.layers.end() ? tl.layers.size() - 1 : size_t(it - tl.layers.begin());
        };
        // The live allocations replayed by hand: address -> (size, seq, layer).
        struct Alive {
            uint64_t size = 0, seq = 0;
            uint32_t layer = 0;
        };
        std::map<uint64_t, Alive> alive;
        size_t point = 0, full = 0;  // columns with 3 to name
        for (const Event& e : trace.events) {
            if (e.kind == EventKind::alloc) alive[e.address] = {e.size, e.seq, e.layer};
            if (e.kind == EventKind::free) alive.erase(e.address);
            if (point == tl.points.size() || tl.points[point].seq != e.seq) continue;
            const TimelinePoint& p = tl.points[point++];
            std::vector<std::vector<std::pair<uint64_t, uint64_t>>> by_column(tl.layers.size());
            for (const auto& [address, l] : alive)
                by_column[column_of(trace.str(l.layer))].push_back({l.size, l.seq});
            REQUIRE(p.largest.size() == tl.layers.size());
            for (size_t c = 0; c < by_column.size(); ++c) {
                auto& want = by_column[c];
                std::sort(want.begin(), want.end(), [](const auto& x, const auto& y) {
                    return x.first != y.first ? x.first > y.first : x.second < y.second;
                });
                if (want.size() > 3) want.resize(3);
                std::vector<std::pair<uint64_t, uint64_t>> got;
                for (uint32_t index : p.largest[c])
                    got.push_back({tl.allocations.at(index).size, tl.allocations.at(index).seq});
                CHECK(got == want);
                full += want.size() == 3;
            }
        }
        CHECK(point == tl.points.size());
        CHECK(full > tl.points.size());
        // Each allocation named once, with what its allocation says.
        std::map<uint64_t, uint64_t> size_of_seq;
        for (const Event& e : trace.events)
            if (e.kind == EventKind::alloc) size_of_seq[e.seq] = e.size;
        std::set<uint64_t> named;
        for (const TimelineAllocation& x : tl.allocations) {
            CHECK(named.insert(x.seq).second);
            CHECK(size_of_seq.at(x.seq) == x.size);
        }
        analyzed(trace, options);  // streamed from its file, the same
    }
}

TEST_CASE(
    "the layers' bytes at each sample and the tags' and sites' at the peak are the live "
    "set's then, with or without the samples' largest") {
    // Allocations and frees at random, some at an address still live (its
    // free never recorded): a rise to the peak, a fall, then sites and
    // tags first seen after the peak.
    TempDir t;
    TraceBuilder b;
    std::mt19937_64 rng(71);
    std::vector<uint32_t> stacks;
    for (uint64_t s = 0; s < 5; ++s)
        stacks.push_back(b.stack({0x1000 + s, 0x2000}));
    std::vector<uint64_t> live;  // addresses
    uint64_t next = 0x100000;
    for (uint64_t step = 1; step <= 24; ++step) {
        b.step(step);
        const int layers = step < 20 ? 4 : 6;  // two layers only after the peak
        for (int l = 0; l < layers; ++l) {
            b.push("model.layers." + std::to_string(l), l % 2 ? "forward" : "backward");
            for (int k = 0; k < 20; ++k) {
                const uint64_t r = rng() % 10;
                const uint64_t frees = step < 12 ? 3 : 6;  // a rise, then a fall
                if (!live.empty() && r < frees) {
                    const size_t at = rng() % live.size();
                    b.block_free(live[at]);
                    live.erase(live.begin() + std::ptrdiff_t(at));
                } else if (!live.empty() && r == 9) {
                    b.block(live[rng() % live.size()], 256 * (1 + rng() % 4),
                            stacks[rng() % (step < 20 ? 3 : 5)]);
                } else {
                    b.block(next, 512 * (1 + rng() % 6), stacks[rng() % (step < 20 ? 3 : 5)]);
                    live.push_back(next);
                    next += 0x1000;
                }
            }
            b.pop();
        }
    }
    const Trace trace = load_trace(b.write(t / "rank0.trace"));
    AnalysisOptions options;
    options.timeline_points = 53;
    options.timeline_layers = 4;  // the others folded into "(other)"
    options.top_sites = 4;
    const TraceAnalysis a = analyze(trace, options);
    // The live set replayed by hand: address -> (size, layer, phase, stack).
    struct Alive {
        uint64_t size = 0;
        uint32_t layer = 0, phase = 0, stack = 0;
    };
    std::map<uint64_t, Alive> alive;
    uint64_t live_bytes = 0, peak = 0;
    std::map<std::pair<std::string, std::string>, std::pair<uint64_t, uint64_t>> at_peak;
    std::map<uint32_t, uint64_t> sites_at_peak;
    const Timeline& tl = a.timeline;
    size_t point = 0;
    for (const Event& e : trace.events) {
        if (e.kind == EventKind::alloc) {
            if (auto it = alive.find(e.address); it != alive.end()) live_bytes -= it->second.size;
            alive[e.address] = {e.size, e.layer, e.phase, e.stack};
            live_bytes += e.size;
        }
        if (e.kind == EventKind::free) {
            live_bytes -= alive.at(e.address).size;
            alive.erase(e.address);
        }
        if (live_bytes > peak) {
            peak = live_bytes;
            at_peak.clear();
            sites_at_peak.clear();
            for (const auto& [address, l] : alive) {
                auto& [bytes, count] = at_peak[{trace.str(l.layer), trace.str(l.phase)}];
                bytes += l.size;
                ++count;
                sites_at_peak[l.stack] += l.size;
            }
        }
        if (point == tl.points.size() || tl.points[point].seq != e.seq) continue;
        const TimelinePoint& p = tl.points[point++];
        std::vector<uint64_t> want(tl.layers.size(), 0);
        for (const auto& [address, l] : alive) {
            const auto it =
                std::find(tl.layers.begin(), tl.layers.end(), layer_group(trace.str(l.layer)));
            want[it == tl.layers.end() ? tl.layers.size() - 1 : size_t(it - tl.layers.begin())] +=
                l.size;
        }
        CHECK(p.layer_bytes == want);
    }
    CHECK(point == tl.points.size());
    REQUIRE(tl.layers.back() == "(other)");
    const PoolSummary* owner = a.pool(a.owner);
    REQUIRE(owner != nullptr);
    CHECK(owner->peak_bytes == peak);
    CHECK(owner->peak_step >= 10);
    CHECK(owner->peak_step <= 13);
    size_t tags_at_peak = 0;
    for (const TagStats& tag : a.tags) {
        CAPTURE(tag.layer);
        CAPTURE(tag.phase);
        const auto it = at_peak.find({tag.layer, tag.phase});
        const std::pair<uint64_t, uint64_t> want =
            it == at_peak.end() ? std::pair<uint64_t, uint64_t>{} : it->second;
        CHECK(tag.at_peak == want.first);
        CHECK(tag.count_at_peak == want.second);
        tags_at_peak += tag.at_peak > 0;
    }
    CHECK(tags_at_peak == 4);  // the layers first seen after the peak hold nothing then
    REQUIRE(a.sites_at_peak.size() == 3);
    for (const Site& s : a.sites_at_peak)
        CHECK(s.bytes == sites_at_peak.at(s.stack));
    // Without the samples' largest (no second pass), all the rest is the same.
    AnalysisOptions no_largest = options;
    no_largest.timeline_allocations = 0;
    TraceAnalysis b_ = analyze(trace, no_largest);
    CHECK(b_.timeline.allocations.empty());
    for (TimelinePoint& p : b_.timeline.points) {
        CHECK(p.largest == std::vector<std::vector<uint32_t>>(tl.layers.size()));
    }
    TraceAnalysis a_ = a;
    a_.timeline.allocations.clear();
    for (TimelinePoint& p : a_.timeline.points)
        p.largest.assign(tl.layers.size(), {});
    CHECK(a_ == b_);
    analyzed(trace, options);  // streamed from its file, the same
    analyzed(trace, no_largest);
}

namespace {

// The analysis of a trace file with its footer (one pass where pass 1's
// guesses hold) against that of the same file without it (the count is not
// known beforehand: pass 0, then pass 1), but for the trace's end.
void check_guessed_analysis(const fs::path& path, const fs::path& without_footer,
                            const AnalysisOptions& options = {}) {
    CAPTURE(path);
    REQUIRE(ends_with_footer(path.string()));
    copy_prefix(path, without_footer, fs::file_size(path) - kRecordHeaderSize - 48);
    REQUIRE(!ends_with_footer(without_footer.string()));
    TraceStream guessed(path.string());
    REQUIRE(guessed.expected_size().has_value());
    TraceStream counted(without_footer.string());
    CHECK(!counted.expected_size().has_value());
    std::vector<StepMemory> guessed_steps, counted_steps;
    const TraceAnalysis a = analyze(guessed, options, &guessed_steps);
    TraceAnalysis b = analyze(counted, options, &counted_steps);
    CHECK(b.truncated);
    b.path = a.path;
    b.truncated = a.truncated;
    b.truncation_message = a.truncation_message;
    check_same_analysis(a, b);
    CHECK(guessed_steps == counted_steps);
}

}  // namespace

TEST_CASE("a trace analysed in one pass on guesses is the one analysed in two, right or wrong") {
    TempDir t;
    const fs::path cut = t.dir / "cut.trace";
    AnalysisOptions small;
    small.timeline_points = 37;
    small.timeline_allocations = 2;
    for (const fs::path& p : corpus_traces()) {
        check_guessed_analysis(p, cut);
        check_guessed_analysis(p, cut, small);
    }
    // Guesses that do not hold: blocks only after the events peeked at
    // (the owner), the only pushes among those by a thread that pushes less
    // than another (the training thread), failures out of memory, a footer
    // that counts fewer events than the file holds.
    for (int variant = 0; variant < 4; ++variant) {
        CAPTURE(variant);
        TraceBuilder b;
        if (variant == 1) {  // the training thread's first push after those peeked at
            b.push("loader", "forward", 7);
            b.pop(7);
            for (int k = 0; k < 2100; ++k) {
                b.segment(0x9000000, 4096);
                b.segment_free(0x9000000);
            }
        }
        b.segment(0x1000000, 1 << 20);
        const int steps = variant == 0 ? 1200 : 40;
        for (int s = 0; s < steps; ++s) {
            b.step(uint64_t(s));
            for (int layer = 0; layer < 4; ++layer) {
                b.push("layers." + std::to_string(layer), s % 2 ? "backward" : "forward");
                for (int k = 0; k < 6; ++k)
                    b.segment(0x2000000 + uint64_t(layer * 8 + k) * 0x10000, 4096 * (k + 1));
                if (variant == 2 && s == 20 && layer == 1) b.oom(1 << 30);
                for (int k = 0; k < 6; ++k)
                    b.segment_free(0x2000000 + uint64_t(layer * 8 + k) * 0x10000);
                b.pop();
            }
        }
        b.block(0x1000000, 512);
        if (variant == 2) b.block_oom(1 << 30);
        const fs::path path = t.dir / ("variant" + std::to_string(variant) + ".trace");
        if (variant == 3) {
            TraceBuilder fewer = b;
            fewer.events.pop_back();
            b.write(path);
            // The footer of the trace with one event fewer.
            const fs::path other = t.dir / "fewer.trace";
            fewer.write(other);
            std::ifstream in(other, std::ios::binary);
            std::string data((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
            std::ifstream whole(path, std::ios::binary);
            std::string mine((std::istreambuf_iterator<char>(whole)),
                             std::istreambuf_iterator<char>());
            const size_t footer = kRecordHeaderSize + 48;
            mine.replace(mine.size() - footer, footer, data.substr(data.size() - footer));
            std::ofstream(path, std::ios::binary | std::ios::trunc) << mine;
            REQUIRE(TraceStream(path.string()).expected_size() == b.events.size() - 1);
        } else {
            b.write(path);
        }
        check_guessed_analysis(path, cut);
        check_guessed_analysis(path, cut, small);
        analyzed(load_trace(path.string()));
    }
}
