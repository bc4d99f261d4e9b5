// Out-of-memory moments (analyze/analysis.h, OomMoment): which failed
// requests are moments, what was live at them, and how the text, JSON and
// HTML reports, the diff and the exports show them; and the self-check
// against the allocator's own counters (CounterSummary), which counts the
// allocator's memory by the same rules. On constructed traces where every
// number is known. Every analysis is also streamed from its file and found
// the same (tests/streamed.h).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <allocscope/allocscope.h>

#include "analysis.h"
#include "diff.h"
#include "export.h"
#include "findings.h"
#include "json.h"
#include "report.h"
#include "streamed.h"
#include "support.h"
#include "trace_builder.h"
#include "trace_reader.h"

using namespace allocscope;
using namespace allocscope::test;

namespace {

constexpr uint64_t MiB = 1 << 20;

// A 64 MiB segment; layers.0 and layers.1 keep 30 and 20 MiB; layers.2's
// forward asks for 20 MiB: two cudaMalloc calls fail, then the allocator
// gives up with 1 MiB free on the device. Returns the seq of layers.0's block.
struct OomRun {
    TraceBuilder b{0};
    uint64_t kept_seq = 0, freed_seq = 0, freed_free_seq = 0;
    uint32_t request_stack = 0;
    OomRun() {
        request_stack = b.stack({0x401000, 0x402000});
        b.step(3);
        b.segment(0x10000000, 64 * MiB);
        b.push("layers.0", "forward");
        kept_seq = b.block(0x10000000, 30 * MiB, b.stack({0x403000}));
        freed_seq = b.block(0x12000000, 1 * MiB);
        b.block_free(0x12000000);
        freed_free_seq = b.seq;
        b.pop();
        b.push("layers.1", "forward");
        b.block(0x13000000, 20 * MiB);
        b.pop();
        b.push("layers.2", "forward");
        b.oom(20 * MiB);
        b.oom(20 * MiB);
        Event& verdict = b.add(EventKind::oom, 1);
        verdict.level = Level::block;
        verdict.memory = MemoryKind::device;
        verdict.api = Api::block_alloc;
        verdict.size = 20 * MiB;
        verdict.address = 1 * MiB;
        verdict.stack = request_stack;
        verdict.result = 2;
        b.pop();
    }
};

Report report_of(const Trace& trace, FindingsFile findings = {}) {
    Report report;
    RankReport r;
    r.analysis = analyzed(trace);
    report.ranks.push_back(std::move(r));
    report.findings = std::move(findings);
    report.findings_found = !report.findings.findings.empty();
    return report;
}

Finding weight_copies(uint64_t alive_seq, uint64_t freed_seq, uint64_t freed_free_seq) {
    Finding f;
    f.plugin = "weight-copy-accumulation";
    f.severity = Severity::error;
    f.rank = 0;
    f.layer = "layers.0";
    f.phase = "forward";
    f.basis = "proven";
    Evidence alive;
    alive.size = 30 * MiB;
    alive.alloc_seq = alive_seq;
    Evidence freed;
    freed.size = 1 * MiB;
    freed.alloc_seq = freed_seq;
    freed.free_seq = freed_free_seq;
    f.evidence = {alive, freed};
    f.bytes = 31 * MiB;
    f.count = 2;
    return f;
}

}  // namespace

TEST_CASE("the out-of-memory moment is the allocator's verdict, with what was live at it") {
    TempDir t;
    OomRun run;
    const Trace trace = load_trace(run.b.write(t / "rank0.trace"));
    const TraceAnalysis a = analyzed(trace);
    CHECK(a.oom_events == 3);
    CHECK(a.oom_moments_total == 1);
    CHECK(a.recovered_failures == 0);
    REQUIRE(a.ooms.size() == 1);
    const OomMoment& m = a.ooms[0];
    CHECK(m.by_allocator);
    CHECK_FALSE(m.continued);
    CHECK(m.failed_calls == 2);
    CHECK(m.requested == 20 * MiB);
    CHECK(m.device_free == 1 * MiB);
    CHECK(m.step == 3);
    CHECK(m.layer == "layers.2");
    CHECK(m.phase == "forward");
    CHECK(m.stack == run.request_stack);
    CHECK(m.allocated == 50 * MiB);
    CHECK(m.allocated_count == 2);
    CHECK(m.reserved_known);
    CHECK(m.reserved == 64 * MiB);
    REQUIRE(m.by_tag.size() == 2);
    CHECK(m.by_tag[0].layer == "layers.0");
    CHECK(m.by_tag[0].bytes == 30 * MiB);
    CHECK(m.by_tag[1].layer == "layers.1");
    CHECK(m.by_tag[1].bytes == 20 * MiB);
    REQUIRE(m.sites.size() == 2);
    CHECK(m.sites[0].bytes == 30 * MiB);
}

TEST_CASE(
    "an untagged moment (the optimizer, autograd between hooks) names the last layer tagged "
    "in its step, on any thread") {
    TempDir t;
    TraceBuilder b;
    b.segment(0x10000000, 64 * MiB);
    b.step(1);
    b.push("layers.5", "forward");
    b.block(0x10000000, 1 * MiB);
    b.pop();
    b.step(2);
    b.push("layers.0", "forward");
    b.block(0x10100000, 1 * MiB);
    b.pop();
    b.push("layers.1", "backward", 2);  // autograd's thread
    b.block(0x10200000, 1 * MiB, 0, 2);
    b.pop(2);
    b.push("", "optimizer");
    b.block_oom(8 * MiB);
    b.pop();
    b.block(0x10300000, 1 * MiB);  // each moment caught, the program went on
    b.step(3);
    b.block_oom(8 * MiB);  // nothing tagged in step 3 before it
    b.block(0x10400000, 1 * MiB);
    b.push("layers.0", "forward");
    b.block_oom(8 * MiB);
    b.pop();
    const Trace trace = load_trace(b.write(t / "rank0.trace"));
    const TraceAnalysis a = analyzed(trace);
    REQUIRE(a.ooms.size() == 3);
    CHECK(a.ooms[0].layer.empty());
    CHECK(a.ooms[0].phase == "optimizer");
    CHECK(a.ooms[0].last_layer == "layers.1");
    CHECK(a.ooms[0].last_phase == "backward");
    CHECK(contains(oom_headline(a, a.ooms[0]),
                   "at step 2, (untagged) optimizer (after layers.1 backward, the last layer "
                   "tagged), "));
    CHECK(a.ooms[1].last_layer.empty());  // not step 2's layers
    CHECK_FALSE(contains(oom_headline(a, a.ooms[1]), "the last layer tagged"));
    CHECK(a.ooms[2].layer == "layers.0");
    CHECK(a.ooms[2].last_layer.empty());
    const std::string json = render_json(report_of(trace));
    CHECK(contains(json, "\"last_layer\": \"layers.1\", \"last_phase\": \"backward\""));
}

TEST_CASE(
    "a moment names the parameter its thread was processing when the program says so, on that "
    "thread and step only") {
    TempDir t;
    TraceBuilder b;
    const uint32_t qkv = b.param("layers.0.qkv", "weight");
    const uint32_t fc1 = b.param("layers.3.fc1", "bias");
    const auto processing = [&b](uint32_t param, uint64_t count, uint32_t tid) {
        Event& e = b.add(EventKind::mark, tid);  // allocscope_oom_parameter
        e.aux = b.str(ALLOCSCOPE_OOM_PARAM_MARK);
        e.address = param;
        e.size = count;
    };
    b.segment(0x10000000, 64 * MiB);
    b.step(1);
    b.push("layers.1", "backward");
    b.block(0x10000000, 1 * MiB);
    b.pop();
    b.push("", "optimizer");
    b.block_oom(8 * MiB);  // thread 1
    b.block_oom(4 * MiB, 0, 2);
    processing(qkv, 1, 1);
    b.pop();
    b.block(0x10100000, 1 * MiB);  // caught: the program went on
    b.step(2);
    b.block_oom(8 * MiB);
    processing(fc1, 48, 1);  // a foreach step's lists
    b.block(0x10200000, 1 * MiB);
    b.step(3);
    b.block_oom(8 * MiB);
    b.step(4);
    processing(qkv, 1, 1);  // a later step's mark names no earlier moment
    const Trace trace = load_trace(b.write(t / "rank0.trace"));
    const TraceAnalysis a = analyzed(trace);
    REQUIRE(a.ooms.size() == 4);
    CHECK(a.ooms[0].parameter == "layers.0.qkv.weight");
    CHECK(a.ooms[0].parameter_count == 1);
    CHECK(contains(oom_headline(a, a.ooms[0]),
                   "at step 1, (untagged) optimizer (processing parameter layers.0.qkv.weight; "
                   "after layers.1 backward, the last layer tagged), "));
    CHECK(a.ooms[1].tid == 2);
    CHECK(a.ooms[1].parameter.empty());  // another thread's moment
    CHECK(a.ooms[2].parameter == "layers.3.fc1.bias");
    CHECK(a.ooms[2].parameter_count == 48);
    CHECK(contains(oom_headline(a, a.ooms[2]),
                   "(processing 48 parameters together, the first layers.3.fc1.bias), "));
    CHECK(a.ooms[3].parameter.empty());
    CHECK_FALSE(contains(oom_headline(a, a.ooms[3]), "processing"));
    const std::string json = render_json(report_of(trace));
    CHECK(contains(json, "\"parameter\": \"layers.0.qkv.weight\", \"parameter_count\": 1"));
}

TEST_CASE("a failed call followed by a successful allocation on its thread was recovered from") {
    TempDir t;
    TraceBuilder b;
    b.segment(0x10000000, 8 * MiB);
    b.oom(16 * MiB);  // cudaMalloc fails, the cache is freed ...
    b.segment_free(0x10000000);
    b.segment(0x20000000, 16 * MiB);  // ... and the retry succeeds
    b.oom(32 * MiB, 2);               // another thread: fails and never allocates again
    const TraceAnalysis a = analyzed(load_trace(b.write(t / "rank0.trace")));
    CHECK(a.oom_events == 2);
    CHECK(a.recovered_failures == 1);
    CHECK(a.oom_moments_total == 1);
    REQUIRE(a.ooms.size() == 1);
    const OomMoment& m = a.ooms[0];
    CHECK_FALSE(m.by_allocator);
    CHECK(m.tid == 2);
    CHECK(m.requested == 32 * MiB);
    CHECK(m.api == "cudaMalloc");
    CHECK(m.failed_calls == 1);
    // Without blocks, allocated is the device segments; reserved is not separate.
    CHECK_FALSE(m.reserved_known);
    CHECK(m.allocated == 16 * MiB);
}

TEST_CASE("an out-of-memory error the program caught stays a moment, marked as continued") {
    TempDir t;
    TraceBuilder b;
    b.segment(0x10000000, 8 * MiB);
    b.block_oom(64 * MiB);
    b.block(0x10000000, 1 * MiB);  // it went on with a smaller request
    const TraceAnalysis a = analyzed(load_trace(b.write(t / "rank0.trace")));
    REQUIRE(a.ooms.size() == 1);
    CHECK(a.ooms[0].by_allocator);
    CHECK(a.ooms[0].continued);
    CHECK(a.ooms[0].allocated == 0);
}

TEST_CASE("of many out-of-memory moments the last ones are kept in full, all are counted") {
    TempDir t;
    TraceBuilder b;
    b.segment(0x10000000, 8 * MiB);
    for (int i = 0; i < 6; ++i) {
        b.block_oom(uint64_t(i + 1) * MiB);
        b.block(0x10000000, 1024);
        b.block_free(0x10000000);
    }
    AnalysisOptions options;
    options.oom_moments = 4;
    const TraceAnalysis a = analyzed(load_trace(b.write(t / "rank0.trace")), options);
    CHECK(a.oom_moments_total == 6);
    REQUIRE(a.ooms.size() == 4);
    CHECK(a.ooms.front().requested == 3 * MiB);
    CHECK(a.ooms.back().requested == 6 * MiB);
}

TEST_CASE("the reports open with the out-of-memory moment and the findings' share of it") {
    TempDir t;
    OomRun run;
    const Trace trace = load_trace(run.b.write(t / "rank0.trace"));
    FindingsFile findings;
    findings.findings.push_back(weight_copies(run.kept_seq, run.freed_seq, run.freed_free_seq));
    const Report report = report_of(trace, findings);

    const std::vector<OomShare> shares =
        oom_shares(report, report.ranks[0], report.ranks[0].analysis.ooms[0]);
    REQUIRE(shares.size() == 1);
    CHECK(shares[0].bytes == 30 * MiB);  // the freed 1 MiB copy is not part of it
    CHECK(shares[0].count == 1);

    const std::string text = render_text(report);
    const size_t oom = text.find("== out of memory ==");
    REQUIRE(oom != std::string::npos);
    CHECK(oom < text.find("== run =="));
    CHECK(text.find("rank 0: out of memory at step 3, layers.2 forward") != std::string::npos);
    CHECK(
        text.find(
            "20.0 MiB requested on device 0, for which the allocator asked for a 20.0 MiB segment "
            "(PyTorch's \"Tried to allocate\") (the caching allocator gave up after 2 failed "
            "device allocation(s)); device free 1.00 MiB") != std::string::npos);
    CHECK(text.find("allocated 50.0 MiB in 2 allocation(s); reserved 64.0 MiB (14.0 MiB cached, "
                    "not allocated)") != std::string::npos);
    CHECK(text.find("error weight-copy-accumulation (layers.0 forward) held 30.0 MiB of the 50.0 "
                    "MiB allocated, in 1 allocation(s)") != std::string::npos);
    CHECK(text.find("failed allocations (oom): 3, largest request 20.0 MiB; 1 out-of-memory "
                    "moment(s), 0 failed call(s) recovered from") != std::string::npos);

    const json::Value v = json::parse(render_json(report));
    const json::Value& moments = v.at("out_of_memory");
    REQUIRE(moments.items.size() == 1);
    const json::Value& m = moments.items[0];
    CHECK(m.at("rank").as_i64() == 0);
    CHECK(m.at("requested").as_u64() == 20 * MiB);
    CHECK(m.at("device_free").as_u64() == 1 * MiB);
    CHECK(m.at("allocated").as_u64() == 50 * MiB);
    CHECK(m.at("reserved").as_u64() == 64 * MiB);
    CHECK(m.at("by_allocator").boolean);
    CHECK(m.at("failed_calls").as_u64() == 2);
    REQUIRE(m.at("findings").items.size() == 1);
    CHECK(m.at("findings").items[0].at("bytes").as_u64() == 30 * MiB);
    CHECK(m.at("by_tag").items[0].at("layer").text == "layers.0");
    CHECK(v.at("ranks").items[0].at("oom_moments").as_u64() == 1);

    const std::string html = render_html(report);
    const size_t section = html.find("<h2 id=oom>Out of memory</h2>");
    REQUIRE(section != std::string::npos);
    CHECK(section < html.find("<h2 id=findings>"));
    CHECK(html.find("20.0 MiB requested") != std::string::npos);
    CHECK(html.find("30.0 MiB of 50.0 MiB") != std::string::npos);

    const std::string summary =
        oom_summary(report, report.ranks[0], report.ranks[0].analysis.ooms[0]);
    CHECK(summary.starts_with("rank 0: out of memory at step 3, layers.2 forward"));
    CHECK(summary.find("held 30.0 MiB of the 50.0 MiB allocated") != std::string::npos);
}

TEST_CASE("a report without an out-of-memory moment has no such section") {
    TempDir t;
    TraceBuilder b;
    b.segment(0x10000000, 8 * MiB);
    b.oom(16 * MiB);
    b.segment(0x20000000, 16 * MiB);  // recovered
    const Report report = report_of(load_trace(b.write(t / "rank0.trace")));
    CHECK(render_text(report).find("== out of memory ==") == std::string::npos);
    CHECK(render_html(report).find("id=oom") == std::string::npos);
    CHECK(json::parse(render_json(report)).at("out_of_memory").items.empty());
}

TEST_CASE("diff measures a run that ran out of memory up to there and says so") {
    TempDir t;
    TraceBuilder b;
    b.segment(0x10000000, 64 * MiB);
    uint64_t address = 0x10000000;
    for (uint64_t step = 0; step < 3; ++step) {
        b.step(step);
        for (int layer = 0; layer < 2; ++layer) {
            b.push("layers." + std::to_string(layer), "forward");
            b.block(address, 1 * MiB);
            address += 1 * MiB;
            b.pop();
        }
        b.push("layers.1", "backward");
        if (step == 2) {
            b.block_oom(40 * MiB);  // dies in the last step's backward
            break;
        }
        b.pop();
        b.push("", "optimizer");
        b.pop();
    }
    const RunMeasure m = measured(load_trace(b.write(t / "rank0.trace")));
    REQUIRE(m.oom.has_value());
    CHECK(m.oom->step == 2);
    CHECK(m.oom->layer == "layers.1");
    CHECK(m.oom->phase == "backward");
    CHECK(m.oom->requested == 40 * MiB);
    CHECK(m.backward_steps == 1);  // steps 0 and 1 complete, the first dropped as warm-up
    CHECK(m.forward_steps == 2);   // step 2's forward did end
    const RankDiff d = diff_runs(m, m, {});
    CHECK(diff_text({d}, {}).find("CAND ran out of memory at step 2, layers.1 backward (40.0 MiB "
                                  "requested)") != std::string::npos);
    CHECK(json::parse(diff_json({d}, {}))
              .at("ranks")
              .items[0]
              .at("cand")
              .at("oom")
              .at("step")
              .as_u64() == 2);
}

TEST_CASE("perfetto marks every failed request, the allocator's verdict as out of memory") {
    TempDir t;
    OomRun run;
    const Trace trace = load_trace(run.b.write(t / "rank0.trace"));
    ExportWriter out;
    PerfettoExport perfetto(out, trace.header.start_wall_ns);
    perfetto.add(trace, {});
    perfetto.finish();
    const json::Value v = json::parse(out.str());
    int verdicts = 0, failed = 0;
    for (const json::Value& e : v.at("traceEvents").items) {
        if (e.at("ph").text != "i" || e.at("cat").text != "oom") continue;
        if (e.at("name").text == "out of memory") {
            ++verdicts;
            CHECK(e.at("args").at("requested").as_u64() == 20 * MiB);
            CHECK(e.at("args").at("device_free").as_u64() == 1 * MiB);
            CHECK(e.at("args").at("layer").text == "layers.2");
        } else {
            CHECK(e.at("name").text == "failed allocation");
            ++failed;
        }
    }
    CHECK(verdicts == 1);
    CHECK(failed == 2);
}

TEST_CASE(
    "the moment's figures are PyTorch's: reserved is the allocator's segments, plain driver "
    "allocations are outside it, and the segment asked for is its rule's") {
    TempDir t;
    TraceBuilder b{0};
    b.step(0);
    b.segment(0x10000000, 64 * MiB);  // the caching allocator's cudaMalloc
    // A library's own workspace (cuBLAS takes it with cuMemAlloc_v2).
    Event& workspace = b.add(EventKind::alloc, 1);
    workspace.level = Level::segment;
    workspace.memory = MemoryKind::device;
    workspace.api = Api::cuMemAlloc_v2;
    workspace.address = 0x30000000;
    workspace.size = 32 * MiB;
    b.push("layers.0", "backward");
    b.block(0x10000000, 40 * MiB);
    Event& verdict = b.add(EventKind::oom, 1);
    verdict.level = Level::block;
    verdict.memory = MemoryKind::device;
    verdict.api = Api::block_alloc;
    verdict.size = 1583104;  // 1.51 MiB: a block the allocator places in a 20 MiB segment
    verdict.address = 1 * MiB;
    verdict.result = 2;
    b.pop();
    const Trace trace = load_trace(b.write(t / "rank0.trace"));
    const TraceAnalysis a = analyzed(trace);
    REQUIRE(a.ooms.size() == 1);
    const OomMoment& m = a.ooms[0];
    CHECK(m.allocated == 40 * MiB);
    CHECK(m.reserved == 64 * MiB);
    CHECK(m.outside_allocator == 32 * MiB);
    CHECK(m.segment_asked == 20 * MiB);
    const std::string text = render_text(report_of(trace));
    CHECK(contains(text,
                   "1.51 MiB requested on device 0, for which the allocator asked for a "
                   "20.0 MiB segment (PyTorch's \"Tried to allocate\")"));
    CHECK(contains(text,
                   "reserved 64.0 MiB (24.0 MiB cached, not allocated); outside the "
                   "allocator 32.0 MiB"));
    const json::Value doc = json::parse(render_json(report_of(trace)));
    const json::Value& moment = doc.at("out_of_memory").items.at(0);
    CHECK(moment.at("reserved").as_u64() == 64 * MiB);
    CHECK(moment.at("outside_allocator").as_u64() == 32 * MiB);
    CHECK(moment.at("segment_asked").as_u64() == 20 * MiB);
    // The rule's three ranges: small blocks share 2 MiB segments, blocks of
    // 10 MiB and more get their size rounded up to 2 MiB.
    for (const auto& [block, segment] : {std::pair<uint64_t, uint64_t>{512 * 1024, 2 * MiB},
                                         {1 * MiB, 2 * MiB},
                                         {10 * MiB, 10 * MiB},
                                         {10 * MiB + 1, 12 * MiB}}) {
        CAPTURE(block);
        verdict.size = block;
        const Trace again = load_trace(b.write(t / ("rank0-" + std::to_string(block) + ".trace")));
        CHECK(analyzed(again).ooms.at(0).segment_asked == segment);
    }
}

namespace {

// The allocator's counters as a bridge passes them (allocscope_allocator_counters).
void counters(TraceBuilder& b, uint64_t allocated, uint64_t reserved, uint64_t device_used) {
    Event& e = b.add(EventKind::mark, 1);
    e.aux = b.str(ALLOCSCOPE_COUNTERS_MARK);
    e.address = allocated;
    e.size = reserved;
    e.stream = device_used;
    e.device = 0;
}

}  // namespace

TEST_CASE(
    "the self-check agrees where the allocator's counters are allocscope's live blocks and "
    "the segments that held one; a library's segment is outside the allocator") {
    TempDir t;
    TraceBuilder b;
    b.segment(0x10000000, 20 * MiB);           // the allocator's
    b.segment(0x30000000, 8 * MiB);            // a library's workspace (cudaMalloc)
    Event& nccl = b.add(EventKind::alloc, 1);  // a plain driver allocation
    nccl.level = Level::segment;
    nccl.memory = MemoryKind::device;
    nccl.api = Api::cuMemAlloc_v2;
    nccl.address = 0x40000000;
    nccl.size = 4 * MiB;
    for (uint64_t step = 0; step < 3; ++step) {
        b.step(step);
        counters(b, step * MiB, step ? 20 * MiB : 0, 100 * MiB);
        b.push("layers.0", "forward");
        b.block(0x10000000 + step * MiB, 1 * MiB);
        b.pop();
    }
    b.step(3);
    counters(b, 3 * MiB + 512, 20 * MiB, 100 * MiB);  // 512 B allocscope never saw
    const Trace trace = load_trace(b.write(t / "rank0.trace"));
    const TraceAnalysis a = analyzed(trace);
    const CounterSummary& cs = a.counters;
    CHECK(cs.checks == 4);
    CHECK(cs.agree == 3);
    CHECK(cs.uncompared == 0);
    REQUIRE(cs.first_difference);
    CHECK(cs.first_difference->step == 3);
    CHECK(cs.first_difference->seen_allocated == 3 * MiB);
    CHECK(cs.first_difference->allocated == 3 * MiB + 512);
    CHECK(cs.first_difference->seen_reserved == 20 * MiB);
    REQUIRE(cs.last);
    CHECK(cs.last->seen_outside == 12 * MiB);
    const std::vector<std::string> lines = counter_lines(a);
    REQUIRE(lines.size() == 2);
    CHECK(lines[0] ==
          "self-check: differs from the allocator at 1 of 4 steps; first at step 3: allocated "
          "3.00 MiB by its count, 3.00 MiB by allocscope's (-512 B); reserved 20.0 MiB by its "
          "count, 20.0 MiB by allocscope's (+0 B)");
    CHECK(lines[1] ==
          "device memory in use at step 3 (the driver's count): 100 MiB; the allocator's "
          "segments 20.0 MiB; outside the allocator 80.0 MiB: 12.0 MiB in libraries' own "
          "allocations allocscope saw (NCCL buffers, cuBLAS workspaces), 68.0 MiB it did not "
          "see (the CUDA context, libraries' code and static buffers)");
    const std::string text = render_text(report_of(trace));
    CHECK(contains(text, "  self-check: differs from the allocator at 1 of 4 steps"));
    const json::Value v = json::parse(render_json(report_of(trace)));
    const json::Value& check = v.at("ranks").items[0].at("allocator_check");
    CHECK(check.at("checks").as_u64() == 4);
    CHECK(check.at("agree").as_u64() == 3);
    CHECK(check.at("first_difference").at("step").as_u64() == 3);
}

TEST_CASE(
    "the self-check says it agrees at every step where it does, and nothing where no "
    "counters were passed") {
    TempDir t;
    TraceBuilder b;
    b.segment(0x10000000, 20 * MiB);
    b.step(0);
    b.block(0x10000000, 2 * MiB);
    counters(b, 2 * MiB, 20 * MiB, 0);
    b.step(1);
    counters(b, 2 * MiB, 20 * MiB, 0);
    const TraceAnalysis a = analyzed(load_trace(b.write(t / "rank0.trace")));
    CHECK(counter_lines(a) ==
          std::vector<std::string>{
              "self-check: agrees with the allocator at 2 of 2 steps (allocated and reserved)"});
    TraceBuilder none;
    none.segment(0x10000000, 20 * MiB);
    none.block(0x10000000, 2 * MiB);
    CHECK(counter_lines(analyzed(load_trace(none.write(t / "none.trace")))).empty());
}

TEST_CASE(
    "without per-tensor blocks, a caching allocator's plain segments are its reserve: the "
    "self-check and the moment give reserved, and allocated is not claimed") {
    // PyTorch's native allocator without the bridge (its OOM observer gives
    // the verdict): the segments are what it reserved.
    TempDir t;
    TraceBuilder b;
    b.segment(0x10000000, 20 * MiB);
    b.step(0);
    counters(b, 3 * MiB, 20 * MiB, 0);
    b.step(1);
    b.segment(0x30000000, 20 * MiB);
    counters(b, 9 * MiB, 40 * MiB, 0);
    b.push("layers.1", "backward");
    b.block_oom(20 * MiB);
    b.pop();
    const Trace trace = load_trace(b.write(t / "rank0.trace"));
    const TraceAnalysis a = analyzed(trace);
    CHECK(a.counters.checks == 2);
    CHECK(a.counters.agree == 2);
    CHECK(counter_lines(a) ==
          std::vector<std::string>{"self-check: agrees with the allocator at 2 of 2 steps "
                                   "(reserved; allocated is not seen without per-tensor blocks)"});
    REQUIRE(a.ooms.size() == 1);
    const OomMoment& m = a.ooms[0];
    CHECK_FALSE(m.allocated_known);
    CHECK(m.reserved_known);
    CHECK(m.reserved == 40 * MiB);
    const json::Value v = json::parse(render_json(report_of(trace)));
    const json::Value& moment = v.at("out_of_memory").items.at(0);
    CHECK(moment.at("allocated").type == json::Value::Type::null);
    CHECK(moment.at("reserved").as_u64() == 40 * MiB);
    CHECK(contains(render_text(report_of(trace)),
                   "reserved 40.0 MiB in 2 segment(s) (allocated is not seen without per-tensor "
                   "blocks)"));

    // The same segments from cudaMallocAsync (backend:cudaMallocAsync): each
    // is a tensor, allocated, and reserved is not claimed.
    TraceBuilder async;
    Event& s = async.add(EventKind::alloc, 1);
    s.level = Level::segment;
    s.memory = MemoryKind::device;
    s.api = Api::cudaMallocAsync;
    s.address = 0x10000000;
    s.size = 3 * MiB;
    async.step(0);
    counters(async, 3 * MiB, 20 * MiB, 0);
    const TraceAnalysis aa = analyzed(load_trace(async.write(t / "async.trace")));
    CHECK(counter_lines(aa) ==
          std::vector<std::string>{"self-check: agrees with the allocator at 1 of 1 steps "
                                   "(allocated)"});
}
