// allocscope export (analyze/export.h, tools/allocscope/cmd_export.cpp): the
// Perfetto JSON, the collapsed stacks and the PyTorch memory snapshot of
// small constructed traces, where every number is known, and of the sim
// harness's traces, checked against the trace itself and the report
// analysis (analyze/analysis.h). The snapshot pickle is loaded by python3.
// The Parquet export's errors, and its DuckDB handles in this process (run
// under the sanitizers); what it writes is read back by DuckDB in
// tests/python/parquet_export_test.py. Every export streamed from the trace
// files (TraceStream) writes what it writes from the loaded traces, for a
// whole trace, one cut short and several ranks.
// Environment (tests/meson.build): E2E_CLI, HARNESS, DUCKDB_DEPS.
// Longer than 600 lines: the export formats on the same constructed traces.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "analysis.h"
#include "export.h"
#include "findings.h"
#include "findings_reader.h"
#include "json.h"
#include "replay.h"
#include "support.h"
#include "trace_builder.h"
#include "trace_reader.h"
#include "trace_writer.h"

namespace fs = std::filesystem;
using namespace allocscope;

namespace {

using namespace allocscope::test;

size_t lines_in(const std::string& text) {
    return size_t(std::count(text.begin(), text.end(), '\n'));
}

// --- Perfetto JSON --------------------------------------------------------------

struct PerfettoView {
    json::Value root;
    // Per (pid, counter name): the last value.
    std::map<std::pair<int64_t, std::string>, uint64_t> last;
    std::map<std::pair<int64_t, std::string>, size_t> samples;
    std::vector<const json::Value*> instants;
    std::map<int64_t, std::string> process_names;
    // Problems with B/E nesting, per (pid, tid); empty when well nested.
    std::vector<std::string> nesting;
    std::map<std::pair<int64_t, int64_t>, size_t> slices;
};

PerfettoView read_perfetto(const std::string& text) {
    PerfettoView v;
    v.root = json::parse(text);
    REQUIRE(v.root.type == json::Value::Type::object);
    CHECK(v.root.at("displayTimeUnit").text == "ms");
    std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, double>> open;  // depth, last ts
    for (const json::Value& e : v.root.at("traceEvents").items) {
        const std::string ph = e.at("ph").text;
        const int64_t pid = e.at("pid").as_i64();
        if (ph == "C") {
            const auto key = std::make_pair(pid, e.at("name").text);
            v.last[key] = e.at("args").at("bytes").as_u64();
            ++v.samples[key];
        } else if (ph == "i") {
            v.instants.push_back(&e);
        } else if (ph == "M") {
            if (e.at("name").text == "process_name")
                v.process_names[pid] = e.at("args").at("name").text;
        } else if (ph == "B" || ph == "E") {
            const auto key = std::make_pair(pid, e.at("tid").as_i64());
            auto& [depth, last_ts] = open[key];
            const double ts = e.at("ts").as_double();
            if (ts < last_ts) v.nesting.push_back("ts goes back on " + std::to_string(key.second));
            last_ts = ts;
            if (ph == "B") {
                ++depth;
                ++v.slices[key];
            } else if (--depth < 0) {
                v.nesting.push_back("E without B on " + std::to_string(key.second));
            }
        }
    }
    for (const auto& [key, state] : open) {
        if (state.first != 0)
            v.nesting.push_back(std::to_string(state.first) + " open on " +
                                std::to_string(key.second));
    }
    return v;
}

const json::Value* instant_named(const PerfettoView& v, const std::string& name) {
    for (const json::Value* e : v.instants) {
        if (e->at("name").text == name) return e;
    }
    return nullptr;
}

// --- The memory snapshot, as python3 sees it -------------------------------------

// Loads the pickle with Python's own unpickler and prints a JSON summary:
// the opcodes used (each must be one MemoryViz.js's unpickler knows), the
// largest APPENDS/SETITEMS batch, every segment's blocks tiling it, the
// TraceEntry actions by kind, and keys torch's snapshot has.
constexpr const char* kPickleCheck = R"PY(
import collections, json, pickle, pickletools, sys
data = open(sys.argv[1], 'rb').read()
known = {'PROTO', 'FRAME', 'STOP', 'MARK', 'EMPTY_DICT', 'EMPTY_LIST', 'EMPTY_TUPLE',
         'SETITEM', 'SETITEMS', 'APPEND', 'APPENDS', 'DICT', 'LIST', 'TUPLE', 'TUPLE1',
         'TUPLE2', 'TUPLE3', 'BININT', 'BININT1', 'BININT2', 'LONG1', 'BINFLOAT', 'NONE',
         'NEWTRUE', 'NEWFALSE', 'SHORT_BINUNICODE', 'BINUNICODE', 'MEMOIZE', 'BINPUT',
         'LONG_BINPUT', 'BINGET', 'LONG_BINGET'}
used, frames, largest, proto = set(), [0], 0, None
for op, arg, pos in pickletools.genops(data):
    used.add(op.name)
    if op.name == 'PROTO':
        proto = arg
    elif op.name == 'MARK':
        frames.append(0)
    elif op.name in ('SETITEMS', 'APPENDS'):
        n = frames.pop()
        largest = max(largest, n // 2 if op.name == 'SETITEMS' else n)
    elif op.name == 'TUPLE2':
        frames[-1] -= 1
    elif op.name not in ('MEMOIZE', 'STOP', 'FRAME'):
        frames[-1] += 1
snap = pickle.loads(data)
segs = snap['segments']
tiled, keys_ok = True, True
seg_keys = {'device', 'address', 'total_size', 'allocated_size', 'active_size', 'requested_size',
            'stream', 'segment_type', 'segment_pool_id', 'is_expandable', 'frames', 'blocks'}
block_keys = {'address', 'size', 'requested_size', 'state', 'frames'}
active, active_bytes = 0, 0
for s in segs:
    keys_ok &= seg_keys <= set(s)
    addr, allocated = s['address'], 0
    for b in s['blocks']:
        keys_ok &= block_keys <= set(b)
        tiled &= b['address'] == addr and b['size'] > 0
        tiled &= b['state'] in ('active_allocated', 'inactive')
        if b['state'] == 'active_allocated':
            active += 1
            active_bytes += b['size']
            allocated += b['requested_size']
            tiled &= b['requested_size'] <= b['size']
        addr += b['size']
    tiled &= addr == s['address'] + s['total_size'] and allocated == s['allocated_size']
    for f in s['frames']:
        keys_ok &= set(f) == {'filename', 'line', 'name'}
actions = collections.Counter()
for trace in snap['device_traces']:
    for e in trace:
        actions[e['action']] += 1
        need = {'action', 'size', 'stream', 'frames', 'time_us'}
        need |= {'device_free'} if e['action'] == 'oom' else {'addr'}
        keys_ok &= need <= set(e)
json.dump({'unknown_opcodes': sorted(used - known), 'protocol': proto,
           'largest_batch': largest, 'segments': len(segs),
           'total_size': sum(s['total_size'] for s in segs), 'active_blocks': active,
           'active_bytes': active_bytes, 'tiled': tiled, 'keys_ok': keys_ok,
           'devices': len(snap['device_traces']), 'actions': actions,
           'oom_device_free': [e['device_free'] for t in snap['device_traces'] for e in t
                               if e['action'] == 'oom'],
           'first_frames': [f['name'] for f in next((e['frames'] for t in snap['device_traces']
                                                      for e in t if e['frames']), [])]},
          sys.stdout)
)PY";

json::Value check_pickle(const fs::path& pickle) {
    const fs::path script = pickle.parent_path() / "check_pickle.py";
    std::ofstream(script) << kPickleCheck;
    std::string out, err;
    const int rc = sh("python3 " + script.string() + " " + pickle.string(), &out, &err);
    REQUIRE_MESSAGE(rc == 0, "python3 could not load the snapshot: " << err);
    json::Value v = json::parse(out);
    CHECK(v.at("unknown_opcodes").items.empty());
    CHECK(v.at("protocol").as_u64() == 4);
    CHECK(v.at("largest_batch").as_u64() <= 1000);
    CHECK(v.at("tiled").boolean);
    CHECK(v.at("keys_ok").boolean);
    return v;
}

uint64_t action_count(const json::Value& summary, const std::string& action) {
    const json::Value* n = summary.at("actions").find(action);
    return n ? n->as_u64() : 0;
}

// --- the sim harness ----------------------------------------------------------------

struct HarnessRun {
    TempDir t;
    fs::path out;
    HarnessRun() : out(t / "run") {
        std::string err;
        REQUIRE_MESSAGE(sh(env("E2E_CLI") + " run --out " + out.string() + " -- " + env("HARNESS") +
                               " --backend sim --ranks 2 --steps 3 --recipe delayed --te seed",
                           nullptr, &err) == 0,
                        err);
    }
    std::string cli(const std::string& args, int* rc = nullptr) {
        std::string o, err;
        const int status = sh(env("E2E_CLI") + " " + args, &o, &err);
        if (rc) {
            *rc = status;
        } else {
            REQUIRE_MESSAGE(status == 0, err);
        }
        return o + err;
    }
};

// One run, shared by the subcases (each runs the test case again).
HarnessRun& harness_run() {
    static HarnessRun run;
    return run;
}

}  // namespace

TEST_CASE("json::parse gives values with their offsets and errors with line and column") {
    const json::Value v = json::parse("{\"a\": [1, -2, 3.5], \"b\": \"x\\u00e9\"}");
    CHECK(v.at("a").items.size() == 3);
    CHECK(v.at("a").items[0].as_u64() == 1);
    CHECK(v.at("a").items[1].as_i64() == -2);
    CHECK(v.at("a").items[2].as_double() == 3.5);
    CHECK_THROWS_AS((void)v.at("a").items[2].as_u64(), std::invalid_argument);
    CHECK(v.at("b").text == "x\xc3\xa9");
    CHECK(v.at("b").offset == 25);
    CHECK(v.find("c") == nullptr);
    try {
        (void)json::parse("{\n  \"a\": [1,\n  }");
        FAIL("no error");
    } catch (const json::ParseError& e) {
        CHECK(e.line() == 3);
        CHECK(e.column() == 3);
        CHECK(std::string(e.what()) == "line 3, column 3: invalid JSON value");
    }
    CHECK_THROWS_AS((void)json::parse("{\"a\": 1, \"a\": 2}"), json::ParseError);
    CHECK_THROWS_AS((void)json::parse("[1] x"), json::ParseError);
}

TEST_CASE(
    "perfetto: counters end at the live bytes, slices nest per thread, findings are instants") {
    TempDir t;
    TraceBuilder b(3);
    const uint32_t main_tid = 11, side_tid = 12;
    b.segment(0x10000, 0x10000, 0, main_tid);
    b.step(0, main_tid);
    b.push("model.layers.0.mlp", "forward", main_tid);
    b.block(0x10000, 100, 0, main_tid);
    b.block(0x10400, 300, 0, main_tid);
    b.push("model.layers.1", "backward", side_tid);  // never popped
    const uint64_t evidence_seq = b.block(0x12000, 50, 0, side_tid);
    b.block_free(0x10000, main_tid);
    b.pop(main_tid);
    b.pop(main_tid);  // a pop without a push is ignored
    b.step(1, main_tid);
    b.segment(0x90000, 4096, 0, main_tid, MemoryKind::host_pinned);
    const fs::path path = b.write(t / "rank3.trace");
    const Trace trace = load_trace(path.string());

    Finding with;
    with.plugin = "phase-retention";
    with.severity = Severity::warning;
    with.rank = 3;
    with.summary = "kept <50 B> \"alive\"";
    Evidence ev;
    ev.alloc_seq = evidence_seq;
    ev.size = 50;
    with.evidence.push_back(ev);
    Finding without = with;
    without.plugin = "peak-owner";
    without.severity = Severity::info;
    without.evidence.clear();
    const std::vector<const Finding*> findings = {&with, &without};

    ExportWriter out;
    PerfettoExport perfetto(out, trace.header.start_wall_ns);
    perfetto.add(trace, findings);
    perfetto.finish();
    const PerfettoView v = read_perfetto(out.str());

    CHECK(v.process_names.at(3) == "rank 3");
    CHECK(v.last.at({3, "pool: segment"}) == 0x10000);
    CHECK(v.last.at({3, "pool: block"}) == 350);
    CHECK(v.last.at({3, "pool: host-pinned"}) == 4096);
    CHECK(v.last.at({3, "layer: model.layers.0"}) == 300);
    CHECK(v.last.at({3, "layer: model.layers.1"}) == 50);
    // A sample at the start, one per change: +100, +300, -100.
    CHECK(v.samples.at({3, "layer: model.layers.0"}) == 4);
    CHECK(v.nesting.empty());
    CHECK(v.slices.at({3, main_tid}) == 1);
    CHECK(v.slices.at({3, side_tid}) == 1);

    REQUIRE(v.instants.size() == 4);  // two steps, two findings
    CHECK(instant_named(v, "step 0"));
    CHECK(instant_named(v, "step 1"));
    const json::Value* w = instant_named(v, "warning: phase-retention");
    REQUIRE(w);
    CHECK(w->at("cat").text == "finding");
    CHECK(w->at("tid").as_u64() == side_tid);
    CHECK(w->at("ts").as_double() ==
          doctest::Approx(double(trace.events[evidence_seq - 1].t_ns) / 1000.0));
    CHECK(w->at("args").at("summary").text == "kept <50 B> \"alive\"");
    const json::Value* i = instant_named(v, "info: peak-owner");
    REQUIRE(i);
    CHECK(i->at("tid").as_u64() == main_tid);
    CHECK(i->at("ts").as_double() == doctest::Approx(double(trace.events.back().t_ns) / 1000.0));
}

TEST_CASE("perfetto: ranks line up on the wall clock of their trace starts") {
    TempDir t;
    TraceBuilder r0(0), r1(1);
    r1.header.start_wall_ns = r0.header.start_wall_ns + 2'000'000;  // 2 ms later
    r0.segment(0x1000, 10);
    r1.segment(0x1000, 20);
    const Trace t0 = load_trace(r0.write(t / "rank0.trace"));
    const Trace t1 = load_trace(r1.write(t / "rank1.trace"));
    ExportWriter out;
    PerfettoExport perfetto(out, t0.header.start_wall_ns);
    perfetto.add(t0, {});
    perfetto.add(t1, {});
    perfetto.finish();
    const json::Value root = json::parse(out.str());
    std::map<int64_t, double> first_change;
    for (const json::Value& e : root.at("traceEvents").items) {
        if (e.at("ph").text == "C" && e.at("args").at("bytes").as_u64() > 0)
            first_change.emplace(e.at("pid").as_i64(), e.at("ts").as_double());
    }
    CHECK(first_change.at(0) == doctest::Approx(1.5));
    CHECK(first_change.at(1) == doctest::Approx(2001.5));
}

TEST_CASE("collapsed: one line per layer, phase and stack at the peak, adding up to the peak") {
    TempDir t;
    TraceBuilder b;
    const uint32_t s1 = b.stack({0x401000, 0x402000});  // innermost first
    const uint32_t s2 = b.stack({0x403000});
    b.segment(0x100000, 1 << 20);
    b.push("layers.0;odd\nname", "forward");
    b.block(0x100000, 1000, s1);
    b.block(0x101000, 500, s1);
    b.block(0x102000, 200, s2);
    b.pop();
    b.block(0x103000, 64);  // untagged, no stack
    b.block_free(0x100000);
    b.block(0x104000, 7, s2);  // after the peak
    b.block_free(0x101000);
    const Trace trace = load_trace(b.write(t / "rank0.trace"));

    const PeakSnapshot peak = live_at_peak(trace);
    CHECK(peak.owner == Pool::device_block);
    CHECK(peak.peak_bytes == 1764);
    CHECK(stack_ids(peak.live) == std::vector<uint32_t>{s1, s2});
    CollapsedExport collapsed;
    collapsed.add(trace, peak, raw_stacks(trace, stack_ids(peak.live)));
    ExportWriter out;
    collapsed.write(out);
    CHECK(out.str() ==
          "(untagged);(no phase) 64\n"
          "layers.0,odd name;forward;0x402000;0x401000 1500\n"
          "layers.0,odd name;forward;0x403000 200\n");
}

TEST_CASE("memory-viz: blocks tile their segments and the history has every action") {
    TempDir t;
    TraceBuilder b;
    const uint32_t s1 = b.stack({0x401000, 0x402000});
    b.segment(0x10000, 0x10000, s1);
    b.segment(0x40000, 0x8000);
    b.segment(0x80000, 0x4000);
    b.push("layers.0", "forward");
    b.block(0x10000, 0x100, s1);
    b.block(0x10400, 0x200, s1);
    b.block(0x14000, 0x1000);
    b.block(0x200000, 0x300);  // outside every segment
    b.pop();
    b.block_free(0x14000);
    b.block_free(0x14000);  // a double free frees nothing
    b.segment_free(0x40000);
    b.oom(uint64_t{1} << 40);                 // the failed cudaMalloc: not in PyTorch's snapshots
    b.block_oom(uint64_t{1} << 40, 5 << 20);  // the allocator's verdict: an "oom" entry
    b.segment(0x900000, 4096, 0, 1, MemoryKind::host_pinned);  // not device memory
    const Trace trace = load_trace(b.write(t / "rank0.trace"));

    std::ofstream file(t / "snapshot.pickle", std::ios::binary);
    {
        ExportWriter out;
        export_memory_viz(trace, raw_stacks(trace, memory_viz_stacks(trace)), out);
        file << out.str();
    }
    file.close();
    const json::Value v = check_pickle(t / "snapshot.pickle");
    // 0x10000 and 0x80000 are live, and the orphan block's own segment.
    CHECK(v.at("segments").as_u64() == 3);
    CHECK(v.at("total_size").as_u64() == 0x10000 + 0x4000 + 0x300);
    CHECK(v.at("active_blocks").as_u64() == 3);
    CHECK(v.at("active_bytes").as_u64() == 0x100 + 0x200 + 0x300);
    CHECK(v.at("devices").as_u64() == 1);
    CHECK(action_count(v, "segment_alloc") == 4);  // three segments and the orphan's
    CHECK(action_count(v, "alloc") == 4);
    CHECK(action_count(v, "free_requested") == 1);
    CHECK(action_count(v, "free_completed") == 1);
    CHECK(action_count(v, "segment_free") == 1);
    CHECK(action_count(v, "oom") == 1);
    REQUIRE(v.at("oom_device_free").items.size() == 1);
    CHECK(v.at("oom_device_free").items[0].as_u64() == 5u << 20);
    const auto& frames = v.at("first_frames").items;
    REQUIRE(frames.size() == 2);
    CHECK(frames[0].text == "0x401000");  // innermost first, as torch's
}

TEST_CASE("memory-viz: without block events every segment is one block") {
    TempDir t;
    TraceBuilder b;
    b.segment(0x10000, 1000);
    b.segment(0x20000, 3000);
    b.segment(0x30000, 5000);
    b.segment_free(0x20000);
    const Trace trace = load_trace(b.write(t / "rank0.trace"));
    ExportWriter out;
    export_memory_viz(trace, raw_stacks(trace, {}), out);
    std::ofstream(t / "snapshot.pickle", std::ios::binary) << out.str();
    const json::Value v = check_pickle(t / "snapshot.pickle");
    CHECK(v.at("segments").as_u64() == 2);
    CHECK(v.at("total_size").as_u64() == 6000);
    CHECK(v.at("active_blocks").as_u64() == 2);
    CHECK(v.at("active_bytes").as_u64() == 6000);
    CHECK(action_count(v, "segment_alloc") == 3);
    CHECK(action_count(v, "alloc") == 3);
    CHECK(action_count(v, "free_completed") == 1);
    CHECK(action_count(v, "segment_free") == 1);
}

TEST_CASE("allocscope export on a harness run: every format agrees with the traces") {
    HarnessRun& run = harness_run();
    std::vector<Trace> traces;
    std::vector<TraceAnalysis> analyses;
    for (int r = 0; r < 2; ++r) {
        traces.push_back(load_trace((run.out / ("rank" + std::to_string(r) + ".trace")).string()));
        analyses.push_back(analyze(traces.back()));
        REQUIRE(analyses.back().owner == Pool::device_block);
    }
    const FindingsFile findings = read_findings_file((run.out / "findings.json").string());
    REQUIRE_FALSE(findings.findings.empty());

    SUBCASE("perfetto") {
        const fs::path json = run.t / "trace.json";
        run.cli("export " + run.out.string() + " --format perfetto -o " + json.string());
        const PerfettoView v = read_perfetto(slurp(json));
        CHECK(v.nesting.empty());
        for (int r = 0; r < 2; ++r) {
            const TraceAnalysis& a = analyses[r];
            CHECK(v.process_names.at(r) == "rank " + std::to_string(r));
            for (const PoolSummary& p : a.pools) {
                CHECK(v.last.at({r, std::string("pool: ") + to_string(p.pool)}) ==
                      p.live_bytes_at_exit);
            }
            std::map<std::string, uint64_t> at_exit;
            for (const TagStats& s : a.tags) {
                if (s.allocations) at_exit[layer_group(s.layer)] += s.at_exit;
            }
            for (const auto& [group, bytes] : at_exit)
                CHECK(v.last.at({r, "layer: " + group}) == bytes);
            size_t tracks = 0;
            for (const auto& [key, value] : v.last)
                tracks += key.first == r && key.second.rfind("layer: ", 0) == 0;
            CHECK(tracks == at_exit.size());
            size_t scopes = 0;
            for (const TagStats& s : a.tags)
                scopes += s.scopes;
            size_t slices = 0;
            for (const auto& [key, n] : v.slices)
                slices += key.first == r ? n : 0;
            CHECK(slices == scopes);
        }
        size_t finding_instants = 0;
        for (const json::Value* e : v.instants)
            finding_instants += e->at("cat").text == "finding";
        CHECK(finding_instants == findings.findings.size());
    }

    SUBCASE("collapsed") {
        for (int r = 0; r < 2; ++r) {
            const std::string text = run.cli("export " + run.out.string() + " --rank " +
                                             std::to_string(r) + " --format collapsed");
            const TraceAnalysis& a = analyses[r];
            std::map<std::pair<std::string, std::string>, uint64_t> by_tag;
            uint64_t total = 0;
            std::istringstream in(text);
            std::string line;
            while (std::getline(in, line)) {
                const size_t space = line.rfind(' ');
                REQUIRE(space != std::string::npos);
                const uint64_t bytes = std::stoull(line.substr(space + 1));
                const size_t first = line.find(';');
                const size_t second = line.find(';', first + 1);
                REQUIRE(first != std::string::npos);
                const std::string layer = line.substr(0, first);
                const std::string phase =
                    line.substr(first + 1, std::min(second, space) - first - 1);
                by_tag[{layer, phase}] += bytes;
                total += bytes;
            }
            CHECK(total == a.pool(a.owner)->peak_bytes);
            for (const TagStats& s : a.tags) {
                if (s.at_peak == 0) continue;
                const std::string layer = s.layer.empty() ? "(untagged)" : s.layer;
                const std::string phase = s.phase.empty() ? "(no phase)" : s.phase;
                const uint64_t bytes = by_tag[std::make_pair(layer, phase)];
                CHECK_MESSAGE(bytes == s.at_peak, layer << ";" << phase);
            }
            // The harness's own frames are symbolized.
            CHECK(text.find("CachingAllocator::allocate") != std::string::npos);
        }
    }

    SUBCASE("memory-viz") {
        const fs::path pickle = run.t / "rank0.pickle";
        run.cli("export " + run.out.string() + " --rank 0 --format memory-viz -o " +
                pickle.string());
        const json::Value v = check_pickle(pickle);
        const Trace& trace = traces[0];
        Replay replay;
        uint64_t block_allocs = 0, block_frees = 0, segment_allocs = 0, segment_frees = 0;
        for (const Event& e : trace.events) {
            const uint64_t blocks = replay.totals(Pool::device_block).live_count;
            const uint64_t segments = replay.totals(Pool::device_segment).live_count;
            replay.apply(e);
            if (e.kind == EventKind::alloc && e.level == Level::block) ++block_allocs;
            if (e.kind == EventKind::alloc && e.level == Level::segment &&
                e.memory != MemoryKind::host_pinned)
                ++segment_allocs;
            block_frees += replay.totals(Pool::device_block).live_count < blocks;
            segment_frees += replay.totals(Pool::device_segment).live_count < segments;
        }
        CHECK(action_count(v, "alloc") == block_allocs);
        CHECK(action_count(v, "free_requested") == block_frees);
        CHECK(action_count(v, "free_completed") == block_frees);
        CHECK(action_count(v, "segment_alloc") == segment_allocs);
        CHECK(action_count(v, "segment_free") == segment_frees);
        CHECK(v.at("total_size").as_u64() == replay.totals(Pool::device_segment).live_bytes);
        CHECK(v.at("active_blocks").as_u64() == replay.totals(Pool::device_block).live_count);
        CHECK(v.at("active_bytes").as_u64() == replay.totals(Pool::device_block).live_bytes);
    }
}

TEST_CASE("allocscope export: bad input and unwritable output give exit 2 and one message") {
    TempDir t;
    const std::string cli = env("E2E_CLI");
    TraceBuilder b;
    b.segment(0x1000, 64);
    const std::string good = b.write(t / "rank0.trace");
    std::string corrupt = slurp(good);
    REQUIRE(corrupt.size() > kTraceHeaderSize + kRecordHeaderSize);
    corrupt[kTraceHeaderSize + kRecordHeaderSize] ^= 0x5A;  // the first record's payload
    std::ofstream(t / "corrupt.trace", std::ios::binary) << corrupt;
    std::ofstream(t / "garbage.trace", std::ios::binary) << "not a trace at all";

    struct Case {
        std::string args, message;
    };
    const std::vector<Case> cases = {
        {(t / "corrupt.trace").string() + " --format perfetto -o " + (t / "o.json").string(),
         "corrupt.trace"},
        {(t / "garbage.trace").string() + " --format collapsed -o " + (t / "o.json").string(),
         "garbage.trace"},
        {(t / "missing.trace").string() + " --format perfetto", "missing.trace"},
        {good + " --format perfetto -o " + (t / "no-such-dir" / "o.json").string(),
         "cannot write " + (t / "no-such-dir" / "o.json").string() + ": No such file"},
        {good + " --format perfetto -o " + t.dir.string(), "cannot write " + t.dir.string()},
        {good + " --format svg", "--format expects perfetto, collapsed, memory-viz or parquet"},
        {good, "export needs --format"},
        {good + " --format perfetto --rank 5", "no trace of rank 5"},
    };
    for (const Case& c : cases) {
        std::string out, err;
        CHECK_MESSAGE(sh(cli + " export " + c.args, &out, &err) == 2, c.args);
        CHECK_MESSAGE(lines_in(err) == 1, err);
        CHECK_MESSAGE(err.rfind("allocscope: ", 0) == 0, err);
        CHECK_MESSAGE(err.find(c.message) != std::string::npos, err);
        CHECK(out.empty());
    }
    // Nothing half-written is left behind.
    CHECK_FALSE(fs::exists(t / "o.json"));
    for (const auto& entry : fs::directory_iterator(t.dir))
        CHECK_MESSAGE(entry.path().string().find(".tmp") == std::string::npos, entry.path());

    // memory-viz is one process's snapshot.
    TraceBuilder other(1);
    other.segment(0x1000, 64);
    other.write(t / "rank1.trace");
    std::string err;
    CHECK(sh(cli + " export " + t.dir.string() + "/rank0.trace " + t.dir.string() +
                 "/rank1.trace --format memory-viz -o " + (t / "s.pickle").string(),
             nullptr, &err) == 2);
    CHECK(err.find("pick one with --rank R") != std::string::npos);
    CHECK(sh(cli + " export " + t.dir.string() + "/rank0.trace " + t.dir.string() +
             "/rank1.trace --rank 1 --format memory-viz -o " + (t / "s.pickle").string()) == 0);
    CHECK(fs::file_size(t / "s.pickle") > 0);
}

// --- Parquet ---------------------------------------------------------------------

namespace {

// The libduckdb.so tools/setup-deps --tests installs under DUCKDB_DEPS, or
// ALLOCSCOPE_DUCKDB's; "" when there is none.
std::string duckdb_library() {
    if (const char* named = std::getenv("ALLOCSCOPE_DUCKDB"); named && *named) return named;
    const fs::path duckdb = fs::path(env("DUCKDB_DEPS")) / "node_modules" / "@duckdb";
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(duckdb, ec)) {
        const fs::path lib = entry.path() / "libduckdb.so";
        const std::string name = entry.path().filename().string();
        // An npm that ignores the packages' "libc" field installs the musl
        // build too; this process runs on glibc.
        if (name.starts_with("node-bindings-linux-") && !name.ends_with("-musl") &&
            fs::exists(lib, ec))
            return lib.string();
    }
    return {};
}

// Whether anything named "<name>.tmp..." (a staging sibling) is in `dir`.
bool staging_left(const fs::path& dir) {
    for (const auto& entry : fs::directory_iterator(dir)) {
        if (entry.path().filename().string().find(".tmp") != std::string::npos) return true;
    }
    return false;
}

}  // namespace

TEST_CASE("allocscope export --format parquet: bad input gives exit 2 and one message") {
    TempDir t;
    const std::string cli = env("E2E_CLI");
    TraceBuilder b;
    b.segment(0x1000, 64);
    const std::string good = b.write(t / "rank0.trace");
    const std::string out = (t / "out").string();
    const std::string nowhere = "ALLOCSCOPE_DUCKDB=" + (t / "nowhere" / "libduckdb.so").string();
    struct Case {
        std::string command, message;
    };
    const std::vector<Case> cases = {
        {nowhere + " " + cli + " export " + good + " --format parquet -o " + out,
         "--format parquet needs DuckDB's C library, and " + nowhere + " could not be loaded"},
        {nowhere + " " + cli + " export " + good + " --format parquet -o " + out,
         "npm pack @duckdb/node-bindings-linux-x64"},
        {"ALLOCSCOPE_DUCKDB=" + good + " " + cli + " export " + good + " --format parquet -o " +
             out,
         "could not be loaded"},
        {cli + " export " + good + " --format parquet", "give -o DIR"},
        {cli + " export " + good + " --format perfetto --run x", "--run names the run"},
        {cli + " export " + good + " --format parquet --run a/b -o " + out, "without '/'"},
        {cli + " export " + good + " --format parquet --rank 3 -o " + out, "no trace of rank 3"},
    };
    for (const Case& c : cases) {
        std::string o, err;
        CHECK_MESSAGE(sh(c.command, &o, &err) == 2, c.command);
        CHECK_MESSAGE(lines_in(err) == 1, err);
        CHECK_MESSAGE(err.rfind("allocscope: ", 0) == 0, err);
        CHECK_MESSAGE(err.find(c.message) != std::string::npos, err);
        CHECK(o.empty());
    }
    CHECK_FALSE(fs::exists(out));
    CHECK_FALSE(staging_left(t.dir));
}

TEST_CASE("ParquetExport: the dataset appears whole at DIR or not at all, every handle let go") {
    const std::string lib = duckdb_library();
    if (lib.empty()) {
        MESSAGE("no libduckdb.so (tools/setup-deps --tests installs one): not run");
        return;
    }
    ::setenv("ALLOCSCOPE_DUCKDB", lib.c_str(), 1);
    TempDir t;
    TraceBuilder b(3);
    const uint32_t stack = b.stack({0x401000, 0x402000});
    b.push("layers.0", "forward");
    b.segment(0x10000, 4096, stack);
    b.block(0x10000, 1024, stack);
    b.block(0x10400, 512);
    b.block_free(0x10000);
    b.pop();
    b.segment_free(0x10000);
    const Trace trace = load_trace(b.write(t / "rank3.trace"));
    const TraceAnalysis analysis = analyze(trace);
    const std::vector<uint32_t> ids = {stack};
    const StackFrames frames = raw_stacks(trace, ids);
    Finding f;
    f.plugin = "test";
    f.rank = 3;
    f.layer = "layers.0";
    f.bytes = 512;

    SUBCASE("committed: every table, one partition, nothing else beside it") {
        const fs::path dir = t / "sub" / "pq";
        ParquetExport px(dir.string());
        CHECK(px.library().find(lib) == 0);
        px.add("r1", trace, analysis, frames);
        CHECK_FALSE(fs::exists(dir));
        px.add_findings("r1", std::vector<Finding>{f});
        px.commit();
        CHECK(px.rows().events == trace.events.size());
        CHECK(px.rows().stack_frames == 2);
        CHECK(px.rows().peak_live == 1);
        CHECK(px.rows().traces == 1);
        CHECK(px.rows().findings == 1);
        for (const char* table : {"events", "stacks", "peak_live", "ranks", "findings"}) {
            const fs::path partition = dir / table / "run=r1" / "rank=3";
            CHECK_MESSAGE(fs::file_size(partition / (std::string(table) == "findings"
                                                         ? "part1_0.parquet"
                                                         : "part0_0.parquet")) > 0,
                          table);
            CHECK(std::distance(fs::directory_iterator(partition), fs::directory_iterator()) == 1);
        }
        CHECK((fs::status(dir).permissions() & fs::perms::all) == fs::perms::owner_all);
        CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 5);
        CHECK_FALSE(staging_left(t / "sub"));
    }
    SUBCASE("a table without rows still has a file, with the columns and no rows") {
        const fs::path dir = t / "pq";
        ParquetExport px(dir.string());
        px.add("r1", trace, analysis, frames);
        px.add_findings("r1", {});
        px.commit();
        CHECK(px.rows().findings == 0);
        CHECK(fs::file_size(dir / "findings" / "run=r1" / "rank=3" / "part0_0.parquet") > 0);
    }
    SUBCASE("abandoned (an error on the way): nothing at DIR, no staging left") {
        const fs::path dir = t / "pq";
        {
            ParquetExport px(dir.string());
            px.add("r1", trace, analysis, frames);
        }
        CHECK_FALSE(fs::exists(dir));
        CHECK_FALSE(staging_left(t.dir));
    }
    SUBCASE("an output that exists is refused before anything is written") {
        fs::create_directories(t / "full");
        std::ofstream(t / "full" / "keep") << "x";
        CHECK_THROWS_WITH_AS(ParquetExport((t / "full").string()),
                             doctest::Contains("exists: the Parquet export writes a new directory"),
                             std::runtime_error);
        CHECK(fs::exists(t / "full" / "keep"));
        CHECK_THROWS_WITH_AS(ParquetExport((t / "rank3.trace" / "pq").string()),
                             doctest::Contains("cannot write"), std::runtime_error);
        CHECK_FALSE(staging_left(t.dir));
    }
    ::unsetenv("ALLOCSCOPE_DUCKDB");
}

TEST_CASE("allocscope export --help shows the formats and an example") {
    std::string out;
    REQUIRE(sh(env("E2E_CLI") + " export --help", &out) == 0);
    CHECK(out.find("perfetto") != std::string::npos);
    CHECK(out.find("collapsed") != std::string::npos);
    CHECK(out.find("memory-viz") != std::string::npos);
    CHECK(out.find("parquet") != std::string::npos);
    CHECK(out.find("examples:") != std::string::npos);
    REQUIRE(sh(env("E2E_CLI") + " --help", &out) == 0);
    CHECK(out.find("export PATH...") != std::string::npos);
}

// --- Streamed exports -------------------------------------------------------------

namespace {

// A harness run's traces (two ranks), the first cut short inside a record,
// with their findings.
struct StreamInputs {
    std::vector<std::string> ranks;  // rank0.trace, rank1.trace
    std::string cut;                 // rank 0's trace, its last third cut off
    FindingsFile findings;
    StreamInputs() {
        HarnessRun& run = harness_run();
        for (int r = 0; r < 2; ++r)
            ranks.push_back((run.out / ("rank" + std::to_string(r) + ".trace")).string());
        const std::string whole = slurp(ranks[0]);
        cut = (run.t / "cut.trace").string();
        std::ofstream(cut, std::ios::binary) << whole.substr(0, whole.size() * 2 / 3);
        findings = read_findings_file((run.out / "findings.json").string());
    }
};

StreamInputs& stream_inputs() {
    static StreamInputs in;
    return in;
}

std::vector<const Finding*> findings_of(const FindingsFile& file, int32_t rank) {
    std::vector<const Finding*> mine;
    for (const Finding& f : file.findings) {
        if (f.rank == rank) mine.push_back(&f);
    }
    return mine;
}

// The Perfetto JSON of `paths` together, from their files (streamed) or
// from their loaded traces.
std::string perfetto_of(const std::vector<std::string>& paths, const FindingsFile& findings,
                        bool streamed) {
    ExportWriter out;
    uint64_t base = UINT64_MAX;
    for (const std::string& p : paths)
        base = std::min(base, TraceReader(p).header().start_wall_ns);
    PerfettoExport perfetto(out, base);
    for (const std::string& p : paths) {
        if (streamed) {
            TraceStream stream(p);
            perfetto.add(stream, findings_of(findings, stream.header().rank));
        } else {
            const Trace trace = load_trace(p);
            perfetto.add(trace, findings_of(findings, trace.header.rank));
        }
    }
    perfetto.finish();
    return out.str();
}

std::string collapsed_of(const std::vector<std::string>& paths, bool streamed) {
    CollapsedExport collapsed;
    for (const std::string& p : paths) {
        if (streamed) {
            TraceStream stream(p);
            const PeakSnapshot peak = live_at_peak(stream);
            collapsed.add(stream.tables(), peak, raw_stacks(stream.tables(), stack_ids(peak.live)));
        } else {
            const Trace trace = load_trace(p);
            const PeakSnapshot peak = live_at_peak(trace);
            collapsed.add(trace, peak, raw_stacks(trace, stack_ids(peak.live)));
        }
    }
    ExportWriter out;
    collapsed.write(out);
    return out.str();
}

std::string memory_viz_of(const std::string& path, bool streamed) {
    ExportWriter out;
    if (streamed) {
        TraceStream stream(path);
        const std::vector<uint32_t> ids = memory_viz_stacks(stream);
        export_memory_viz(stream, raw_stacks(stream.tables(), ids), out);
    } else {
        const Trace trace = load_trace(path);
        export_memory_viz(trace, raw_stacks(trace, memory_viz_stacks(trace)), out);
    }
    return out.str();
}

}  // namespace

TEST_CASE(
    "perfetto: a streamed trace exports what its loaded copy does, whole, cut short or "
    "with several ranks") {
    StreamInputs& in = stream_inputs();
    REQUIRE_FALSE(in.findings.findings.empty());
    for (const std::vector<std::string>& paths :
         {std::vector<std::string>{in.ranks[0]}, std::vector<std::string>{in.cut}, in.ranks,
          std::vector<std::string>{in.cut, in.ranks[1]}}) {
        INFO(paths.front() << " and " << paths.size() - 1 << " more");
        const std::string loaded = perfetto_of(paths, in.findings, false);
        CHECK(loaded.size() > 1000);
        CHECK(perfetto_of(paths, in.findings, true) == loaded);
    }
}

TEST_CASE(
    "collapsed: a streamed trace exports what its loaded copy does, whole, cut short or "
    "with several ranks") {
    StreamInputs& in = stream_inputs();
    for (const std::vector<std::string>& paths :
         {std::vector<std::string>{in.ranks[0]}, std::vector<std::string>{in.cut}, in.ranks}) {
        INFO(paths.front() << " and " << paths.size() - 1 << " more");
        const std::string loaded = collapsed_of(paths, false);
        CHECK(lines_in(loaded) > 3);
        CHECK(collapsed_of(paths, true) == loaded);
    }
    // Rank by rank, the peak is the one the analysis finds.
    for (const std::string& p : in.ranks) {
        TraceStream stream(p);
        const PeakSnapshot peak = live_at_peak(stream);
        const TraceAnalysis a = analyze(load_trace(p));
        REQUIRE(a.pool(peak.owner));
        CHECK(peak.peak_bytes == a.pool(peak.owner)->peak_bytes);
        uint64_t sum = 0;
        for (const LiveRecord& r : peak.live)
            sum += r.size;
        CHECK(sum == peak.peak_bytes);
    }
}

TEST_CASE("memory-viz: a streamed trace exports what its loaded copy does, whole or cut short") {
    StreamInputs& in = stream_inputs();
    for (const std::string& p : {in.ranks[0], in.ranks[1], in.cut}) {
        INFO(p);
        const std::string loaded = memory_viz_of(p, false);
        CHECK(loaded.size() > 1000);
        CHECK(memory_viz_of(p, true) == loaded);
    }
    // A stream's later passes read the same events: a second export of the
    // same stream writes the same bytes.
    TraceStream stream(in.ranks[1]);
    const std::vector<uint32_t> ids = memory_viz_stacks(stream);
    ExportWriter first, second;
    export_memory_viz(stream, raw_stacks(stream.tables(), ids), first);
    export_memory_viz(stream, raw_stacks(stream.tables(), ids), second);
    CHECK(first.str() == second.str());
}

TEST_CASE("collapsed: a stream whose peak pass ended early reads whole again") {
    StreamInputs& in = stream_inputs();
    TraceStream stream(in.ranks[0]);
    const PeakSnapshot first = live_at_peak(stream);
    const PeakSnapshot again = live_at_peak(stream);  // its passes end early, then start afresh
    CHECK(again.peak_seq == first.peak_seq);
    CHECK(again.live.size() == first.live.size());
    size_t all = 0;
    stream.for_each([&](const Event&) { ++all; });
    CHECK(all == load_trace(in.ranks[0]).events.size());
}

TEST_CASE(
    "ParquetExport: a streamed trace writes the files its loaded copy does, whole, cut "
    "short or with several ranks") {
    const std::string lib = duckdb_library();
    if (lib.empty()) {
        MESSAGE("no libduckdb.so (tools/setup-deps --tests installs one): not run");
        return;
    }
    ::setenv("ALLOCSCOPE_DUCKDB", lib.c_str(), 1);
    StreamInputs& in = stream_inputs();
    TempDir t;
    const std::vector<std::string> paths = {in.cut, in.ranks[1]};
    for (bool streamed : {false, true}) {
        ParquetExport px((t / (streamed ? "streamed" : "loaded")).string());
        for (const std::string& p : paths) {
            if (streamed) {
                TraceStream stream(p);
                const TraceAnalysis a = analyze(stream);
                px.add("run", stream, a, raw_stacks(stream.tables(), {}));
            } else {
                const Trace trace = load_trace(p);
                px.add("run", trace, analyze(trace), raw_stacks(trace, {}));
            }
        }
        px.commit();
    }
    size_t files = 0;
    for (const auto& entry : fs::recursive_directory_iterator(t / "loaded")) {
        if (!entry.is_regular_file()) continue;
        const fs::path rel = fs::relative(entry.path(), t / "loaded");
        INFO(rel.string());
        ++files;
        CHECK(slurp(t / "streamed" / rel) == slurp(entry.path()));
    }
    CHECK(files >= 8);  // events, stacks, peak_live and ranks of two ranks
}
