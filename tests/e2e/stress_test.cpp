// Conservation under contention: tests/e2e/preload_program.cpp `stress`
// runs T threads x P cudaMalloc/cudaFree pairs through the host-memory
// runtime with liballocscope.so preloaded; a quarter of the allocations are
// freed by another thread than the one that made them. The trace must hold
// exactly the calls the program counted: nothing lost, nothing invented, no
// unknown or double frees, and the allocations kept until exit live at the
// end of the replay. Once with the plugins off, once with the built-in ones
// running live. A deadlock ends the run by `timeout` and fails the test.
//
// Environment (set by tests/meson.build):
//   E2E_PROGRAM      the test program (linked against the host-memory runtime)
//   E2E_INTERPOSER   liballocscope.so
//   E2E_PLUGIN_DIR   the build's plugins/
//   STRESS_THREADS   threads (default 16)
//   STRESS_PAIRS     pairs per thread (default 1000000; less under sanitizers)
//   STRESS_TIMEOUT   seconds before the run counts as hung (default 600)
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>

#include "findings.h"
#include "findings_reader.h"
#include "replay.h"
#include "support.h"
#include "trace_reader.h"

using namespace allocscope;
using namespace allocscope::test;

namespace {

std::string env_or(const char* name, const std::string& fallback) {
    const char* v = std::getenv(name);
    return v && *v ? v : fallback;
}

// "stress done: mallocs 5 frees 3 ..." -> {mallocs: 5, frees: 3, ...}
std::map<std::string, uint64_t> parse_counts(const std::string& out) {
    std::map<std::string, uint64_t> counts;
    const size_t at = out.find("stress done:");
    if (at == std::string::npos) return counts;
    std::istringstream in(out.substr(at + 12, out.find('\n', at) - at - 12));
    std::string key;
    uint64_t value = 0;
    while (in >> key >> value)
        counts[key] = value;
    return counts;
}

// What the trace says, read record by record (a 1 M x 16 trace does not fit
// comfortably in memory as a Trace).
struct TraceCounts {
    uint64_t events = 0;
    uint64_t allocs = 0, frees = 0, failed_frees = 0, flagged_frees = 0;
    uint64_t pushes = 0, pops = 0, ooms = 0;
    std::optional<FooterRecord> footer;
    bool truncated = false;
    PoolTotals device;
    uint64_t unknown_frees = 0, double_frees = 0;
};

TraceCounts read_trace(const fs::path& path) {
    TraceReader reader(path.string());
    Replay replay;
    TraceCounts c;
    TraceRecord r;
    while (reader.next(r)) {
        if (r.type == RecordType::footer) c.footer = r.footer;
        if (r.type != RecordType::event) continue;
        const Event& e = r.event;
        ++c.events;
        replay.apply(e);
        switch (e.kind) {
            case EventKind::alloc:
                c.allocs += e.level == Level::segment;
                break;
            case EventKind::free:
                c.frees += e.level == Level::segment;
                c.failed_frees += e.result != 0;
                c.flagged_frees += (e.flags & (kFlagUnknownAddress | kFlagDoubleFree)) != 0;
                break;
            case EventKind::tag_push:
                ++c.pushes;
                break;
            case EventKind::tag_pop:
                ++c.pops;
                break;
            case EventKind::oom:
                ++c.ooms;
                break;
            default:
                break;
        }
    }
    c.truncated = reader.truncated();
    c.device = replay.totals(Pool::device_segment);
    c.unknown_frees = replay.unknown_frees();
    c.double_frees = replay.double_frees();
    return c;
}

struct StressRun {
    TempDir scratch;
    fs::path out;
    int status = -1;
    std::string stdout_text, stderr_text;
    double seconds = 0;
    std::map<std::string, uint64_t> counts;
    fs::path trace;
    TraceCounts t;

    // `settings`: extra environment assignments for the run.
    explicit StressRun(const std::string& settings) {
        out = scratch / "out";
        const std::string threads = env_or("STRESS_THREADS", "16");
        const std::string pairs = env_or("STRESS_PAIRS", "1000000");
        const std::string limit = env_or("STRESS_TIMEOUT", "600");
        const std::string command = "timeout -k 10 " + limit +
                                    " env LD_PRELOAD=" + env("E2E_INTERPOSER") +
                                    " ALLOCSCOPE_OUT=" + out.string() + " " + settings + " " +
                                    env("E2E_PROGRAM") + " stress " + threads + " " + pairs;
        const auto t0 = std::chrono::steady_clock::now();
        status = sh(command, &stdout_text, &stderr_text);
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        MESSAGE("stress " << threads << " x " << pairs << " (" << settings << "): " << seconds
                          << " s, exit " << status);
        if (status != 0) MESSAGE("program stderr:\n" << stderr_text);
        REQUIRE_MESSAGE(status != 124, "the run hung (killed after " << limit << " s)");
        counts = parse_counts(stdout_text);
        std::error_code ec;
        for (const auto& e : fs::directory_iterator(out, ec)) {
            if (e.path().extension() == ".trace") {
                REQUIRE_MESSAGE(trace.empty(), "more than one trace in " << out);
                trace = e.path();
            }
        }
        REQUIRE(!trace.empty());
        const auto r0 = std::chrono::steady_clock::now();
        t = read_trace(trace);
        MESSAGE(
            "trace " << fs::file_size(trace) / (1 << 20) << " MiB, " << t.events
                     << " events, read in "
                     << std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count()
                     << " s");
    }

    void check_conservation() const {
        CHECK(status == 0);
        CHECK(stdout_text.find("failures 0\n") != std::string::npos);
        const uint64_t threads = std::stoull(env_or("STRESS_THREADS", "16"));
        const uint64_t pairs = std::stoull(env_or("STRESS_PAIRS", "1000000"));
        REQUIRE(counts.count("mallocs") == 1);
        CHECK(counts.at("mallocs") == threads * pairs);
        CHECK(counts.at("kept") == threads * 2);
        CHECK(counts.at("frees") == counts.at("mallocs") - counts.at("kept"));
        CHECK(counts.at("handed_off") == threads * (pairs / 4));

        CHECK(!t.truncated);
        REQUIRE(t.footer.has_value());
        CHECK(t.footer->events == t.events);
        CHECK(t.footer->events_dropped == 0);
        CHECK(t.footer->unknown_frees == 0);
        CHECK(t.footer->double_frees == 0);
        CHECK(t.allocs == counts.at("mallocs"));
        CHECK(t.frees == counts.at("frees"));
        CHECK(t.failed_frees == 0);
        CHECK(t.flagged_frees == 0);
        CHECK(t.ooms == 0);
        CHECK(t.pushes == counts.at("tags"));
        CHECK(t.pops == counts.at("tags"));
        // Replayed in seq order, every free finds its allocation and the
        // ones kept are what is live at exit.
        CHECK(t.unknown_frees == 0);
        CHECK(t.double_frees == 0);
        CHECK(t.device.allocations == counts.at("mallocs"));
        CHECK(t.device.live_count == counts.at("kept"));
        CHECK(t.device.live_bytes == counts.at("kept_bytes"));
    }
};

}  // namespace

TEST_CASE("16 threads, cross-thread frees: every call is in the trace exactly once") {
    StressRun run("ALLOCSCOPE_PLUGINS=none");
    run.check_conservation();
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(run.out, ec))
        CHECK(e.path().filename().string().rfind("findings.", 0) != 0);
}

TEST_CASE("the same load with the built-in plugins running live") {
    StressRun run("ALLOCSCOPE_PLUGIN_DIR=" + env("E2E_PLUGIN_DIR"));
    run.check_conservation();
    const fs::path findings = run.out / ("findings." + run.trace.stem().string() + ".json");
    REQUIRE(fs::exists(findings));
    FindingsFile file = read_findings_file(findings.string());
    REQUIRE(file.ranks.size() == 1);
    CHECK(file.ranks[0].plugins.size() >= 5);  // every built-in ran to the end
    for (const DisabledPlugin& d : file.ranks[0].disabled)
        FAIL_CHECK("plugin " << d.plugin << " disabled: " << d.reason);
    MESSAGE(file.findings.size() << " finding(s) from " << file.ranks[0].plugins.size()
                                 << " plugin(s)");
}
