// Reports and diffs on the sim harness's traces: what `allocscope run`
// writes (report.txt, report.html), what the analysis says about a run
// (checked against the trace itself), the HTML's escaping, and `allocscope
// diff` on the reference test's comparisons.
// Longer than 600 lines: the cases share one harness run per shape, made
// once for the whole file.
// Environment (tests/meson.build): E2E_CLI, HARNESS.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "analysis.h"
#include "diff.h"
#include "findings.h"
#include "findings_reader.h"
#include "fp8/layout.h"
#include "frames.h"
#include "json.h"
#include "replay.h"
#include "report.h"
#include "support.h"
#include "trace_reader.h"
#include "weight_sizes.h"

namespace fs = std::filesystem;
using namespace allocscope;
namespace fp8 = allocscope::harness::fp8;

namespace {

using namespace allocscope::test;

const char* const kShape = " --ranks 2 --layers 2 --steps 3 --warmup 1";

void run_harness(const fs::path& dir, const std::string& args) {
    REQUIRE(sh(env("E2E_CLI") + " run --force --out " + dir.string() + " -- " + env("HARNESS") +
               " --backend sim" + kShape + " " + args) == 0);
}

// The layer cells of an HTML report (styled as clickable, class=pick) whose
// row names no layer group for the script to select (no data-g).
size_t layer_cells_selecting_nothing(const std::string& html) {
    size_t n = 0;
    for (size_t at = html.find("<td class=pick>"); at != std::string::npos;
         at = html.find("<td class=pick>", at + 1)) {
        const size_t row = html.rfind("<tr", at);
        n += row == std::string::npos || html.compare(row, 12, "<tr data-g=\"") != 0;
    }
    return n;
}

}  // namespace

TEST_CASE(
    "a sim harness run out of device memory: the report opens with the moment, the seed's "
    "copies are part of it, and the fixed configuration gets no error or warning from it") {
    for (const std::string te : {"seed", "fixed"}) {
        CAPTURE(te);
        // The limit: 1 MiB below the device segments' peak of the same run
        // without one, so the run fails where it needs the most.
        TempDir free_run;
        run_harness(free_run.dir, "--recipe delayed --te " + te);
        const TraceAnalysis whole = analyze(load_trace((free_run / "rank0.trace").string()));
        REQUIRE(whole.pool(Pool::device_segment) != nullptr);
        const uint64_t limit = whole.pool(Pool::device_segment)->peak_bytes - (1 << 20);
        TempDir t;
        std::string out, err;
        const int rc =
            sh("ALLOCSCOPE_SIM_MEMORY_LIMIT=" + std::to_string(limit) + " " + env("E2E_CLI") +
                   " run --force --out " + t.dir.string() + " -- " + env("HARNESS") +
                   " --backend sim" + kShape + " --recipe delayed --te " + te,
               &out, &err);
        CHECK(rc == 1);  // the rank that ran out exits 1, and so does the launcher
        CHECK(contains(err, "allocscope-harness: out of device memory"));
        const size_t summary = err.rfind(": out of memory at step ");
        REQUIRE(summary != std::string::npos);
        CHECK(summary > err.find("report: " + (t / "report.txt").string()));  // the last lines
        const std::string text = slurp(t / "report.txt");
        const size_t section = text.find("== out of memory ==");
        REQUIRE(section != std::string::npos);
        CHECK(section < text.find("== run =="));
        const std::string html = slurp(t / "report.html");
        CHECK(contains(html, "<h2 id=oom>Out of memory</h2>"));
        // The moment's rows of findings and layers select their layer.
        CHECK(layer_cells_selecting_nothing(html) == 0);

        size_t moments = 0;
        std::vector<uint64_t> live_at_moment;
        for (const char* rank : {"rank0.trace", "rank1.trace"}) {
            const TraceAnalysis a = analyze(load_trace((t / rank).string()));
            for (const OomMoment& m : a.ooms) {
                ++moments;
                CHECK(m.by_allocator);
                CHECK(m.failed_calls >= 1);  // cudaMalloc failed, the cache went, it failed again
                CHECK(m.requested > 0);
                CHECK(m.reserved_known);
                CHECK(m.reserved <= limit);
                CHECK(m.allocated <= m.reserved);
                CHECK_FALSE(m.layer.empty());
                CHECK(contains(text, "rank " + std::to_string(a.header.rank) +
                                         ": out of memory at step " + std::to_string(m.step)));
                live_at_moment.insert(live_at_moment.end(), m.live_seqs.begin(), m.live_seqs.end());
            }
        }
        CHECK(moments >= 1);
        // Both ranks' findings: the one that ran out exited through its own
        // exit path, the other finished on the launcher's SIGTERM.
        const FindingsFile findings = read_findings_file((t / "findings.json").string());
        std::set<int32_t> ranks;
        for (const RankRun& r : findings.ranks)
            ranks.insert(r.rank);
        CHECK(ranks == std::set<int32_t>{0, 1});
        if (te == "fixed") {
            CHECK(count_at_least(findings, Severity::warning) == 0);
        } else {
            CHECK(count_at_least(findings, Severity::error) > 0);
            CHECK(contains(text, "error weight-copy-accumulation (layers."));  // a share
        }
    }
}

TEST_CASE("allocscope run writes report.txt and report.html covering every rank and finding") {
    TempDir t;
    run_harness(t.dir, "--recipe delayed --te seed");
    const std::string text = slurp(t / "report.txt");
    const std::string html = slurp(t / "report.html");
    REQUIRE_FALSE(text.empty());
    REQUIRE_FALSE(html.empty());
    CHECK(contains(text, "2 trace(s), ranks 0–1"));
    CHECK(contains(text, "by (layer, phase), block bytes, all ranks added up"));
    CHECK(contains(text, "top allocation sites at the peak"));
    // Every rank's own sections are the full report's.
    std::string full;
    REQUIRE(sh(env("E2E_CLI") + " report --full " + t.dir.string(), &full) == 0);
    CHECK(contains(full, "== rank 0:"));
    CHECK(contains(full, "== rank 1:"));
    CHECK(contains(full, "== all ranks =="));
    CHECK(contains(text, "weight-copy-accumulation"));
    // Stacks are symbolized: the harness's own frames carry function names
    // and source lines.
    CHECK(contains(text, "trainer.cpp:"));
    CHECK(contains(html, "<div class=timeline data-r=0>"));
    CHECK(contains(html, "<div class=timeline data-r=1>"));
    CHECK(contains(html, "class=finding"));
    // One data object and the script that draws it; nothing loaded from
    // elsewhere: the only URL is the SVG namespace (a name, not a download).
    CHECK(count_lines(html, "<script") == 2);
    CHECK(contains(html, "<script type=\"application/json\" id=allocscope-data>"));
    CHECK_FALSE(contains(html, " src="));
    size_t urls = 0, svg_namespace = 0;
    for (size_t p = html.find("http://"); p != std::string::npos; p = html.find("http://", p + 1)) {
        ++urls;
        svg_namespace += html.compare(p, 26, "http://www.w3.org/2000/svg") == 0;
    }
    CHECK(urls == svg_namespace);
    CHECK_FALSE(contains(html, "https://"));
}

namespace {

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);)
        lines.push_back(line);
    return lines;
}

// The first frame a concise stack shows after the line `at`: the lines
// indented `indent` deeper than it, past folds ("... 1 allocator frame")
// and evidence notes; "" when there is none. `folded` says whether a fold
// of allocator frames came first.
std::string first_shown_frame(const std::vector<std::string>& lines, size_t at,
                              const std::string& indent, bool& folded) {
    folded = false;
    for (size_t k = at + 1; k < lines.size() && lines[k].starts_with(indent); ++k) {
        const std::string line = lines[k].substr(indent.size());
        if (line.starts_with(" ")) continue;  // deeper: not this stack
        if (line.starts_with("... ")) {
            folded |= line.find("allocator frame") != std::string::npos;
            continue;
        }
        if (line.starts_with("derived from ")) continue;  // an evidence note
        return line;
    }
    return {};
}

// How often `part` occurs in `text`.
size_t occurrences(const std::string& text, const std::string& part) {
    size_t n = 0;
    for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1))
        ++n;
    return n;
}

// HTML element text as it reads: html_escape's five escapes undone.
std::string unescaped(std::string text) {
    for (const auto& [from, to] :
         {std::pair{"&lt;", "<"}, std::pair{"&gt;", ">"}, std::pair{"&quot;", "\""},
          std::pair{"&#39;", "'"}, std::pair{"&amp;", "&"}}) {
        for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + 1))
            text.replace(at, std::string_view(from).size(), to);
    }
    return text;
}

}  // namespace

TEST_CASE(
    "the HTML report of a 2-rank run agrees with the text: a row per finding it counts, stacks "
    "labelled by the program's frame, every layer cell selecting its layer") {
    TempDir t;
    run_harness(t.dir, "--recipe delayed --te seed");
    const std::string text = slurp(t / "report.txt");
    const std::string html = slurp(t / "report.html");
    // The text's count of findings is the HTML's, word for word, and the
    // HTML has a row for each finding counted: what both ranks found alike
    // once, naming them.
    const std::string opening = "\nfindings: ";
    const size_t at = text.find(opening);
    REQUIRE(at != std::string::npos);
    const size_t from = at + opening.size();
    const std::string counted = text.substr(from, text.find('\n', from) - from);
    CAPTURE(counted);
    CHECK(contains(html, "<p>" + html_escape(counted) + "</p>"));
    std::istringstream words(counted);
    size_t errors = 0, warnings = 0, infos = 0;
    std::string word;
    words >> errors >> word >> warnings >> word >> infos;
    const FindingsFile findings = read_findings_file((t / "findings.json").string());
    const size_t rows = occurrences(html, "<details class=finding>");
    MESSAGE("findings over both ranks " << findings.findings.size() << "; the text counts "
                                        << errors + warnings + infos << "; the HTML's rows "
                                        << rows);
    REQUIRE(errors > 0);
    CHECK(errors + warnings + infos < findings.findings.size());
    CHECK(rows == errors + warnings + infos);
    size_t of_both = 0;
    for (const FindingGroup& g : collapse_findings(findings))
        of_both += g.members.size() == 2;
    CHECK(of_both > 0);
    CHECK(occurrences(html, "</b> ranks 0–1 ") == of_both);
    // Every stack is labelled by the program's frame, the one the text's
    // stacks start at, never the harness's caching allocator's.
    size_t labels = 0;
    std::vector<std::string> others;
    const std::string label = "<summary>stack ";
    for (size_t p = html.find(label); p != std::string::npos; p = html.find(label, p + 1)) {
        const size_t begin = html.find(": ", p) + 2;
        const std::string frame = unescaped(html.substr(begin, html.find("</summary>", p) - begin));
        if (native_frame_kind(frame) != FrameKind::user ||
            !frame.starts_with("allocscope::harness::trainer::"))
            others.push_back(frame);
        ++labels;
    }
    MESSAGE("stack labels: " << labels << ", of them not the program's frame: " << others.size());
    INFO("the first labelled otherwise: " << (others.empty() ? "" : others[0]));
    CHECK(others.empty());
    CHECK(labels >= rows);  // each finding has evidence with a stack
    // Every layer styled as clickable is in a row that names its layer
    // group: the tables', the heat map's and the findings' evidence.
    CHECK(occurrences(html, "<td class=pick>") > rows);
    CHECK(layer_cells_selecting_nothing(html) == 0);
}

TEST_CASE(
    "the concise report of a 6-step 2-rank run: at most 200 lines, each finding once with "
    "both ranks, every stack from the program's code; --full has every finding and frame") {
    TempDir t;
    std::string out, err;
    REQUIRE(sh(env("E2E_CLI") + " run --force --out " + t.dir.string() + " -- " + env("HARNESS") +
                   " --backend sim --ranks 2 --layers 2 --steps 6 --warmup 1 --recipe delayed "
                   "--te seed",
               &out, &err) == 0);
    const std::string text = slurp(t / "report.txt");
    const std::vector<std::string> lines = lines_of(text);
    MESSAGE("report.txt: " << lines.size() << " lines");
    CHECK(lines.size() <= 200);
    const FindingsFile findings = read_findings_file((t / "findings.json").string());
    REQUIRE(count_at_least(findings, Severity::error) >= 2);
    // Both ranks find the same copies: each error once, "ranks 0–1".
    for (const Finding& f : findings.findings) {
        if (f.severity != Severity::error) continue;
        const std::string shown = summary_line(f, "ranks 0–1");
        CAPTURE(shown);
        CHECK(count_lines(text, shown) == 1);
        CHECK_FALSE(contains(text, summary_line(f)));  // never once per rank
    }
    // Sites and evidence: the allocator's frame folded, the program's next.
    size_t stacks = 0;
    for (size_t k = 0; k < lines.size(); ++k) {
        const bool site = lines[k].starts_with("  #");
        const bool evidence = lines[k].starts_with("      evidence: ");
        if (!site && !evidence) continue;
        bool folded = false;
        const std::string first = first_shown_frame(lines, k, site ? "      " : "        ", folded);
        CAPTURE(lines[k]);
        CAPTURE(first);
        REQUIRE_FALSE(first.empty());
        CHECK(folded);  // the harness's caching allocator
        CHECK(native_frame_kind(first) == FrameKind::user);
        CHECK(contains(first, "allocscope::harness::trainer::"));
        ++stacks;
    }
    // Five sites, and the evidence of at least one error of each detector
    // (errors from one site show it once).
    std::set<std::string> detectors;
    for (const Finding& f : findings.findings) {
        if (f.severity == Severity::error) detectors.insert(f.plugin);
    }
    CHECK(stacks >= 5 + detectors.size());

    std::string full;
    REQUIRE(sh(env("E2E_CLI") + " report --full " + t.dir.string(), &full) == 0);
    CHECK(lines_of(full).size() > lines.size());
    for (const Finding& f : findings.findings)
        CHECK(count_lines(full, summary_line(f)) == 1);
    // Every frame of every stack shown, in order: the sites' and the first
    // evidence of each finding, as the JSON report lists them.
    std::string json_text;
    REQUIRE(sh(env("E2E_CLI") + " report --format json " + t.dir.string(), &json_text) == 0);
    const json::Value report = json::parse(json_text);
    size_t checked = 0;
    for (const json::Value& rank : report.at("ranks").items) {
        for (const json::Value& site : rank.at("sites_at_peak").items) {
            std::string block;
            for (const json::Value& frame : site.at("frames").items)
                block += "      " + frame.text + "\n";
            REQUIRE(site.at("frames").items.size() >= 8);  // allocator to _start
            CHECK(contains(full, block));
            ++checked;
        }
    }
    CHECK(checked >= 10);
    // And each finding's first evidence stack, from its rank's stacks.
    const auto& ranks = report.at("ranks").items;
    size_t evidence = 0;
    for (const Finding& f : findings.findings) {
        if (f.evidence.empty() || f.evidence[0].stack_id == 0) continue;
        REQUIRE(f.rank >= 0);
        REQUIRE(size_t(f.rank) < ranks.size());
        const json::Value& frames =
            ranks[size_t(f.rank)].at("stacks").at(std::to_string(f.evidence[0].stack_id));
        std::string block;
        for (const json::Value& frame : frames.items)
            block += "        " + frame.text + "\n";
        CHECK(contains(full, block));
        ++evidence;
    }
    CHECK(evidence >= 6);
    CHECK(contains(full, "allocscope::harness::alloc::CachingAllocator::allocate"));
    CHECK(contains(full, "__libc_start_main"));
}

TEST_CASE(
    "the concise report of a recorded PyTorch FSDP2 run starts every site at the script's "
    "Python line, the bridge, allocator, libtorch and interpreter frames folded") {
    // Two ranks recorded on an H200 (tests/corpus/, labels.json): its module
    // files are not here, so native frames are module+offset.
    const std::string dir = env("CORPUS_DIR") + "/function-seed-t64";
    std::string concise, full;
    REQUIRE(sh(env("E2E_CLI") + " report " + dir, &concise) == 0);
    REQUIRE(sh(env("E2E_CLI") + " report --full " + dir, &full) == 0);
    const std::vector<std::string> lines = lines_of(concise);
    MESSAGE("concise " << lines.size() << " lines, --full " << lines_of(full).size());
    CHECK(lines.size() <= 200);
    size_t sites = 0;
    for (size_t k = 0; k < lines.size(); ++k) {
        if (!lines[k].starts_with("  #")) continue;
        CAPTURE(lines[k]);
        REQUIRE(k + 2 < lines.size());
        // One fold line: the bridge and c10's allocator, then libtorch.
        CHECK(lines[k + 1].starts_with("      ... 6 allocator frames, "));
        CHECK(contains(lines[k + 1], " framework frames"));
        bool folded = false;
        const std::string first = first_shown_frame(lines, k, "      ", folded);
        CHECK(folded);
        CHECK(contains(first, "/tests/gpu/fsdp2_fp8_train.py:"));
        CHECK(python_frame_kind(first) == FrameKind::user);
        ++sites;
    }
    CHECK(sites >= 5);
    CHECK(contains(concise, "on ranks 0–1"));
    // --full keeps them: the bridge's frame and torch's module wrappers.
    CHECK(contains(full, "liballocscope_torch_bridge.so+0x"));
    CHECK(contains(full, "libc10_cuda.so+0x"));
    CHECK(contains(full, "Module._call_impl ("));
    CHECK_FALSE(contains(concise, "Module._call_impl ("));
}

TEST_CASE("allocscope run prints errors and warnings once for both ranks, no info, one summary") {
    TempDir t;
    std::string out, err;
    REQUIRE(sh(env("E2E_CLI") + " run --force --out " + t.dir.string() + " -- " + env("HARNESS") +
                   " --backend sim" + kShape + " --recipe delayed --te seed",
               &out, &err) == 0);
    const FindingsFile findings = read_findings_file((t / "findings.json").string());
    size_t by[3] = {0, 0, 0};
    for (const Finding& f : findings.findings)
        ++by[static_cast<int>(f.severity)];
    REQUIRE(by[0] > 0);  // the peak owners: there are infos to leave out
    REQUIRE(by[2] > 0);
    CAPTURE(err);
    for (const std::string& line : lines_of(err))
        CHECK_FALSE(line.starts_with("info "));
    for (const Finding& f : findings.findings) {
        if (f.severity == Severity::error)
            CHECK(count_lines(err, summary_line(f, "ranks 0–1")) == 1);
    }
    // Findings the two ranks made alike count once, the count over the
    // ranks after them.
    size_t distinct[3] = {0, 0, 0};
    for (const FindingGroup& g : collapse_findings(findings))
        ++distinct[static_cast<int>(g.members[0]->severity)];
    CHECK(distinct[2] < by[2]);
    const std::string summary =
        "allocscope: " + std::to_string(distinct[2]) + " errors, " + std::to_string(distinct[1]) +
        " warnings, " + std::to_string(distinct[0]) + " infos on 2 ranks (" +
        std::to_string(by[2]) + ", " + std::to_string(by[1]) + " and " + std::to_string(by[0]) +
        " counting each rank's) — report: " + (t / "report.txt").string();
    CHECK(count_lines(err, summary) == 1);
    CHECK(lines_of(err).size() < 20);
}

TEST_CASE("the analysis agrees with the trace: peaks, live bytes at the peak and at exit") {
    TempDir t;
    run_harness(t.dir, "--recipe delayed --te seed");
    const Trace trace = load_trace((t / "rank0.trace").string());
    const TraceAnalysis a = analyze(trace);
    Replay replay;
    for (const Event& e : trace.events)
        replay.apply(e);
    REQUIRE(a.owner == Pool::device_block);
    const PoolSummary* blocks = a.pool(Pool::device_block);
    REQUIRE(blocks);
    CHECK(blocks->peak_bytes == replay.totals(Pool::device_block).peak_bytes);
    CHECK(blocks->live_bytes_at_exit == replay.totals(Pool::device_block).live_bytes);
    uint64_t at_peak = 0, at_exit = 0, allocated = 0;
    for (const TagStats& s : a.tags) {
        at_peak += s.at_peak;
        at_exit += s.at_exit;
        allocated += s.allocated_bytes;
    }
    CHECK(at_peak == blocks->peak_bytes);
    CHECK(at_exit == blocks->live_bytes_at_exit);
    CHECK(allocated == blocks->allocated_bytes);
    uint64_t site_bytes = 0;
    for (const Site& s : a.sites_at_peak)
        site_bytes += s.bytes;
    CHECK(site_bytes <= blocks->peak_bytes);
    // The timeline keeps the peak and its layers add up to the block total.
    uint64_t timeline_max = 0;
    for (const TimelinePoint& p : a.timeline.points) {
        timeline_max = std::max(timeline_max, p.block_bytes);
        uint64_t sum = 0;
        for (uint64_t b : p.layer_bytes)
            sum += b;
        CHECK(sum == p.block_bytes);
    }
    CHECK(timeline_max == blocks->peak_bytes);
    CHECK(a.timeline.layers.size() >= 2);
    CHECK(a.steps == 3);  // --steps counts the warm-up step
    bool forward = false, backward = false, optimizer = false;
    for (const PhaseBand& b : a.timeline.bands) {
        forward |= b.phase == "forward";
        backward |= b.phase == "backward";
        optimizer |= b.phase == "optimizer";
        CHECK(b.t_end_ns >= b.t_start_ns);
    }
    CHECK(forward);
    CHECK(backward);
    CHECK(optimizer);
}

TEST_CASE(
    "the harness's allocator counters agree with allocscope at every step on every rank, "
    "and the report says so once for the alike ranks") {
    TempDir t;
    run_harness(t.dir, "--recipe delayed --te seed");
    for (const char* rank : {"rank0.trace", "rank1.trace"}) {
        CAPTURE(rank);
        const TraceAnalysis a = analyze(load_trace((t / rank).string()));
        CHECK(a.owner == Pool::device_block);
        CHECK(a.counters.checks == 3);  // one at the start of each of the 3 steps
        CHECK(a.counters.agree == a.counters.checks);
        CHECK_FALSE(a.counters.first_difference);
    }
    const std::string text = slurp(t / "report.txt");
    CHECK(count_lines(text,
                      "self-check: agrees with the allocator at 3 of 3 steps (allocated "
                      "and reserved)") == 1);
    CHECK_FALSE(contains(text, "self-check: differs"));
}

TEST_CASE(
    "a rank that leaks alone stands out against the other ranks' median, naming what it "
    "holds extra; ranks of a healthy run do not") {
    const std::string shape = " --backend sim --ranks 4 --layers 2 --steps 10 --warmup 1";
    TempDir leak;
    REQUIRE(sh(env("E2E_CLI") + " run --force --out " + leak.dir.string() + " -- " +
               env("HARNESS") + shape + " --recipe bf16 --inject leak-rank:2") == 0);
    const FindingsFile findings = read_findings_file((leak / "findings.json").string());
    std::vector<Finding> cross;
    for (const Finding& f : findings.findings)
        if (f.plugin == "cross-rank-imbalance") cross.push_back(f);
    REQUIRE(cross.size() >= 1);
    for (const Finding& f : cross)
        CHECK(f.rank == 2);
    const auto warning = std::find_if(cross.begin(), cross.end(), [](const Finding& f) {
        return f.severity == Severity::warning;
    });
    REQUIRE(warning != cross.end());
    CHECK(warning->layer == "layers.0");
    CHECK(warning->count == 3);
    // One activation-sized block a step (32 KiB at this shape), kept: 9 of
    // them when step 9 began.
    CHECK(warning->bytes == 9 * 32 * 1024);
    CAPTURE(warning->summary);
    CHECK(contains(warning->summary, "rank 2 holds "));
    CHECK(contains(warning->summary,
                   " live when step 9 began, 288 KiB more than the median of "
                   "the 3 other rank(s) "));
    CHECK(contains(warning->summary, "; the extra: layers.0 +288 KiB"));
    // The report and check show it as the run does.
    CHECK(contains(slurp(leak / "report.txt"), "cross-rank-imbalance"));
    std::string out;
    sh(env("E2E_CLI") + " check --fail-on warning " + leak.dir.string(), &out);
    CHECK(contains(out, "cross-rank-imbalance"));
    // Made anew from the traces, never twice.
    CHECK(sh(env("E2E_CLI") + " report --format json " + leak.dir.string() + " -o " +
             (leak / "r.json").string()) == 0);
    const json::Value v = json::parse(slurp(leak / "r.json"));
    size_t in_json = 0;
    for (const json::Value& f : v.at("findings").at("findings").items)
        in_json += f.at("plugin").text == "cross-rank-imbalance";
    CHECK(in_json == cross.size());

    TempDir healthy;
    REQUIRE(sh(env("E2E_CLI") + " run --force --out " + healthy.dir.string() + " -- " +
               env("HARNESS") + shape + " --recipe bf16") == 0);
    for (const Finding& f : read_findings_file((healthy / "findings.json").string()).findings)
        CHECK_MESSAGE(f.plugin != "cross-rank-imbalance", f.summary);
}

TEST_CASE("strings from a trace cannot inject markup into the HTML report") {
    TempDir t;
    const std::string evil = "<script>document.title='owned'</script><img src=x onerror=alert(1)>";
    write_tagged_trace(t / "rank0.trace", evil, "forward\"><script>alert(2)</script>");
    const fs::path out = t / "report.html";
    REQUIRE(sh(env("E2E_CLI") + " report " + (t / "rank0.trace").string() + " --format html -o " +
               out.string()) == 0);
    const std::string html = slurp(out);
    CHECK(contains(html, "&lt;script&gt;document.title=&#39;owned&#39;&lt;/script&gt;"));
    // In the page's data the same text is a JSON string with '<' escaped.
    CHECK(contains(html, "\\u003cscript\\u003edocument.title='owned'\\u003c/script\\u003e"));
    CHECK(count_lines(html, "<script") == 2);  // the report's own two
    CHECK_FALSE(contains(html, "<script>document.title"));
    CHECK_FALSE(contains(html, "<img"));
}

TEST_CASE("a module that cannot be symbolized is noted once, whatever the number of traces") {
    // The traces name the harness binary they were recorded from; read
    // where that file is gone (traces copied off the machine), each rank's
    // trace would give the same note.
    TempDir t;
    const fs::path copy = t / "allocscope-harness";
    fs::copy_file(env("HARNESS"), copy);
    // Its libraries (the sim runtime) where the original finds them.
    const std::string libs = fs::path(env("HARNESS")).parent_path().string();
    REQUIRE(sh("LD_LIBRARY_PATH=" + libs + " " + env("E2E_CLI") + " run --force --out " +
               (t / "run").string() + " -- " + copy.string() +
               " --backend sim --ranks 4 --layers 2 --steps 2 --warmup 1") == 0);
    fs::remove(copy);
    std::string out;
    REQUIRE(sh(env("E2E_CLI") + " report " + (t / "run").string(), &out) == 0);
    CAPTURE(out);
    CHECK(count_lines(out, "note: cannot symbolize " + copy.string() + ": ") == 1);
    // --rank reads one trace: the same note, once.
    REQUIRE(sh(env("E2E_CLI") + " report " + (t / "run").string() + " --rank 2", &out) == 0);
    CHECK(count_lines(out, "note: cannot symbolize " + copy.string() + ": ") == 1);
    CHECK(out.find("allocscope report: 1 trace(s), rank 2") != std::string::npos);
}

TEST_CASE("check is as concise as the run: errors first, alike ranks once, infos counted") {
    TempDir t;
    run_harness(t.dir, "--recipe delayed --te seed");
    const FindingsFile findings = read_findings_file((t / "findings.json").string());
    std::string out, err;
    CHECK(sh(env("E2E_CLI") + " check " + t.dir.string(), &out, &err) == 3);
    CAPTURE(out);
    const std::vector<std::string> lines = lines_of(out);
    REQUIRE_FALSE(lines.empty());
    CHECK(lines[0].starts_with("error "));  // the first line is the first error
    for (const std::string& line : lines)
        CHECK_FALSE(line.starts_with("info "));
    for (const Finding& f : findings.findings) {
        if (f.severity == Severity::error)
            CHECK(count_lines(out, summary_line(f, "ranks 0–1")) == 1);
    }
    CHECK(count_lines(out, "check failed: ") == 1);
    CHECK(lines.size() < findings.findings.size() / 2);
    // --full lists every finding of every rank; --fail-on info lists infos.
    std::string full;
    CHECK(sh(env("E2E_CLI") + " check --full " + t.dir.string(), &full) == 3);
    CHECK(lines_of(full).size() > findings.findings.size());
    std::string infos;
    CHECK(sh(env("E2E_CLI") + " check --fail-on info " + t.dir.string(), &infos) == 3);
    size_t info_lines = 0;
    for (const std::string& line : lines_of(infos))
        info_lines += line.starts_with("info ");
    CHECK(info_lines > 0);
}

TEST_CASE("report, export, replay and diff refuse to write over what they read") {
    TempDir t;
    run_harness(t / "run", "--recipe bf16");
    const std::string cli = env("E2E_CLI");
    const fs::path run = t / "run";
    const std::string trace = slurp(run / "rank0.trace");
    const std::string findings = slurp(run / "findings.json");
    for (const std::string& command :
         {" report " + run.string() + " -o " + (run / "rank0.trace").string(),
          " report " + (run / "rank1.trace").string() + " -o " + (run / "rank1.trace").string(),
          " report " + run.string() + " -o " + (run / ".." / "run" / "findings.json").string(),
          " export --format perfetto " + run.string() + " -o " + (run / "findings.json").string(),
          " export --format collapsed " + run.string() + " -o " +
              (run / "findings.rank0.json").string(),
          " replay " + run.string() + " -o " + (run / "findings.json").string(),
          " diff " + run.string() + " " + run.string() + " -o " + (run / "rank0.trace").string()}) {
        CAPTURE(command);
        std::string out, err;
        CHECK(sh(cli + command, &out, &err) == 2);
        CHECK(count_lines(err, "allocscope:") == 1);
        CHECK(contains(err, "write it elsewhere"));
    }
    CHECK(slurp(run / "rank0.trace") == trace);
    CHECK(slurp(run / "findings.json") == findings);
    CHECK(sh(cli + " check " + run.string()) == 0);
    // Other names in the run's directory are the user's to choose.
    CHECK(sh(cli + " report " + run.string() + " -o " + (run / "again.txt").string()) == 0);
}

TEST_CASE(
    "a corrupt record ends its rank's trace there: the other ranks and its prefix are "
    "reported, with one warning") {
    TempDir t;
    run_harness(t / "run", "--recipe delayed --te seed");
    const fs::path run = t / "run";
    const std::string bad = (run / "rank1.trace").string();
    const size_t whole = load_trace(bad).events.size();
    std::string bytes = slurp(bad);
    REQUIRE(bytes.size() > 4096);
    bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x10);
    std::ofstream(bad, std::ios::binary | std::ios::trunc) << bytes;

    const Trace cut = load_trace(bad);  // no exception: the prefix
    CHECK(cut.corrupt);
    CHECK(cut.truncated);
    CHECK(cut.events.size() > 0);
    CHECK(cut.events.size() < whole);
    CHECK(contains(cut.truncation_message, bad));

    std::string out, err;
    CHECK(sh(env("E2E_CLI") + " report --full " + run.string(), &out, &err) == 0);
    CAPTURE(out);
    CHECK(count_lines(out, "warning: ") == 1);
    CHECK(count_lines(out, "warning: " + bad + ": ") == 1);
    CHECK(contains(out, "; reporting what precedes it"));
    CHECK(contains(out, "== rank 0: " + (run / "rank0.trace").string()));
    CHECK(contains(out, "== rank 1: " + bad));
    // The concise report says it too, once.
    CHECK(sh(env("E2E_CLI") + " report " + run.string(), &out) == 0);
    CHECK(count_lines(out, "warning: " + bad + ": ") == 1);
    // So do the other readers of traces.
    CHECK(sh(env("E2E_CLI") + " export --format perfetto " + run.string() + " -o " +
             (t / "p.json").string()) == 0);

    // A header that cannot be read: the other ranks are reported with a
    // note naming it; alone, it is the error.
    bytes = slurp(bad);
    bytes[20] = static_cast<char>(bytes[20] ^ 0x01);
    std::ofstream(bad, std::ios::binary | std::ios::trunc) << bytes;
    CHECK(sh(env("E2E_CLI") + " report " + run.string(), &out, &err) == 0);
    CHECK(count_lines(out, "note: " + bad + ": ") == 1);
    CHECK(contains(out, "this trace is not reported"));
    CHECK(sh(env("E2E_CLI") + " report " + bad, &out, &err) == 2);
    CHECK(count_lines(err, "allocscope:") == 1);

    // A readable header, then a corrupt record before the first event: as
    // unreadable (the streamed analysis's first pass throws, as load_trace).
    bytes[20] = static_cast<char>(bytes[20] ^ 0x01);
    bytes[kTraceHeaderSize + kRecordHeaderSize] =
        static_cast<char>(~bytes[kTraceHeaderSize + kRecordHeaderSize]);
    std::ofstream(bad, std::ios::binary | std::ios::trunc) << bytes;
    CHECK_THROWS_AS(load_trace(bad), TraceError);
    CHECK(sh(env("E2E_CLI") + " report " + run.string(), &out, &err) == 0);
    CHECK(count_lines(out, "note: " + bad + ": ") == 1);
    CHECK(contains(out, "this trace is not reported"));
    CHECK(contains(out, "allocscope report: 1 trace(s), rank 0\n"));
    CHECK(sh(env("E2E_CLI") + " report " + bad, &out, &err) == 2);
    CHECK(count_lines(err, "allocscope: " + bad + ": ") == 1);
}

TEST_CASE("report refuses unreadable input and an unwritable output with exit 2") {
    TempDir t;
    CHECK(sh(env("E2E_CLI") + " report " + (t / "missing").string()) == 2);
    std::ofstream((t / "bad.trace").string()) << "not a trace";
    CHECK(sh(env("E2E_CLI") + " report " + (t / "bad.trace").string()) == 2);
    run_harness(t / "run", "--recipe bf16");
    CHECK(sh(env("E2E_CLI") + " report " + (t / "run").string() + " --format html -o " +
             (t / "no-such-dir" / "r.html").string()) == 2);
    CHECK(sh(env("E2E_CLI") + " report " + (t / "run").string() + " --format pdf") == 2);
}

TEST_CASE(
    "diff: bf16 against itself passes, a seed run exceeds the forward threshold by its copies") {
    TempDir bf16, bf16_again, seed, fixed;
    run_harness(bf16.dir, "--recipe bf16");
    run_harness(bf16_again.dir, "--recipe bf16");
    run_harness(seed.dir, "--recipe delayed --te seed --arch sm90");
    run_harness(fixed.dir, "--recipe delayed --te fixed --arch sm90");
    const std::string cli = env("E2E_CLI");
    CHECK(sh(cli + " diff " + bf16.dir.string() + " " + bf16_again.dir.string()) == 0);
    CHECK(sh(cli + " diff " + bf16.dir.string() + " " + fixed.dir.string()) == 0);
    const fs::path json = seed.dir / "diff.json";
    CHECK(sh(cli + " diff " + bf16.dir.string() + " " + seed.dir.string() + " --format json -o " +
             json.string()) == 3);
    const std::string text = slurp(json);
    CHECK(contains(text, "\"forward_exceeded\": true"));
    CHECK(contains(text, "\"exceeded\": true"));
    // The excess per layer is the quantized copy (two layers: one
    // increment per step, the same on both ranks).
    const Trace b = load_trace((bf16.dir / "rank0.trace").string());
    const Trace s = load_trace((seed.dir / "rank0.trace").string());
    const RankDiff d = diff_runs(measure_run(b), measure_run(s), {});
    REQUIRE(d.forward_excess);
    const double q = double(forward_copy_bytes(fp8::Recipe::delayed, fp8::Arch::sm90));
    CHECK(*d.forward_excess == doctest::Approx(q).epsilon(0.05));
    CHECK(d.base.layers == std::vector<std::string>{"layers.1"});
    // A threshold above the excess passes.
    CHECK(sh(cli + " diff " + bf16.dir.string() + " " + seed.dir.string() +
             " --forward-threshold 4MiB") == 0);
}

TEST_CASE("the JSON report has live bytes after each layer's forward per step, and --baseline's") {
    TempDir seed, fixed;
    run_harness(seed.dir, "--recipe delayed --te seed --arch sm90");
    run_harness(fixed.dir, "--recipe delayed --te fixed --arch sm90");
    const std::string cli = env("E2E_CLI");
    const fs::path alone = seed.dir / "alone.json", compared = seed.dir / "compared.json";
    REQUIRE(sh(cli + " report " + seed.dir.string() + " --format json -o " + alone.string()) == 0);
    REQUIRE(sh(cli + " report " + seed.dir.string() + " --baseline " + fixed.dir.string() +
               " --format json -o " + compared.string()) == 0);
    CHECK(count_lines(slurp(alone), "\"baseline_forward_ends\": null") == 2);
    const std::string json = slurp(compared);
    CHECK(count_lines(json, "\"baseline_forward_ends\": null") == 0);
    // The numbers are step_memory's, the run's and the baseline's, rank by
    // rank; the seed run's second layer adds its kept copy on top of what
    // the fixed run's adds.
    auto entry = [](const StepMemory& s) {
        std::string e = "{\"step\": " + std::to_string(s.step) + ", \"layers\": [";
        for (size_t k = 0; k < s.forward_ends.size(); ++k)
            e += (k ? ", \"" : "\"") + s.forward_ends[k].first + "\"";
        e += "], \"live\": [";
        for (size_t k = 0; k < s.forward_ends.size(); ++k)
            e += (k ? ", " : "") + std::to_string(s.forward_ends[k].second);
        return e + "]}";
    };
    for (const char* rank : {"rank0.trace", "rank1.trace"}) {
        CAPTURE(rank);
        const std::vector<StepMemory> run = step_memory(load_trace((seed.dir / rank).string()));
        const std::vector<StepMemory> base = step_memory(load_trace((fixed.dir / rank).string()));
        REQUIRE(run.size() == 3);
        REQUIRE(base.size() == 3);
        CHECK(contains(json, "\"forward_ends\": [" + entry(run[0])));
        CHECK(contains(json, "\"baseline_forward_ends\": [" + entry(base[0])));
        for (size_t k = 1; k < run.size(); ++k) {
            CHECK(contains(json, entry(run[k])));
            CHECK(contains(json, entry(base[k])));
        }
        const auto& r = run.back().forward_ends;
        const auto& b = base.back().forward_ends;
        REQUIRE(r.size() == 2);
        REQUIRE(b.size() == 2);
        CHECK(r[1].first == "layers.1");
        CHECK(int64_t(r[1].second - r[0].second) > int64_t(b[1].second - b[0].second));
    }
}

TEST_CASE("diff: transposes kept after backward exceed the backward threshold") {
    TempDir bf16, qi;
    run_harness(bf16.dir, "--recipe bf16");
    run_harness(qi.dir, "--recipe delayed --te seed --arch sm90 --quantized-init");
    const Trace b = load_trace((bf16.dir / "rank0.trace").string());
    const Trace c = load_trace((qi.dir / "rank0.trace").string());
    const RankDiff d = diff_runs(measure_run(b), measure_run(c), {});
    REQUIRE(d.backward_excess);
    CHECK(d.backward_exceeded);
    // At least the two layers' retained transposes (786,432 B each).
    CHECK(*d.backward_excess >= 2 * 786432.0);
    CHECK(sh(env("E2E_CLI") + " diff " + bf16.dir.string() + " " + qi.dir.string()) == 3);
}

TEST_CASE("diff says what makes two runs not compare, and refuses what cannot be paired") {
    TempDir t;
    const std::string cli = env("E2E_CLI");
    auto record = [&](const std::string& name, const std::string& shape) {
        REQUIRE(sh(cli + " run --force --out " + (t / name).string() + " -- " + env("HARNESS") +
                   " --backend sim --recipe bf16 " + shape) == 0);
    };
    record("eight", "--ranks 2 --layers 8 --steps 9 --warmup 1");
    record("two", "--ranks 2 --layers 2 --steps 1 --warmup 0");
    record("one-rank", "--ranks 1 --layers 8 --steps 9 --warmup 1");
    std::string out, err;
    CHECK(sh(cli + " diff " + (t / "eight").string() + " " + (t / "two").string(), &out, &err) ==
          0);
    CAPTURE(out);
    // Layers only BASE has are "-", not 0 B, and a note says so.
    CHECK(count_lines(out,
                      "note: the runs' forwards have different layers: BASE 8 numbered, "
                      "CAND 2; only in BASE: layers.2, layers.3, layers.4, layers.5, ... (6)") ==
          2);
    CHECK(count_lines(out,
                      "note: the runs have different numbers of steps: BASE 9, CAND 1; a run "
                      "of one step has no step after warm-up") == 2);
    CHECK(count_lines(err, "allocscope: note: the runs' forwards have different layers") == 1);
    for (const std::string& line : lines_of(out)) {
        if (line.starts_with("    layers.7 ")) {
            CHECK(contains(line, " - "));
            CHECK_FALSE(contains(line, " 0 B"));
        }
    }
    // Ranks only one run has are named, in the output and on stderr.
    record("eight-again", "--ranks 1 --layers 8 --steps 9 --warmup 1");
    for (const auto& entry : fs::directory_iterator(t / "eight-again")) {
        if (entry.path().filename().string().starts_with("pid")) fs::remove(entry.path());
    }
    fs::copy_file(t / "eight" / "rank0.trace", t / "eight-again" / "rank0.trace");
    CHECK(sh(cli + " diff " + (t / "eight").string() + " " + (t / "eight-again").string(), &out,
             &err) == 0);
    CHECK(count_lines(out, "note: rank 1 of BASE has no trace in CAND: not compared") == 1);
    CHECK(count_lines(err, "rank 1 of BASE has no trace in CAND") == 1);
    CHECK(sh(cli + " diff --format json " + (t / "eight").string() + " " +
                 (t / "eight-again").string(),
             &out) == 0);
    const json::Value doc = json::parse(out);
    REQUIRE(doc.at("notes").items.size() == 1);
    // A run of one process (no rank: pid<PID>.trace) against a rank of a
    // distributed run: --rank names the rank it stands for.
    CHECK(sh(cli + " diff " + (t / "eight").string() + " " + (t / "one-rank").string(), nullptr,
             &err) == 2);
    CHECK(count_lines(err,
                      "CAND is one process without a rank: name the rank of BASE to compare "
                      "it with (--rank R)") == 1);
    // (exit 3: one process holds whole parameters, a rank of two half.)
    CHECK(sh(cli + " diff --rank 1 " + (t / "eight").string() + " " + (t / "one-rank").string(),
             &out, &err) == 3);
    CHECK(count_lines(out, "== rank 1 (CAND: a process without a rank) ==") == 1);
    CHECK(count_lines(out, "note: ") == 0);  // same model, same steps
    // --rank compares one rank of each.
    CHECK(sh(cli + " diff --rank 1 " + (t / "eight").string() + " " + (t / "two").string(), &out) ==
          0);
    CHECK(count_lines(out, "== rank 1 ==") == 1);
    CHECK(count_lines(out, "== rank 0 ==") == 0);
    CHECK(sh(cli + " diff --rank 1 " + (t / "eight").string() + " " + (t / "eight-again").string(),
             nullptr, &err) == 2);
    CHECK(count_lines(err, "allocscope: CAND has no trace of rank 1 (its ranks: 0)") == 1);
    // Processes without a rank do not pair by rank: one trace file each.
    fs::create_directories(t / "pids");
    for (const char* n : {"p1", "p2"}) {
        const fs::path one = t / n;
        REQUIRE(sh(cli + " run --out " + one.string() + " -- " + env("E2E_PROGRAM") + " exit 0") ==
                0);
        const std::vector<fs::path> traces = files_matching(one, "pid", ".trace");
        REQUIRE(traces.size() == 1);
        fs::rename(traces[0], t / "pids" / (std::string(n) + ".trace"));
    }
    CHECK(sh(cli + " diff " + (t / "pids").string() + " " + (t / "pids").string(), nullptr, &err) ==
          2);
    CHECK(count_lines(err, "traces of processes without a rank (") == 1);
    CHECK(sh(cli + " diff " + (t / "pids" / "p1.trace").string() + " " +
             (t / "pids" / "p2.trace").string()) == 0);
}

TEST_CASE("diff refuses bad input with exit 2") {
    TempDir t;
    const std::string cli = env("E2E_CLI");
    CHECK(sh(cli + " diff " + (t / "a").string() + " " + (t / "b").string()) == 2);
    CHECK(sh(cli + " diff " + t.dir.string()) == 2);
    CHECK(sh(cli + " diff a b --forward-threshold lots") == 2);
}

namespace {

// A PyTorch-shaped trace: the training thread (tid 1) tags each layer's
// forward and the optimizer; autograd's thread (tid 2) tags backward. Per
// step: each layer's forward keeps `kept` bytes until backward ends, and
// backward leaves `after_backward` bytes alive until the step ends.
Trace pytorch_shaped_trace(uint64_t kept, uint64_t after_backward) {
    Trace t;
    t.header.rank = 0;
    for (const char* s : {"layers.0", "layers.1", "forward", "backward", "optimizer"})
        t.strings.emplace_back(s);
    const uint32_t layer[2] = {1, 2}, forward = 3, backward = 4, optimizer = 5;
    const uint32_t root = 0;  // the shim tags the root module ""
    uint64_t seq = 0, address = 0x1000;
    auto event = [&](EventKind kind, uint32_t tid, uint64_t step, uint32_t l, uint32_t p) {
        Event e;
        e.seq = ++seq;
        e.t_ns = seq;
        e.kind = kind;
        e.tid = tid;
        e.step = step;
        e.layer = l;
        e.phase = p;
        t.events.push_back(e);
        return &t.events.back();
    };
    auto alloc = [&](uint32_t tid, uint64_t step, uint32_t l, uint32_t p, uint64_t size) {
        Event* e = event(EventKind::alloc, tid, step, l, p);
        e->level = Level::block;
        e->memory = MemoryKind::device;
        e->device = 0;
        e->size = size;
        e->address = address += 0x100000;
        return e->address;
    };
    auto free_at = [&](uint32_t tid, uint64_t step, uint64_t a) {
        Event* e = event(EventKind::free, tid, step, 0, 0);
        e->level = Level::block;
        e->memory = MemoryKind::device;
        e->device = 0;
        e->address = a;
    };
    for (uint64_t step = 1; step <= 3; ++step) {
        std::vector<uint64_t> held;
        event(EventKind::tag_push, 1, step, root, forward);
        for (uint32_t l : layer) {
            event(EventKind::tag_push, 1, step, l, forward);
            held.push_back(alloc(1, step, l, forward, kept));
            event(EventKind::tag_pop, 1, step, l, forward);
        }
        event(EventKind::tag_pop, 1, step, root, forward);
        // More backward tags than the training thread's (hooks on several
        // tensors of a layer).
        for (uint32_t l : {layer[1], layer[1], layer[1], layer[0], layer[0], layer[0]}) {
            event(EventKind::tag_push, 2, step, l, backward);
            event(EventKind::tag_pop, 2, step, l, backward);
        }
        for (uint64_t a : held)
            free_at(2, step, a);
        const uint64_t grad = alloc(2, step, layer[0], backward, after_backward);
        event(EventKind::tag_push, 1, step, 0, optimizer);
        event(EventKind::tag_pop, 1, step, 0, optimizer);
        free_at(1, step, grad);
    }
    return t;
}

}  // namespace

TEST_CASE("diff: backward tagged on autograd's thread still gives the backward half") {
    const Trace base = pytorch_shaped_trace(1024, 4096);
    const Trace cand = pytorch_shaped_trace(1024 + 65536, 4096 + 600 * 1024);
    const RunMeasure b = measure_run(base);
    const RunMeasure c = measure_run(cand);
    // The training thread is the one that runs forward, though autograd's
    // thread pushes as many tags.
    CHECK(trace_shape(base).main_tid == 1);
    REQUIRE(b.forward_mean);
    REQUIRE(b.backward_delta);
    REQUIRE(c.backward_delta);
    CHECK(b.backward_steps == 2);  // 3 steps, the warm-up dropped
    // After forward: both layers' copies; after backward: they are freed
    // and the gradient-sized block is alive.
    CHECK(*b.backward_delta == doctest::Approx(4096.0 - 2 * 1024.0));
    const RankDiff d = diff_runs(b, c, {});
    REQUIRE(d.forward_excess);
    CHECK(*d.forward_excess == doctest::Approx(65536.0));
    REQUIRE(d.backward_excess);
    CHECK(*d.backward_excess == doctest::Approx(600 * 1024.0 - 2 * 65536.0));
    CHECK(d.backward_exceeded);
}

TEST_CASE("diff: runs whose forwards share no layer are different models") {
    const Trace base = pytorch_shaped_trace(1024, 4096);
    Trace other = pytorch_shaped_trace(1024, 4096);
    for (std::string& s : other.strings) {
        if (s.starts_with("layers.")) s = "blocks." + s.substr(7);
    }
    const RankDiff d = diff_runs(measure_run(base), measure_run(other), {});
    CHECK(d.unrelated);
    REQUIRE(d.notes.size() == 1);
    CHECK(d.notes[0] ==
          "the runs' forwards have different layers: BASE 2 numbered, CAND 2; only in BASE: "
          "layers.0, layers.1; only in CAND: blocks.0, blocks.1 (no layer in common: runs of "
          "different models)");
    const RankDiff same = diff_runs(measure_run(base), measure_run(base), {});
    CHECK_FALSE(same.unrelated);
    CHECK(same.notes.empty());
}

TEST_CASE("diff on real PyTorch FSDP2 runs measures both halves of the reference test") {
    // Traces recorded on an H200 (tests/corpus/, labels.json has each
    // command): backward runs on autograd's threads there.
    const std::string cli = env("E2E_CLI");
    const std::string corpus = env("CORPUS_DIR");
    TempDir t;
    auto diff = [&](const std::string& base, const std::string& cand) {
        const fs::path json = t.dir / (cand + ".json");
        const int status = sh(cli + " diff " + corpus + "/" + base + " " + corpus + "/" + cand +
                              " --format json -o " + json.string());
        return std::make_pair(status, slurp(json));
    };
    // fp32 master weights under bf16 autocast: every layer's bf16 weight
    // casts are alive after its forward (problem 1's pattern).
    auto [autocast, autocast_json] = diff("bf16-t256", "bf16-autocast-fp32-master-t256");
    CHECK(autocast == 3);
    CHECK(contains(autocast_json, "\"forward_exceeded\": true"));
    // FP8 seed with checkpointing keeps only the transposes after backward
    // (problem 2): the backward half, measured.
    auto [transposes, transposes_json] = diff("bf16-t64", "function-seed-checkpoint");
    CHECK(transposes == 3);
    CHECK(contains(transposes_json, "\"backward_exceeded\": true"));
    CHECK_FALSE(contains(transposes_json, "\"backward_excess\": null"));
    // The fixed FP8 run is within both thresholds, both halves measured.
    auto [fixed, fixed_json] = diff("bf16-t64", "function-fixed-t64");
    CHECK(fixed == 0);
    CHECK_FALSE(contains(fixed_json, "\"backward_excess\": null"));
    CHECK_FALSE(contains(fixed_json, "\"forward_excess\": null"));
}

TEST_CASE("two hosts of one job share a run directory: each writes its own, report merges both") {
    // Two `allocscope run`s at once into one --out, as srun starts one per
    // node: SLURM_JOB_NUM_NODES=2 gives each its host's directory, and the
    // four ranks of one job (two launched under each) train together.
    TempDir t;
    const std::string dir = (t / "run").string();
    const std::string job = "job-" + std::to_string(getpid());  // one rendezvous for the job
    auto host = [&](const std::string& name, int first) {
        std::string ranks;
        for (int r = first; r < first + 2; ++r) {
            // LOCAL_RANK as the rank: the sim's communicator is one shared
            // memory segment, which all four join on this one machine.
            ranks += "RANK=" + std::to_string(r) + " LOCAL_RANK=" + std::to_string(r) + " " +
                     env("HARNESS") + " --backend sim --layers 2 --steps 2 --warmup 1 & ";
        }
        return "ALLOCSCOPE_HOST=" + name +
               " SLURM_JOB_NUM_NODES=2 WORLD_SIZE=4 MASTER_ADDR=" + job + " MASTER_PORT=1 " +
               env("E2E_CLI") + " run --out " + dir + " -- sh -c '" + ranks + "wait'";
    };
    std::string err_b;
    REQUIRE(sh("{ (" + host("node-a", 0) + ") >" + (t / "a.log").string() + " 2>&1 & " +
                   host("node-b", 2) + "; st=$?; wait; exit $st; }",
               nullptr, &err_b) == 0);
    const std::string out_b = err_b;
    CAPTURE(out_b);
    CHECK(out_b.find("one host of several (SLURM_JOB_NUM_NODES=2)") != std::string::npos);
    for (const char* h : {"host-node-a", "host-node-b"}) {
        CAPTURE(h);
        CHECK(fs::exists(t / "run" / h / "findings.json"));
        CHECK(fs::exists(t / "run" / h / "report.txt"));
    }
    CHECK(fs::exists(t / "run" / "host-node-a" / "rank0.trace"));
    CHECK(fs::exists(t / "run" / "host-node-a" / "rank1.trace"));
    CHECK(fs::exists(t / "run" / "host-node-b" / "rank2.trace"));
    CHECK(fs::exists(t / "run" / "host-node-b" / "rank3.trace"));
    CHECK_FALSE(fs::exists(t / "run" / "rank0.trace"));
    CHECK(load_trace((t / "run" / "host-node-b" / "rank2.trace").string()).header.host == "node-b");

    std::string out;
    REQUIRE(sh(env("E2E_CLI") + " report " + dir, &out) == 0);
    CAPTURE(out);
    CHECK(out.find("allocscope report: 4 trace(s), ranks 0–3\n") == 0);
    CHECK(out.find("\nhosts: 2, 2 traces each (node-a: ranks 0–1; node-b: ranks 2–3)\n") !=
          std::string::npos);
    REQUIRE(sh(env("E2E_CLI") + " report --full " + dir, &out) == 0);
    CHECK(out.find(", host node-b, allocscope ") != std::string::npos);
    // A torchrun of several nodes is one host of several too; one node is not.
    std::string err;
    REQUIRE(sh(env("E2E_CLI") + " run --out " + (t / "tr").string() +
                   " -- echo torchrun --nnodes=1:4 --nproc_per_node 8 train.py",
               nullptr, &err) == 0);
    CHECK(err.find("one host of several (torchrun --nnodes 1:4)") != std::string::npos);
    REQUIRE(sh(env("E2E_CLI") + " run --force --out " + (t / "tr").string() +
                   " -- echo torchrun --nnodes 1 train.py",
               nullptr, &err) == 0);
    CHECK(err.find("one host of several") == std::string::npos);
    // check merges both hosts' findings: the same errors on all four ranks.
    REQUIRE(sh("(" + env("E2E_CLI") + " check " + dir + ") 2>&1", &out) == 3);
    CHECK(out.find("ranks 0–3") != std::string::npos);
    CHECK(out.find("ranks 0–1 ") == std::string::npos);
}

TEST_CASE("a bounded trace stays within its bound and its last steps read as the whole run's") {
    // 400 steps, traced whole and within 256 KiB (the whole trace is about
    // four times that): the same seed gives the same events.
    TempDir t;
    const std::string shape =
        " --backend sim --ranks 2 --layers 2 --hidden 64 --ffn 128 --steps 400 --warmup 1";
    REQUIRE(sh(env("E2E_CLI") + " run --out " + (t / "whole").string() + " -- " + env("HARNESS") +
               shape) == 0);
    std::string err;
    REQUIRE(sh(env("E2E_CLI") + " run --max-trace-size 256K --out " + (t / "bounded").string() +
                   " -- " + env("HARNESS") + shape,
               nullptr, &err) == 0);
    CAPTURE(err);
    CHECK(err.find("events of the middle steps dropped to stay within 262144 bytes") !=
          std::string::npos);
    for (int rank = 0; rank < 2; ++rank) {
        CAPTURE(rank);
        const std::string name = "rank" + std::to_string(rank) + ".trace";
        const fs::path whole = t / "whole" / name, bounded = t / "bounded" / name;
        CHECK(fs::file_size(whole) > 4 * 256 * 1024 / 2);
        CHECK(fs::file_size(bounded) <= 256 * 1024);
        CHECK((fs::status(bounded).permissions() & fs::perms::all) ==
              (fs::perms::owner_read | fs::perms::owner_write));
        const Trace w = load_trace(whole.string()), b = load_trace(bounded.string());
        CHECK_FALSE(b.truncated);
        const TraceAnalysis aw = analyze(w), ab = analyze(b);
        CHECK(ab.bounded.gaps == 1);
        CHECK(ab.bounded.events_dropped + b.events.size() >= w.events.size());
        CHECK(ab.bounded.first_step_after > 300);
        CHECK(ab.bounded.last_step_before < 100);
        // Every step kept whole: the same per-step memory as the whole run.
        std::vector<StepMemory> sw = step_memory(w), sb = step_memory(b);
        const uint64_t from = ab.bounded.first_step_after;
        std::erase_if(sw, [from](const StepMemory& m) { return m.step < from; });
        std::erase_if(sb, [from](const StepMemory& m) { return m.step < from; });
        CHECK(sb.size() == 400 - from);
        CHECK(sb == sw);
        CHECK(ab.pool(Pool::device_block)->live_bytes_at_exit ==
              aw.pool(Pool::device_block)->live_bytes_at_exit);
    }
    // The findings come from the live plugins, which saw every event.
    const FindingsFile fw = read_findings_file((t / "whole" / "findings.json").string());
    const FindingsFile fb = read_findings_file((t / "bounded" / "findings.json").string());
    auto errors = [](const FindingsFile& f) {
        std::vector<std::string> out;
        for (const Finding& x : f.findings)
            if (x.severity == Severity::error) out.push_back(x.plugin + " " + x.layer);
        std::sort(out.begin(), out.end());
        return out;
    };
    CHECK(errors(fb) == errors(fw));
    CHECK(std::count_if(fb.findings.begin(), fb.findings.end(), [](const Finding& x) {
              return x.plugin == "weight-copy-accumulation" && x.severity == Severity::error;
          }) > 0);
    std::string out;
    REQUIRE(sh(env("E2E_CLI") + " report " + (t / "bounded").string(), &out) == 0);
    CAPTURE(out);
    CHECK(out.find("bounded trace (--max-trace-size): ") != std::string::npos);
    // The allocator's counters agree after the gap too: a carried segment
    // that held a block before it is the allocator's reserve.
    CHECK(out.find("self-check: agrees with the allocator at") != std::string::npos);
    CHECK(out.find("self-check: differs") == std::string::npos);
}
