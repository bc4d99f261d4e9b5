// The plugin host (core/plugin_host.h) driven with synthetic streams and the
// test plugins of tests/plugins/, and end to end: plugins live inside a
// traced program against `allocscope replay` on its trace.
//
// Environment (set by tests/meson.build):
//   TEST_PLUGIN_DIR  where the test plugins are (allocscope-plugin-test-*.so)
//   E2E_CLI          build/tools/allocscope
//   E2E_PROGRAM      tests/e2e/preload_program.cpp built against the sim runtime
// Longer than 600 lines: the plugin host's whole contract (loading, refusing,
// disabling, feeding, findings files), sharing the test plugins and runners.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "findings.h"
#include "findings_reader.h"
#include "plugin_host.h"
#include "support.h"
#include "trace_reader.h"
#include "trace_writer.h"

namespace fs = std::filesystem;
using namespace allocscope;
using allocscope::test::count_lines;
using allocscope::test::files_matching;
using allocscope::test::flip_byte;
using allocscope::test::run_shell;
using allocscope::test::ShellResult;
using allocscope::test::slurp;
using allocscope::test::TempDir;

namespace {

std::string env_or_empty(const char* name) {
    const char* v = std::getenv(name);
    return v ? v : "";
}

std::string plugin_dir() {
    const std::string dir = env_or_empty("TEST_PLUGIN_DIR");
    REQUIRE_MESSAGE(!dir.empty(), "TEST_PLUGIN_DIR must be set (see tests/meson.build)");
    return dir;
}

bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

struct Captured {
    std::vector<std::string> warnings;
    std::vector<std::string> infos;
};

HostSettings settings_for(Captured& c, PluginOptions options = {}, int32_t rank = 0,
                          bool baseline = false) {
    HostSettings s;
    s.rank = rank;
    s.world_size = 8;
    s.has_baseline = baseline;
    s.options = std::move(options);
    s.warn = [&c](const std::string& line) { c.warnings.push_back(line); };
    s.info = [&c](const std::string& line) { c.infos.push_back(line); };
    return s;
}

// A hand-made event stream with its string and param tables, fed to a host
// directly or written as a trace file.
struct Stream {
    std::vector<Event> events;
    std::vector<std::string> strings{std::string()};
    std::vector<ParamRecord> params;
    uint64_t seq = 0;
    uint64_t step = 0;
    uint32_t layer = 0, phase = 0;

    uint32_t str(const std::string& s) {
        if (s.empty()) return 0;
        for (uint32_t i = 0; i < strings.size(); ++i) {
            if (strings[i] == s) return i;
        }
        strings.push_back(s);
        return static_cast<uint32_t>(strings.size() - 1);
    }
    Event& add(EventKind kind) {
        Event e;
        e.seq = ++seq;
        e.t_ns = seq * 1000;
        e.kind = kind;
        e.step = step;
        e.tid = 7;
        e.layer = layer;
        e.phase = phase;
        events.push_back(e);
        return events.back();
    }
    void set_step(uint64_t s) {
        step = s;
        add(EventKind::step).step = s;
    }
    void push(const std::string& l, const std::string& p) {
        layer = str(l);
        phase = str(p);
        add(EventKind::tag_push);
    }
    void pop() {
        add(EventKind::tag_pop);
        layer = phase = 0;
    }
    void alloc(uint64_t address, uint64_t size, Level level, uint32_t stack = 0) {
        Event& e = add(EventKind::alloc);
        e.address = address;
        e.size = size;
        e.level = level;
        e.stack = stack;
        e.memory = MemoryKind::device;
    }
    void free(uint64_t address, uint64_t size, Level level, int32_t result = 0) {
        Event& e = add(EventKind::free);
        e.address = address;
        e.size = size;
        e.level = level;
        e.result = result;
    }
    void param(const std::string& l, const std::string& name, uint64_t numel,
               const std::string& dtype, uint64_t sharded) {
        ParamRecord p;
        p.index = static_cast<uint32_t>(params.size());
        p.layer = str(l);
        p.name = str(name);
        p.dtype = str(dtype);
        p.numel = numel;
        p.sharded_numel = sharded;
        params.push_back(p);
        add(EventKind::param).aux = p.index;
    }
    void mark(const std::string& text) { add(EventKind::mark).aux = str(text); }
    void derived(uint64_t address, uint32_t param_index, const std::string& how) {
        Event& e = add(EventKind::derived);
        e.address = address;
        e.aux = param_index;
        e.stream = str(how);
    }

    void feed(PluginHost& host, uint32_t source = ALLOCSCOPE_SOURCE_RUN) const {
        for (const Event& e : events)
            host.feed(e, strings, params, source);
    }

    void write(const std::string& path, int32_t rank) const {
        TraceWriter w;
        TraceHeader h;
        h.tool_version = "test";
        h.pid = 4242;
        h.rank = rank;
        h.world_size = 2;
        std::string error;
        REQUIRE_MESSAGE(w.open(path, h, error), error);
        for (uint32_t i = 1; i < strings.size(); ++i)
            w.string(i, strings[i]);
        w.stack(1, std::vector<uint64_t>{0x1234, 0x5678});
        for (const ParamRecord& p : params)
            w.param(p);
        for (const Event& e : events)
            w.event(e);
        w.close(FooterRecord{});
    }
};

// The stream most cases use; the comments give what the host must make of it.
Stream standard_stream() {
    Stream s;
    s.set_step(1);                                      // seq 1: on_step(1) first
    s.push("layers.0", "forward");                      // seq 2
    s.param("layers.0", "weight", 4096, "bf16", 2048);  // seq 3: param index 0
    s.alloc(0x1000, 1000, Level::block, 1);             // seq 4
    s.alloc(0x2000, 2000, Level::segment);              // seq 5
    s.mark("hello");                                    // seq 6
    s.free(0x1000, 1000, Level::block);                 // seq 7: alloc_seq 4
    s.pop();                                            // seq 8
    s.set_step(2);                                      // seq 9: on_step(2)
    s.alloc(0x3000, 3000, Level::block);                // seq 10, untagged
    s.free(0x9999, 0, Level::segment);                  // seq 11: unknown, alloc_seq 0
    s.free(0x2000, 2000, Level::segment, 1);            // seq 12: failed, not delivered
    Event& oom = s.add(EventKind::oom);                 // seq 13
    oom.size = uint64_t{1} << 40;
    oom.level = Level::segment;
    return s;
}

const char* kStandardTranscript =
    "s1 rS1 rP2 rR3:0=layers.0.weight/bf16/4096/2048 rA4@layers.0/forward:1000L1000 "
    "rA5@layers.0/forward:2000L3000 rK6:hello rF7:4@layers.0/forward rp8 s2 rS9 "
    "rA10@/:3000L5000 rF11:0@/ rO13";

const Finding* find_finding(const std::vector<Finding>& all, const std::string& plugin,
                            const std::string& layer_is = "*") {
    for (const Finding& f : all) {
        if (f.plugin == plugin && (layer_is == "*" || f.layer == layer_is)) return &f;
    }
    return nullptr;
}

// The count plugin's "key=value" summary as a map.
std::map<std::string, std::string> fields(const std::string& summary) {
    std::map<std::string, std::string> out;
    std::istringstream in(summary);
    for (std::string word; in >> word;) {
        size_t eq = word.find('=');
        if (eq != std::string::npos) out[word.substr(0, eq)] = word.substr(eq + 1);
    }
    return out;
}

const PluginStatus* status_of(const std::vector<PluginStatus>& all, const std::string& entry) {
    for (const PluginStatus& s : all) {
        if (s.entry == entry) return &s;
    }
    return nullptr;
}

size_t lines_containing(const std::vector<std::string>& lines, const std::string& part) {
    return static_cast<size_t>(std::count_if(
        lines.begin(), lines.end(), [&](const std::string& l) { return contains(l, part); }));
}

}  // namespace

TEST_CASE("the count plugin sees the stream with resolved strings, live table and steps") {
    Captured c;
    PluginHost host(settings_for(c, {{"test-count.transcript", "1"}}, 3));
    host.load({"test-count"}, plugin_dir());
    REQUIRE(host.enabled_count() == 1);
    standard_stream().feed(host);
    host.finish();
    CHECK(c.warnings.empty());
    // init logged through host->log, prefixed with the plugin's name.
    REQUIRE(c.infos.size() == 1);
    CHECK(c.infos[0] == "allocscope: plugin test-count: init rank 3 world 8 baseline 0");

    REQUIRE(host.findings().size() == 2);
    const Finding& f = host.findings()[0];
    CHECK(f.plugin == "test-count");
    CHECK(f.rank == 3);
    CHECK(f.severity == Severity::info);
    CHECK(f.count == 12);    // 13 events, the failed free not delivered
    CHECK(f.bytes == 5000);  // 0x2000 (segment) and 0x3000 (block) still live
    auto v = fields(f.summary);
    CHECK(v["alloc"] == "3");
    CHECK(v["free"] == "2");
    CHECK(v["oom"] == "1");
    CHECK(v["push"] == "1");
    CHECK(v["pop"] == "1");
    CHECK(v["step"] == "2");
    CHECK(v["param"] == "1");
    CHECK(v["mark"] == "1");
    CHECK(v["alloc_bytes"] == "6000");
    CHECK(v["freed_bytes"] == "1000");
    CHECK(v["freed_alloc_seq_sum"] == "4");
    CHECK(v["unknown_frees"] == "1");
    CHECK(v["on_step"] == "2");
    CHECK(v["step_sum"] == "3");
    CHECK(v["last_step"] == "2");
    CHECK(v["params"] == "1");
    CHECK(v["live"] == "2");
    CHECK(v["live_bytes"] == "5000");
    CHECK(v["segment_bytes"] == "2000");
    CHECK(v["block_bytes"] == "3000");
    CHECK(v["stacks"] == "1");
    CHECK(v["baseline"] == "0");
    CHECK(v["run"] == "12");
    // Evidence: the live allocations with their tags, the largest first
    // (the plugin gave them by alloc seq).
    REQUIRE(f.evidence.size() == 2);
    CHECK(f.evidence[0] == Evidence{3000, "", "", 2, 10, 0, 0, ""});
    CHECK(f.evidence[1] == Evidence{2000, "layers.0", "forward", 1, 5, 0, 0, ""});
    CHECK(f.layer == "");  // the newest live allocation is untagged

    const Finding& t = host.findings()[1];
    CHECK(t.layer == "transcript");
    CHECK(t.summary == kStandardTranscript);

    RankRun r = host.rank_run("rank3.trace");
    CHECK(r.rank == 3);
    CHECK(r.trace == "rank3.trace");
    CHECK(r.plugins == std::vector<std::string>{"test-count"});
    CHECK(r.disabled.empty());
}

TEST_CASE("feeding resolved strings gives the same calls as feeding ids") {
    Stream s = standard_stream();
    Captured c1, c2;
    PluginHost by_id(settings_for(c1, {{"test-count.transcript", "1"}}));
    PluginHost by_text(settings_for(c2, {{"test-count.transcript", "1"}}));
    by_id.load({"test-count"}, plugin_dir());
    by_text.load({plugin_dir() + "/allocscope-plugin-test-count.so"}, "");
    s.feed(by_id);
    for (const Event& e : s.events) {
        EventText text{s.strings[e.layer], s.strings[e.phase], "", nullptr};
        ParamInfo p;
        if (e.kind == EventKind::mark) text.text = s.strings[e.aux];
        if (e.kind == EventKind::param) {
            const ParamRecord& r = s.params[e.aux];
            p = {s.strings[r.layer], s.strings[r.name], s.strings[r.dtype], r.numel,
                 r.sharded_numel};
            text.param = &p;
        }
        by_text.feed(e, text);
    }
    by_id.finish();
    by_text.finish();
    CHECK(by_id.findings() == by_text.findings());
    REQUIRE(by_text.findings().size() == 2);
    CHECK(by_text.findings()[1].summary == kStandardTranscript);
}

TEST_CASE("on_step fires before an event whose step moved ahead of a lost STEP event") {
    Stream s;
    s.set_step(1);
    s.step = 3;  // the STEP event of 3 never made it into the stream
    s.alloc(0x10, 16, Level::block);
    s.set_step(3);  // no change: no second on_step
    s.set_step(1);  // a step set back is a change too
    Captured c;
    PluginHost host(settings_for(c, {{"test-count.transcript", "1"}}));
    host.load({"test-count"}, plugin_dir());
    s.feed(host);
    host.finish();
    REQUIRE(host.findings().size() == 2);
    CHECK(host.findings()[1].summary == "s1 rS1 s3 rA2@/:16L16 rS3 s1 rS4");
}

TEST_CASE("a baseline stream is delivered first, then the run's with a fresh live table") {
    Stream base;
    base.set_step(1);
    base.alloc(0x1000, 500, Level::block);
    base.set_step(2);
    Stream run;
    run.set_step(1);
    run.alloc(0x1000, 700, Level::block);
    Captured c;
    PluginHost host(settings_for(c, {{"test-count.transcript", "1"}}, 0, true));
    host.load({"test-count"}, plugin_dir());
    base.feed(host, ALLOCSCOPE_SOURCE_BASELINE);
    run.feed(host, ALLOCSCOPE_SOURCE_RUN);
    host.finish();
    REQUIRE(host.findings().size() == 2);
    // Baseline steps are reported with source BASELINE (the plugin writes
    // them as S); the run restarts at step 0 and with nothing live.
    CHECK(host.findings()[1].summary == "S1 bS1 bA2@/:500L500 S2 bS3 s1 rS1 rA2@/:700L700");
    auto v = fields(host.findings()[0].summary);
    CHECK(v["baseline"] == "3");
    CHECK(v["run"] == "2");
    CHECK(v["order"] == "ok");
    CHECK(v["live_bytes"] == "700");
    CHECK(c.infos.at(0) == "allocscope: plugin test-count: init rank 0 world 8 baseline 1");
}

TEST_CASE("broken plugins are disabled with one message each; the good one's findings stay") {
    Captured c;
    PluginHost host(settings_for(c));
    const std::vector<std::string> entries = {
        "test-count", "test-error", "test-throw",   "test-abi2",         "test-badsize",
        "test-nosym", "test-dup",   "test-missing", "/nonexistent/x.so", "Bad_Name"};
    host.load(entries, plugin_dir());
    // Load-time failures are known before any event.
    CHECK(host.enabled_count() == 3);
    standard_stream().feed(host);
    host.finish();

    const auto st = host.statuses();
    REQUIRE(st.size() == entries.size());
    auto reason = [&](const std::string& entry) {
        const PluginStatus* s = status_of(st, entry);
        REQUIRE(s != nullptr);
        CHECK_FALSE(s->enabled);
        return s->reason;
    };
    CHECK(status_of(st, "test-count")->enabled);
    CHECK(reason("test-error") == "on_event returned an error");
    CHECK(reason("test-throw") == "on_event threw: boom on event 2");
    auto reason_has = [&](const std::string& entry, const std::string& part) {
        const std::string r = reason(entry);
        CHECK_MESSAGE(contains(r, part), entry << ": " << r);
    };
    reason_has("test-abi2", "plugin ABI version 2 under the name allocscope_plugin_v1, expected 1");
    reason_has("test-badsize",
               "struct_size 24, expected " + std::to_string(sizeof(allocscope_plugin_v2)));
    reason_has("test-nosym", "does not export 'allocscope_plugin'");
    reason_has("test-nosym", "(allocscope_plugin_v2, allocscope_plugin_v1, allocscope_plugin)");
    reason_has("test-dup", "a plugin named 'test-count' is already loaded");
    reason_has("test-missing", "no allocscope-plugin-test-missing.so in");
    reason_has("/nonexistent/x.so", "cannot load /nonexistent/x.so");
    reason_has("Bad_Name", "neither a plugin name");

    // One warning per disabled plugin, each naming it.
    CHECK(c.warnings.size() == entries.size() - 1);
    for (const std::string& w : c.warnings) {
        CAPTURE(w);
        CHECK(w.rfind("allocscope: plugin ", 0) == 0);
        CHECK(w.find('\n') == std::string::npos);
    }
    CHECK(lines_containing(c.warnings, "plugin test-error disabled: on_event returned an error") ==
          1);
    CHECK(lines_containing(c.warnings, "plugin test-throw disabled: on_event threw") == 1);
    CHECK(lines_containing(c.warnings, "plugin test-abi2 disabled") == 1);

    // test-error's finding from before it failed stays; test-count ran to
    // the end on the whole stream.
    const Finding* early = find_finding(host.findings(), "test-error");
    REQUIRE(early != nullptr);
    CHECK(early->summary == "emitted before failing");
    CHECK(early->severity == Severity::warning);
    const Finding* count = find_finding(host.findings(), "test-count");
    REQUIRE(count != nullptr);
    CHECK(count->count == 12);
    CHECK(fields(count->summary)["live_bytes"] == "5000");

    RankRun r = host.rank_run("t");
    CHECK(r.plugins == std::vector<std::string>{"test-count"});
    REQUIRE(r.disabled.size() == entries.size() - 1);
    CHECK(r.disabled[0].plugin == "test-error");
    CHECK(r.disabled[0].reason == "on_event returned an error");
    CHECK(r.disabled[6].plugin == "test-missing");  // never loaded: the entry names it
}

TEST_CASE("errors from init, on_step and finish disable the plugin at that call") {
    for (const std::string where : {"init", "step", "finish"}) {
        CAPTURE(where);
        Captured c;
        PluginHost host(
            settings_for(c, {{"test-error.fail_in", where}, {"test-error.fail_at", "2"}}));
        host.load({"test-error", "test-count"}, plugin_dir());
        standard_stream().feed(host);
        host.finish();
        const std::vector<PluginStatus> statuses = host.statuses();
        const PluginStatus* s = status_of(statuses, "test-error");
        REQUIRE(s != nullptr);
        CHECK_FALSE(s->enabled);
        const std::string call = where == "step" ? "on_step" : where;
        CHECK(s->reason == call + " returned an error");
        REQUIRE(c.warnings.size() == 1);
        CHECK(c.warnings[0] ==
              "allocscope: plugin test-error disabled: " + call + " returned an error");
        // The finding made on its first event exists unless init failed.
        CHECK((find_finding(host.findings(), "test-error") != nullptr) == (where != "init"));
        CHECK(find_finding(host.findings(), "test-count") != nullptr);
    }
}

TEST_CASE("an invalid finding disables its plugin and is dropped") {
    Captured c;
    PluginHost host(settings_for(c, {{"test-throw.what", "bad-finding"}}));
    host.load({"test-throw"}, plugin_dir());
    standard_stream().feed(host);
    host.finish();
    CHECK(host.findings().empty());
    REQUIRE(c.warnings.size() == 1);
    CHECK(c.warnings[0] ==
          "allocscope: plugin test-throw disabled: emitted a finding with invalid severity 7");
}

TEST_CASE("options reach the plugin by name; unknown plugin names and bad values are reported") {
    Captured c;
    PluginHost host(settings_for(
        c, {{"test-count.severity", "error"}, {"test-count.evidence", "1"}, {"nobody.x", "1"}}));
    host.load({"test-count"}, plugin_dir());
    REQUIRE(c.warnings.size() == 1);
    CHECK(c.warnings[0] ==
          "allocscope: plugin option 'nobody.x' names no loaded plugin ('nobody')");
    standard_stream().feed(host);
    host.finish();
    REQUIRE(host.findings().size() == 1);
    CHECK(host.findings()[0].severity == Severity::error);
    CHECK(host.findings()[0].evidence.size() == 1);

    Captured bad;
    PluginHost refused(settings_for(bad, {{"test-count.severity", "fatal"}}));
    refused.load({"test-count"}, plugin_dir());
    CHECK(refused.enabled_count() == 0);
    CHECK(lines_containing(bad.infos, "option severity must be info, warning or error") == 1);
    REQUIRE(bad.warnings.size() == 1);
    CHECK(bad.warnings[0] == "allocscope: plugin test-count disabled: init returned an error");
}

TEST_CASE("an empty list loads every plugin in the directory") {
    Captured c;
    PluginHost host(settings_for(c));
    host.load({}, plugin_dir());
    std::vector<std::string> names;
    for (const PluginStatus& s : host.statuses())
        names.push_back(s.entry);
    // Sorted by file name; entries are the names the files give.
    CHECK(names == std::vector<std::string>{"test-abi2", "test-badsize", "test-both", "test-count",
                                            "test-dup", "test-error", "test-legacy", "test-nosym",
                                            "test-throw", "test-v1"});
    std::vector<std::string> enabled;
    for (const PluginStatus& s : host.statuses()) {
        if (s.enabled) enabled.push_back(s.name);
    }
    CHECK(enabled == std::vector<std::string>{"test-both", "test-count", "test-error",
                                              "test-legacy", "test-throw", "test-v1"});
    CHECK(discover_plugins("").empty());
    CHECK(discover_plugins("/nonexistent").empty());
}

TEST_CASE("a version 1 plugin built against the released plugin_v1.h loads and runs") {
    // test-legacy and test-v1 are test-count built against
    // tests/plugins/v1_frozen (plugin_v1.h as released) alone, exported as
    // that header says (allocscope_plugin) and under the versioned name
    // (allocscope_plugin_v1): the v1 adapter drives both.
    for (const std::string name : {"test-legacy", "test-v1"}) {
        CAPTURE(name);
        Captured c;
        PluginHost host(settings_for(c));
        host.load({name, "test-count"}, plugin_dir());
        REQUIRE(host.enabled_count() == 2);
        standard_stream().feed(host);
        host.finish();
        CHECK(c.warnings.empty());
        const Finding* v1 = find_finding(host.findings(), name);
        const Finding* v2 = find_finding(host.findings(), "test-count");
        REQUIRE(v1 != nullptr);
        REQUIRE(v2 != nullptr);
        // The stream has no kind version 1 lacks: the same counts and
        // live table, and the finding's evidence as version 2's. Only the
        // OOM event's address differs (version 2: the device's free bytes).
        CHECK(v1->count == 12);
        CHECK(v1->count == v2->count);
        auto f1 = fields(v1->summary);
        auto f2 = fields(v2->summary);
        for (const char* key : {"alloc", "free", "oom", "push", "pop", "step", "param", "mark",
                                "freed_alloc_seq_sum", "on_step", "live_bytes", "hash"}) {
            CAPTURE(key);
            CHECK(f1[key] == f2[key]);
        }
        CHECK(f1["oom_address_sum"] == "0");
        CHECK(v1->evidence == v2->evidence);
        CHECK(v1->basis == "");
    }
}

TEST_CASE("a version 1 plugin never gets a kind version 1 did not have, nor an OOM's free bytes") {
    Stream run;
    run.set_step(1);
    run.push("layers.0", "forward");
    run.param("layers.0", "weight", 4096, "bf16", 4096);  // seq 3
    run.alloc(0x9000, 4096, Level::block);                // seq 4
    run.derived(0x9000, 0, "abs -> amax -> _to_copy");    // seq 5
    Event& oom = run.add(EventKind::oom);                 // seq 6
    oom.size = 8192;
    oom.level = Level::block;
    oom.address = 3 * 4096;  // version 2: the device's free bytes
    run.pop();
    Captured c;
    PluginHost host(settings_for(c, {{"test-count.transcript", "1"}, {"test-v1.transcript", "1"}}));
    // test-v1 asks for every kind it knows (ALLOCSCOPE_EVENT_ALL of version
    // 1); test-count for version 2's.
    host.load({"test-count", "test-v1"}, plugin_dir());
    REQUIRE(host.enabled_count() == 2);
    run.feed(host);
    host.finish();
    CHECK(c.warnings.empty());
    std::map<std::string, std::vector<const Finding*>> by_plugin;
    for (const Finding& f : host.findings())
        by_plugin[f.plugin].push_back(&f);
    REQUIRE(by_plugin["test-count"].size() == 2);
    REQUIRE(by_plugin["test-v1"].size() == 2);
    auto v2 = fields(by_plugin["test-count"][0]->summary);
    auto v1 = fields(by_plugin["test-v1"][0]->summary);
    CHECK(v2["derived"] == "1");
    CHECK(v1["derived"] == "0");
    CHECK(v2["oom"] == "1");
    CHECK(v1["oom"] == "1");
    CHECK(v2["oom_address_sum"] == std::to_string(3 * 4096));
    CHECK(v1["oom_address_sum"] == "0");
    CHECK(std::stoull(v2["events"]) == std::stoull(v1["events"]) + 1);
    // In order, the DERIVED event (seq 5) left out.
    const std::string& t2 = by_plugin["test-count"][1]->summary;
    const std::string& t1 = by_plugin["test-v1"][1]->summary;
    CHECK(contains(t2, "rD5:9000<0=layers.0.weight:abs -> amax -> _to_copy"));
    CHECK_FALSE(contains(t1, "rD5"));
    CHECK(contains(t1, "rA4"));
    CHECK(contains(t1, "rO6"));
}

TEST_CASE("a plugin exporting version 2 and version 1 descriptors is loaded by the newest") {
    // test-both exports allocscope_plugin_v2 ("test-both") and a good
    // allocscope_plugin_v1 ("test-both-v1"): only the first is taken.
    Captured c;
    PluginHost host(settings_for(c));
    host.load({"test-both"}, plugin_dir());
    CHECK(host.enabled_count() == 1);
    standard_stream().feed(host);
    host.finish();
    CHECK(c.warnings.empty());
    REQUIRE(host.statuses().size() == 1);
    CHECK(host.statuses()[0].name == "test-both");
    CHECK(find_finding(host.findings(), "test-both") != nullptr);
    CHECK(find_finding(host.findings(), "test-both-v1") == nullptr);
}

namespace {

struct InlineState {
    const allocscope_host_v2* host;
    uint64_t frees_with_alloc = 0;
};

allocscope_plugin_status inline_init(const allocscope_host_v2* host, void** state) {
    *state = new InlineState{host};
    return ALLOCSCOPE_PLUGIN_OK;
}

allocscope_plugin_status inline_event(void* state, const allocscope_event_v2* e) {
    auto* s = static_cast<InlineState*>(state);
    // The event mask keeps everything but FREE away.
    if (e->kind != ALLOCSCOPE_EVENT_FREE) return ALLOCSCOPE_PLUGIN_ERROR;
    s->frees_with_alloc += e->alloc_seq != 0;
    return ALLOCSCOPE_PLUGIN_OK;
}

allocscope_plugin_status inline_finish(void* state) {
    auto* s = static_cast<InlineState*>(state);
    allocscope_finding_v2 f{};
    f.struct_size = sizeof f;
    f.severity = ALLOCSCOPE_SEVERITY_WARNING;
    f.count = s->frees_with_alloc;
    f.summary = "inline";
    s->host->emit(s->host->ctx, &f);
    delete s;
    return ALLOCSCOPE_PLUGIN_OK;
}

}  // namespace

TEST_CASE("a descriptor in memory is checked and driven like a loaded one") {
    allocscope_plugin_v2 p{sizeof(allocscope_plugin_v2),
                           ALLOCSCOPE_PLUGIN_V2_ABI_VERSION,
                           "inline-frees",
                           "counts frees of known allocations",
                           ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_FREE),
                           inline_init,
                           inline_event,
                           nullptr,
                           inline_finish};
    Captured c;
    PluginHost host(settings_for(c, {}, 1));
    host.add(&p, "inline");
    allocscope_plugin_v2 bad = p;
    bad.name = "Not Valid";
    host.add(&bad, "bad");
    standard_stream().feed(host);
    host.finish();
    REQUIRE(host.findings().size() == 1);
    CHECK(host.findings()[0].plugin == "inline-frees");
    CHECK(host.findings()[0].count == 1);  // seq 7; seq 11 is unknown, seq 12 failed
    CHECK(host.findings()[0].rank == 1);
    REQUIRE(c.warnings.size() == 1);
    CHECK(contains(c.warnings[0], "invalid plugin name 'Not Valid'"));
}

namespace {

// Sums the bytes of the ALLOC events it sees and of the live table at finish.
struct BytesState {
    const allocscope_host_v2* host;
    uint64_t alloc_bytes = 0;
    uint64_t allocs = 0;
};

allocscope_plugin_status bytes_init(const allocscope_host_v2* host, void** state) {
    *state = new BytesState{host};
    return ALLOCSCOPE_PLUGIN_OK;
}

allocscope_plugin_status bytes_event(void* state, const allocscope_event_v2* e) {
    auto* s = static_cast<BytesState*>(state);
    s->alloc_bytes += e->size;
    ++s->allocs;
    return ALLOCSCOPE_PLUGIN_OK;
}

allocscope_plugin_status bytes_finish(void* state) {
    std::unique_ptr<BytesState> s(static_cast<BytesState*>(state));
    allocscope_finding_v2 f{};
    f.struct_size = sizeof f;
    f.severity = ALLOCSCOPE_SEVERITY_INFO;
    f.bytes = s->alloc_bytes;
    f.count = s->allocs;
    const std::string live =
        "live=" + std::to_string(s->host->live_bytes(s->host->ctx, ALLOCSCOPE_LEVEL_SEGMENT));
    f.summary = live.c_str();
    s->host->emit(s->host->ctx, &f);
    return ALLOCSCOPE_PLUGIN_OK;
}

}  // namespace

TEST_CASE(
    "plugins see runtime segments, driver mappings and blocks; not handles, VA, libraries' "
    "driver allocations or CUDA graph pools' blocks") {
    const allocscope_plugin_v2 p{sizeof(allocscope_plugin_v2),
                                 ALLOCSCOPE_PLUGIN_V2_ABI_VERSION,
                                 "bytes",
                                 "sums allocation bytes",
                                 ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_ALLOC),
                                 bytes_init,
                                 bytes_event,
                                 nullptr,
                                 bytes_finish};
    Stream st;
    st.push("layers.0", "backward");
    auto with = [&](Api api, MemoryKind memory) {
        st.events.back().api = api;
        st.events.back().memory = memory;
    };
    st.alloc(0x1000, 100, Level::segment);  // cudaMalloc: seen
    with(Api::cudaMalloc, MemoryKind::device);
    st.alloc(0x2000, 200, Level::segment);  // a cuBLAS handle's workspace: hidden
    with(Api::cuMemAlloc_v2, MemoryKind::device);
    st.alloc(0x3000, 400, Level::segment);  // a mapping: seen
    with(Api::cuMemMap, MemoryKind::device);
    st.alloc(0x4000, 800, Level::segment);  // its physical handle: hidden
    with(Api::cuMemCreate, MemoryKind::physical);
    st.alloc(0x3000, 1600, Level::segment);  // the VA range (same address as the map): hidden
    with(Api::cuMemAddressReserve, MemoryKind::address_range);
    st.alloc(0x5000, 3200, Level::block, 0);  // a block: seen
    with(Api::block_alloc, MemoryKind::device);
    st.free(0x2000, 200, Level::segment);  // the hidden allocation's free: hidden too
    st.events.back().api = Api::cuMemFree_v2;
    st.alloc(0x6000, 6400, Level::block, 0);  // a block of a CUDA graph's pool: hidden
    with(Api::block_alloc, MemoryKind::device);
    st.events.back().flags = kFlagGraphPool;
    st.events.back().aux = 1;
    st.pop();

    Captured c;
    PluginHost host(settings_for(c, {}, 0));
    host.add(&p, "inline");
    st.feed(host);
    host.finish();
    REQUIRE(host.findings().size() == 1);
    CHECK(host.findings()[0].bytes == 100 + 400 + 3200);
    CHECK(host.findings()[0].count == 3);
    // The mapping was not replaced by the VA range at its address.
    CHECK(host.findings()[0].summary == "live=500");
    CHECK(c.warnings.empty());
}

namespace {

// Checks plugin_v2.h's promise about tag strings: one address per text for
// the host's life (both streams), still readable at finish.
struct InternState {
    const allocscope_host_v2* host;
    std::map<std::string, const char*> first;  // text -> the address it came at
    uint64_t seen = 0;
    uint64_t moved = 0;  // a text at another address than before
};

void intern_check(InternState& s, const char* text) {
    if (!text) return;
    auto [it, added] = s.first.try_emplace(text, text);
    ++s.seen;
    s.moved += !added && it->second != text;
}

allocscope_plugin_status intern_init(const allocscope_host_v2* host, void** state) {
    *state = new InternState{host, {}, 0, 0};
    return ALLOCSCOPE_PLUGIN_OK;
}

allocscope_plugin_status intern_event(void* state, const allocscope_event_v2* e) {
    auto* s = static_cast<InternState*>(state);
    for (const char* text : {e->layer, e->phase, e->alloc_layer, e->alloc_phase})
        intern_check(*s, text);
    s->host->live_foreach(
        s->host->ctx, 0,
        [](void* user, const allocscope_live_v2* l) {
            intern_check(*static_cast<InternState*>(user), l->layer);
            intern_check(*static_cast<InternState*>(user), l->phase);
            return 0;
        },
        s);
    return ALLOCSCOPE_PLUGIN_OK;
}

allocscope_plugin_status intern_finish(void* state) {
    std::unique_ptr<InternState> s(static_cast<InternState*>(state));
    uint64_t unreadable = 0;
    for (const auto& [text, address] : s->first)
        unreadable += text != address;
    const std::string summary =
        "texts=" + std::to_string(s->first.size()) + " seen=" + std::to_string(s->seen) +
        " moved=" + std::to_string(s->moved) + " unreadable=" + std::to_string(unreadable);
    allocscope_finding_v2 f{};
    f.struct_size = sizeof f;
    f.severity = ALLOCSCOPE_SEVERITY_INFO;
    f.summary = summary.c_str();
    s->host->emit(s->host->ctx, &f);
    return ALLOCSCOPE_PLUGIN_OK;
}

}  // namespace

TEST_CASE("tag strings come interned: one address per text until finish, over both streams") {
    const allocscope_plugin_v2 p{sizeof(allocscope_plugin_v2),
                                 ALLOCSCOPE_PLUGIN_V2_ABI_VERSION,
                                 "intern-check",
                                 "checks the addresses of tag strings",
                                 ALLOCSCOPE_EVENT_V2_ALL,
                                 intern_init,
                                 intern_event,
                                 nullptr,
                                 intern_finish};
    // Many distinct tags, so the host's tables grow while pointers are held.
    auto stream = [](int layers) {
        Stream s;
        s.set_step(1);
        for (int i = 0; i < layers; ++i) {
            s.push("layers." + std::to_string(i), i % 2 ? "forward" : "backward/wgrad");
            s.alloc(0x1000 + 0x100 * uint64_t(i), 64, Level::block);
            s.pop();
        }
        for (int i = 0; i < layers; ++i)
            s.free(0x1000 + 0x100 * uint64_t(i), 64, Level::block);
        return s;
    };
    Captured c;
    PluginHost host(settings_for(c, {}, 0, true));
    host.add(&p, "test");
    const Stream baseline = stream(300);
    baseline.feed(host, ALLOCSCOPE_SOURCE_BASELINE);
    // The run through resolved strings: other tables, the same texts.
    const Stream run = stream(400);
    for (const Event& e : run.events) {
        EventText text;
        text.layer = run.strings[e.layer];
        text.phase = run.strings[e.phase];
        host.feed(e, text, ALLOCSCOPE_SOURCE_RUN);
    }
    host.finish();
    REQUIRE(host.findings().size() == 1);
    auto v = fields(host.findings()[0].summary);
    CHECK(v["texts"] == "403");  // "", 400 layers, two phases
    CHECK(std::stoull(v["seen"]) > 4 * 700);
    CHECK(v["moved"] == "0");
    CHECK(v["unreadable"] == "0");
}

namespace {

// (kind, seq) of every event delivered, in order.
std::vector<std::pair<uint32_t, uint64_t>> g_delivered;

allocscope_plugin_status order_init(const allocscope_host_v2*, void** state) {
    *state = nullptr;
    g_delivered.clear();
    return ALLOCSCOPE_PLUGIN_OK;
}

allocscope_plugin_status order_event(void*, const allocscope_event_v2* e) {
    g_delivered.emplace_back(e->kind, e->seq);
    return ALLOCSCOPE_PLUGIN_OK;
}

allocscope_plugin_status order_finish(void*) {
    return ALLOCSCOPE_PLUGIN_OK;
}

const allocscope_plugin_v2 kOrderPlugin{sizeof(allocscope_plugin_v2),
                                        ALLOCSCOPE_PLUGIN_V2_ABI_VERSION,
                                        "order",
                                        "records the order of events",
                                        ALLOCSCOPE_EVENT_V2_ALL,
                                        order_init,
                                        order_event,
                                        nullptr,
                                        order_finish};

std::vector<std::pair<uint32_t, uint64_t>> delivered(const Stream& s) {
    Captured c;
    PluginHost host(settings_for(c, {}, 0, true));
    host.add(&kOrderPlugin, "order");
    s.feed(host, ALLOCSCOPE_SOURCE_RUN);
    host.finish();
    return g_delivered;
}

constexpr uint32_t kPop = ALLOCSCOPE_EVENT_TAG_POP, kAlloc = ALLOCSCOPE_EVENT_ALLOC,
                   kFree = ALLOCSCOPE_EVENT_FREE, kOom = ALLOCSCOPE_EVENT_OOM;

}  // namespace

TEST_CASE(
    "after a failed allocation a thread's pops are held: dropped when it never allocates again") {
    Stream s;
    s.push("layers.0", "forward");
    s.alloc(0x1000, 64, Level::block);     // seq 2
    s.add(EventKind::oom).size = 1 << 30;  // 3: the error unwinds ...
    s.free(0x1000, 64, Level::block);      // 4
    s.pop();                               // 5: ... out of the scope, which did not complete
    const auto d = delivered(s);
    CHECK(std::find(d.begin(), d.end(), std::make_pair(kOom, uint64_t(3))) != d.end());
    CHECK(std::find(d.begin(), d.end(), std::make_pair(kFree, uint64_t(4))) != d.end());
    CHECK(std::find(d.begin(), d.end(), std::make_pair(kPop, uint64_t(5))) == d.end());
}

TEST_CASE("pops held after a failed allocation come, in order, before the thread's next one") {
    Stream s;
    s.push("layers.0", "forward");
    s.push("layers.0.mlp", "forward");
    s.add(EventKind::oom).size = 1 << 30;  // 3
    s.pop();                               // 4
    s.pop();                               // 5
    s.alloc(0x2000, 64, Level::block);     // 6: caught, and the program went on
    s.push("layers.1", "forward");         // 7
    s.pop();                               // 8
    const auto d = delivered(s);
    std::vector<std::pair<uint32_t, uint64_t>> tail(d.end() - 5, d.end());
    CHECK(tail ==
          std::vector<std::pair<uint32_t, uint64_t>>{
              {kPop, 4}, {kPop, 5}, {kAlloc, 6}, {ALLOCSCOPE_EVENT_TAG_PUSH, 7}, {kPop, 8}});
}

// --- end to end -------------------------------------------------------------------

namespace {

std::string cli() {
    const std::string c = env_or_empty("E2E_CLI");
    REQUIRE_MESSAGE(!c.empty(), "E2E_CLI must be set (see tests/meson.build)");
    return c;
}

std::string program() {
    const std::string p = env_or_empty("E2E_PROGRAM");
    REQUIRE_MESSAGE(!p.empty(), "E2E_PROGRAM must be set (see tests/meson.build)");
    return p;
}

const std::string kPluginArgs =
    " --plugins test-count,test-error,test-throw --plugin-option test-count.evidence=1000"
    " --plugin-option test-count.severity=warning";

}  // namespace

TEST_CASE("live plugins in a traced program find what replay finds on its trace") {
    TempDir s;
    const fs::path out = s / "out";
    ShellResult run = run_shell(cli() + " run --out " + out.string() + " --plugin-dir " +
                                plugin_dir() + kPluginArgs + " -- " + program() + " script");
    INFO(run.err);
    CHECK(run.status == 0);
    CHECK(contains(run.out, "script done: 0 failure(s)\n"));
    // One message per broken plugin; the program never noticed.
    CHECK(count_lines(run.err, "plugin test-error disabled: on_event returned an error") == 1);
    CHECK(count_lines(run.err, "plugin test-throw disabled: on_event threw: boom on event 2") == 1);
    const auto traces = files_matching(out, "pid", ".trace");
    REQUIRE(traces.size() == 1);
    const auto rank_files = files_matching(out, "findings.pid", ".json");
    REQUIRE(rank_files.size() == 1);
    CHECK(rank_files[0].filename().string() == "findings." + traces[0].stem().string() + ".json");
    REQUIRE(fs::exists(out / "findings.json"));
    // The run's summary: one line per finding, naming the process (it had
    // no rank) by the pid its trace is named after.
    const std::string who = "pid " + traces[0].stem().string().substr(3);
    CHECK(count_lines(run.err, "warning test-count  " + who + "  ") == 1);
    CHECK(count_lines(run.err, "test-error  " + who + "  ") == 1);

    const Trace trace = load_trace(traces[0].string());
    REQUIRE(trace.footer.has_value());
    const FindingsFile live = read_findings_file((out / "findings.json").string());
    const Finding* count = find_finding(live.findings, "test-count");
    REQUIRE(count != nullptr);
    // Every event of the trace reached the plugin, except frees the runtime
    // refused.
    size_t failed_frees = static_cast<size_t>(
        std::count_if(trace.events.begin(), trace.events.end(),
                      [](const Event& e) { return e.kind == EventKind::free && e.result != 0; }));
    CHECK(failed_frees >= 2);
    CHECK(count->count == trace.events.size() - failed_frees);
    // At exit only the script's deliberately kept, untagged 12000 bytes live.
    REQUIRE(count->evidence.size() == 1);
    CHECK(count->evidence[0].size == 12000);
    CHECK(count->evidence[0].layer == "");
    CHECK(count->bytes == 12000);
    CHECK(count->severity == Severity::warning);
    REQUIRE(live.ranks.size() == 1);
    CHECK(live.ranks[0].trace == traces[0].filename().string());
    CHECK(live.ranks[0].plugins == std::vector<std::string>{"test-count"});
    REQUIRE(live.ranks[0].disabled.size() == 2);

    ShellResult replay =
        run_shell(cli() + " replay " + out.string() + " --plugin-dir " + plugin_dir() +
                  kPluginArgs + " -o " + (s / "replay.json").string());
    INFO(replay.err);
    CHECK(replay.status == 4);  // test-throw and test-error did not run to the end
    const FindingsFile offline = read_findings_file((s / "replay.json").string());
    CHECK(offline == live);
    CHECK(slurp(s / "replay.json") == slurp(out / "findings.json"));
    // The summary went to stdout, the broken plugins' messages to stderr.
    CHECK(count_lines(replay.out, "warning test-count  " + who + "  ") == 1);
    CHECK(count->pid == std::stoul(traces[0].stem().string().substr(3)));
    CHECK(count_lines(replay.err, "plugin test-throw disabled") == 1);
}

TEST_CASE("a version 1 plugin runs live in a traced program through the v1 adapter") {
    TempDir s;
    const fs::path out = s / "out";
    ShellResult run =
        run_shell(cli() + " run --out " + out.string() + " --plugin-dir " + plugin_dir() +
                  " --plugins test-count,test-legacy -- " + program() + " script");
    INFO(run.err);
    CHECK(run.status == 0);
    CHECK(count_lines(run.err, "disabled") == 0);
    const FindingsFile live = read_findings_file((out / "findings.json").string());
    REQUIRE(live.ranks.size() == 1);
    CHECK(live.ranks[0].plugins == std::vector<std::string>{"test-count", "test-legacy"});
    CHECK(live.ranks[0].disabled.empty());
    const Finding* v2 = find_finding(live.findings, "test-count");
    const Finding* v1 = find_finding(live.findings, "test-legacy");
    REQUIRE(v2 != nullptr);
    REQUIRE(v1 != nullptr);
    auto f2 = fields(v2->summary);
    auto f1 = fields(v1->summary);
    // Every event version 2 got, less the kinds version 1 lacks.
    CHECK(std::stoull(f1["events"]) + std::stoull(f2["derived"]) == std::stoull(f2["events"]));
    CHECK(std::stoull(f1["alloc"]) > 0);
    CHECK(f1["alloc"] == f2["alloc"]);
    CHECK(f1["free"] == f2["free"]);
    CHECK(f1["derived"] == "0");
    CHECK(f1["oom_address_sum"] == "0");
    CHECK(v1->evidence == v2->evidence);
}

TEST_CASE("replay delivers the baseline trace of the same rank first") {
    TempDir s;
    fs::create_directories(s / "base");
    fs::create_directories(s / "run");
    for (int32_t rank : {0, 1}) {
        Stream base;
        base.set_step(1);
        base.alloc(0x1000, 100 + uint64_t(rank), Level::block);
        base.write((s / "base" / ("rank" + std::to_string(rank) + ".trace")).string(), rank);
        Stream run;
        run.set_step(1);
        run.alloc(0x1000, 200 + uint64_t(rank), Level::block);
        run.alloc(0x2000, 300, Level::segment, 1);
        run.write((s / "run" / ("rank" + std::to_string(rank) + ".trace")).string(), rank);
    }
    ShellResult r = run_shell(
        cli() + " replay " + (s / "run").string() + " --baseline " + (s / "base").string() +
        " --plugins " + plugin_dir() +
        "/allocscope-plugin-test-count.so --plugin-option test-count.transcript=1" + " -o -");
    INFO(r.err);
    REQUIRE(r.status == 0);
    const FindingsFile f = parse_findings(r.out, "stdout");
    std::vector<std::string> transcripts;
    for (const Finding& x : f.findings) {
        if (x.layer == "transcript")
            transcripts.push_back(std::to_string(x.rank) + ": " + x.summary);
    }
    CHECK(transcripts ==
          std::vector<std::string>{"0: S1 bS1 bA2@/:100L100 s1 rS1 rA2@/:200L200 rA3@/:300L500",
                                   "1: S1 bS1 bA2@/:101L101 s1 rS1 rA2@/:201L201 rA3@/:300L501"});
    REQUIRE(f.ranks.size() == 2);
    CHECK(f.ranks[0].trace == "rank0.trace");
    CHECK(f.ranks[1].rank == 1);
    // The summary went to stderr with -o -.
    CHECK(count_lines(r.err, "info    test-count  rank 1") == 2);

    // A rank without a baseline is refused before anything runs.
    fs::remove(s / "base" / "rank1.trace");
    ShellResult missing = run_shell(cli() + " replay " + (s / "run").string() + " --baseline " +
                                    (s / "base").string() + " --plugins none");
    CHECK(missing.status == 2);
    CHECK(count_lines(missing.err, "allocscope:") == 1);
    CHECK(contains(missing.err, "no baseline trace of rank 1"));

    // A corrupt trace: one message, exit 2.
    flip_byte(s / "run" / "rank0.trace", 72 + 12 + 2);
    ShellResult corrupt = run_shell(cli() + " replay " + (s / "run").string() + " --plugins none");
    CHECK(corrupt.status == 2);
    CHECK(count_lines(corrupt.err, "allocscope:") == 1);
    CHECK(contains(corrupt.err, "rank0.trace"));
}

TEST_CASE("run --check and check gate on the findings' severity") {
    TempDir s;
    const fs::path out = s / "out";
    const std::string base = cli() + " run --out " + out.string() + " --force --plugin-dir " +
                             plugin_dir() + " --plugins test-count";
    // The count plugin's one finding has the severity its option says.
    ShellResult warn = run_shell("RANK=2 " + base + " --plugin-option test-count.severity=warning" +
                                 " --check --fail-on warning -- " + program() + " exit 0");
    INFO(warn.err);
    CHECK(warn.status == 3);
    CHECK(fs::exists(out / "findings.rank2.json"));
    ShellResult pass = run_shell("RANK=2 " + base + " --plugin-option test-count.severity=warning" +
                                 " --check -- " + program() + " exit 0");
    CHECK(pass.status == 0);
    // The program's own failure wins over the verdict.
    ShellResult failed = run_shell("RANK=2 " + base + " --plugin-option test-count.severity=error" +
                                   " --check -- " + program() + " exit 5");
    CHECK(failed.status == 5);

    // check on the directory and on the file.
    CHECK(run_shell(cli() + " check " + out.string()).status == 3);  // error severity, default gate
    CHECK(run_shell(cli() + " check " + (out / "findings.json").string() + " --fail-on error")
              .status == 3);
    ShellResult info_run = run_shell("RANK=2 " + base + " -- " + program() + " exit 0");
    CHECK(info_run.status == 0);
    CHECK(run_shell(cli() + " check " + out.string()).status == 0);
    CHECK(run_shell(cli() + " check " + out.string() + " --fail-on warning").status == 0);
    ShellResult info = run_shell(cli() + " check " + out.string() + " --fail-on info");
    CHECK(info.status == 3);
    CHECK(count_lines(info.out, "info    test-count  rank 2") == 1);
    CHECK(contains(info.out, "check failed: 1 finding(s) at or above info"));

    // Bad input: exit 2 with one message.
    ShellResult bad_sev = run_shell(cli() + " check " + out.string() + " --fail-on fatal");
    CHECK(bad_sev.status == 2);
    CHECK(count_lines(bad_sev.err, "allocscope:") == 1);
    ShellResult missing = run_shell(cli() + " check " + (s / "nope.json").string());
    CHECK(missing.status == 2);
    CHECK(contains(missing.err, "nope.json"));
    std::ofstream(s / "corrupt.json") << "{\"findings\": [{\"plugin\": \"x\",";
    ShellResult corrupt = run_shell(cli() + " check " + (s / "corrupt.json").string());
    CHECK(corrupt.status == 2);
    CHECK(count_lines(corrupt.err, "allocscope:") == 1);
    CHECK(contains(corrupt.err, "corrupt.json: line 1"));
    CHECK(corrupt.out.empty());

    // --check without plugins cannot vouch for anything: it fails closed.
    ShellResult none = run_shell(base + " --check --plugins none -- " + program() + " exit 0");
    CHECK(none.status == 2);  // refused before the program runs
    ShellResult no_files = run_shell("ALLOCSCOPE_PLUGINS=none " + cli() + " run --out " +
                                     out.string() + " --force --check -- " + program() + " exit 0");
    CHECK(no_files.status == 4);
    CHECK(contains(no_files.err, "check failed: nothing was checked: no findings files"));
}

TEST_CASE(
    "gates fail closed: a plugin that did not run or a run that wrote no trace is exit 4, not a "
    "pass") {
    TempDir s;
    const fs::path out = s / "out";
    const std::string base =
        cli() + " run --out " + out.string() + " --force --plugin-dir " + plugin_dir();
    // A mistyped plugin name, or an option no plugin reads, is found before
    // the program starts: run refuses to start it, whether or not --check.
    for (const std::string& wrong :
         {std::string(" --plugins test-count,nosuch"),
          std::string(" --plugins test-count --plugin-option test-cuont.severity=error"),
          std::string(" --plugins test-count --plugin-option test-count.severity_=error")}) {
        CAPTURE(wrong);
        for (const std::string& check : {std::string(), std::string(" --check")}) {
            ShellResult r = run_shell(base + wrong + check + " -- " + program() + " exit 0");
            CHECK(r.status == 2);
            CHECK(count_lines(r.err, " was not started") == 1);
            CHECK(count_lines(r.err, "allocscope:") == 2);
            CHECK_FALSE(fs::exists(out / "rank0.trace"));
        }
    }
    ShellResult typo = run_shell(base + " --plugins test-count,nosuch -- " + program() + " exit 0");
    CHECK(contains(typo.err, "no allocscope-plugin-nosuch.so in "));
    ShellResult key =
        run_shell(base + " --plugins test-count --plugin-option test-count.sevrity=1 -- " +
                  program() + " exit 0");
    CHECK(contains(key.err,
                   "plugin test-count disabled: option 'test-count.sevrity' is not one it "
                   "reads (its options: severity, evidence, transcript)"));
    ShellResult name = run_shell(base +
                                 " --plugin-option test-cuont.severity=error --plugins "
                                 "test-count -- " +
                                 program() + " exit 0");
    CHECK(contains(name.err,
                   "plugin option 'test-cuont.severity' names no loaded plugin ('test-cuont')"));

    // A process traced without the CLI finds the same mistakes when its
    // plugins start: test-count ran and found nothing at error, but nosuch
    // checked nothing, and a check of the run says so.
    const std::string lib =
        (fs::path(cli()).parent_path() / ".." / "interposer" / "liballocscope.so").string();
    const std::string traced = "RANK=0 ALLOCSCOPE_PLUGIN_DIR=" + plugin_dir() +
                               " ALLOCSCOPE_LOG=quiet LD_PRELOAD=" + lib +
                               " ALLOCSCOPE_OUT=" + out.string() + " ";
    fs::remove_all(out);
    ShellResult plain =
        run_shell(traced + "ALLOCSCOPE_PLUGINS=test-count,nosuch " + program() + " exit 0");
    CHECK(plain.status == 0);  // the program's status stands, whatever did not load
    ShellResult check = run_shell(cli() + " check " + out.string());
    CHECK(check.status == 4);
    CHECK(contains(check.out, "plugin nosuch on "));
    for (const std::string& options :
         {std::string("test-count.sevrity=1"), std::string("test-cuont.severity=error")}) {
        CAPTURE(options);
        fs::remove_all(out);
        ShellResult r = run_shell(
            traced + "ALLOCSCOPE_PLUGINS=test-count ALLOCSCOPE_PLUGIN_OPTIONS=" + options + " " +
            program() + " exit 0");
        CHECK(r.status == 0);
        ShellResult c = run_shell(cli() + " check " + out.string());
        CHECK(c.status == 4);
    }
    // Findings at or above the threshold still say 3, and the same line
    // says what was not checked.
    fs::remove_all(out);
    ShellResult both_run = run_shell(traced +
                                     "ALLOCSCOPE_PLUGINS=test-count,nosuch "
                                     "ALLOCSCOPE_PLUGIN_OPTIONS=test-count.severity=error " +
                                     program() + " exit 0");
    CHECK(both_run.status == 0);
    ShellResult both = run_shell(cli() + " check " + out.string());
    CHECK(both.status == 3);
    CHECK(count_lines(both.out,
                      "check failed: 1 finding(s) at or above error; and not everything was "
                      "checked: plugin nosuch") == 1);
    // No process recorded (recording disabled): nothing was checked.
    ShellResult disabled = run_shell("ALLOCSCOPE_DISABLE=1 " + base +
                                     " --plugins test-count --check -- " + program() + " exit 0");
    CHECK(disabled.status == 4);
    CHECK(contains(disabled.err, "nothing was checked: no process wrote a trace"));
    // replay: a plugin that did not run is exit 4 with one line; the
    // others' findings are still written.
    ShellResult written = run_shell(base + " --plugins test-count -- " + program() + " exit 0");
    REQUIRE(written.status == 0);
    ShellResult replay =
        run_shell(cli() + " replay " + out.string() + " --plugin-dir " + plugin_dir() +
                  " --plugins test-count,typo -o " + (s / "replayed.json").string());
    CHECK(replay.status == 4);
    CHECK(count_lines(replay.err, "not everything was replayed: plugin typo") == 1);
    CHECK(fs::exists(s / "replayed.json"));
}

TEST_CASE("plugins never run in a forked child; the parent's findings cover its own stream") {
#if defined(__SANITIZE_THREAD__)
    // The program forks while allocscope's writer thread may be dlopen'ing
    // the plugin; under ThreadSanitizer the child can then hang in the
    // sanitizer runtime's own locks (seen: a 180 s timeout in CI's TSan
    // stage). The plain and ASan builds run this case.
    MESSAGE("skipped under ThreadSanitizer");
    return;
#endif
    TempDir s;
    const fs::path out = s / "out";
    ShellResult r = run_shell(cli() + " run --out " + out.string() + " --plugin-dir " +
                              plugin_dir() + " --plugins test-count -- " + program() + " fork");
    CHECK(r.status == 0);
    CHECK(r.out == "fork done: child ok\n");
    const auto rank_files = files_matching(out, "findings.", ".json");
    REQUIRE(rank_files.size() == 2);  // the parent's and the merged findings.json
    const FindingsFile f = read_findings_file((out / "findings.json").string());
    REQUIRE(f.findings.size() == 1);
    auto v = fields(f.findings[0].summary);
    CHECK(v["alloc"] == "1");  // 3333 in the parent; the child's 2222 is nowhere
    CHECK(v["alloc_bytes"] == "3333");
    CHECK(v["mark"] == "1");
}

TEST_CASE("ALLOCSCOPE_PLUGINS=none runs no plugin and writes no findings") {
    TempDir s;
    const fs::path out = s / "out";
    ShellResult r =
        run_shell("ALLOCSCOPE_PLUGIN_DIR=" + plugin_dir() + " ALLOCSCOPE_PLUGINS=none " + cli() +
                  " run --out " + out.string() + " -- " + program() + " exit 0");
    CHECK(r.status == 0);
    CHECK(files_matching(out, "findings", ".json").empty());
    CHECK(files_matching(out, "pid", ".trace").size() == 1);
}

TEST_CASE("an unwritable findings file costs one warning; program and trace are unaffected") {
    TempDir s;
    const fs::path out = s / "out";
    fs::create_directories(out / "findings.rank5.json" / "occupied");
    const std::string lib =
        (fs::path(cli()).parent_path() / ".." / "interposer" / "liballocscope.so").string();
    ShellResult r =
        run_shell("RANK=5 ALLOCSCOPE_PLUGIN_DIR=" + plugin_dir() +
                  " ALLOCSCOPE_PLUGINS=test-count ALLOCSCOPE_LOG=quiet LD_PRELOAD=" + lib +
                  " ALLOCSCOPE_OUT=" + out.string() + " " + program() + " script");
    CHECK(r.status == 0);
    CHECK(contains(r.out, "script done: 0 failure(s)\n"));
    CHECK(count_lines(r.err, "allocscope:") == 1);
    CHECK(count_lines(r.err, "allocscope: findings not written: cannot write") == 1);
    Trace t = load_trace((out / "rank5.trace").string());
    CHECK(t.footer.has_value());
}

TEST_CASE("a bad plugin list or option is refused by the CLI with exit 2") {
    TempDir s;
    for (const std::string& args :
         {std::string(" run --plugins a,,b -- true"), std::string(" run --plugins none,a -- true"),
          std::string(" run --plugin-option nodot=1 -- true"),
          std::string(" run --plugin-option Bad.k=1 -- true"),
          std::string(" run --fail-on fatal -- true"), std::string(" replay /nonexistent/dir"),
          std::string(" replay --plugin-option x.y -o - /tmp")}) {
        CAPTURE(args);
        ShellResult r = run_shell(cli() + args);
        CHECK(r.status == 2);
        CHECK(count_lines(r.err, "allocscope:") == 1);
    }
    // Replaying with no plugin at all would find nothing and look clean.
    fs::create_directories(s / "empty");
    ShellResult none =
        run_shell(cli() + " replay " + s.dir.string() + " --plugin-dir " + (s / "empty").string());
    CHECK(none.status == 2);
    CHECK(contains(none.err, "no plugins (allocscope-plugin-*.so) in "));
}

TEST_CASE("a derived event reaches plugins with the host's index of its parameter and its text") {
    // Two streams (baseline mode): the run's param 0 is the host's param 1,
    // so the index must be mapped, not passed through.
    Stream base;
    base.set_step(1);
    base.param("layers.0", "weight", 4096, "bf16", 4096);  // host param 0
    Stream run;
    run.set_step(1);
    run.push("layers.0", "forward");
    run.param("layers.1", "weight", 4096, "bf16", 4096);  // seq 3: host param 1
    run.alloc(0x9000, 4096, Level::block);                // seq 4
    run.derived(0x9000, 0, "abs -> amax -> _to_copy");    // seq 5
    run.derived(0x9000, 7, "");                           // seq 6: a param never registered
    run.pop();
    Captured c;
    HostSettings settings = settings_for(c, {{"test-count.transcript", "1"}});
    settings.has_baseline = true;
    PluginHost host(settings);
    host.load({"test-count"}, plugin_dir());
    base.feed(host, ALLOCSCOPE_SOURCE_BASELINE);
    run.feed(host, ALLOCSCOPE_SOURCE_RUN);
    host.finish();
    REQUIRE(host.findings().size() == 2);
    const std::string transcript = host.findings()[1].summary;
    CHECK(contains(transcript, "rD5:9000<1=layers.1.weight:abs -> amax -> _to_copy"));
    CHECK_FALSE(contains(transcript, "rD6"));
    CHECK(contains(host.findings()[0].summary, "derived=1 "));
}

namespace {

// Emits one finding with basis and evidence notes: a version 2 plugin, or a
// version 1 plugin, whose finding as released has neither ("released") or,
// built against plugin_v1.h as it was between the versions, has them
// appended ("appended").
template <class Host>
struct NotesState {
    const Host* host;
    const char* layout;  // options are read in init (plugins/README.md)
};

template <class Host>
allocscope_plugin_status notes_init(const Host* host, void** state) {
    *state = new NotesState<Host>{host, host->option(host->ctx, "layout")};
    return ALLOCSCOPE_PLUGIN_OK;
}

allocscope_plugin_status notes_event(void*, const allocscope_event_v2*) {
    return ALLOCSCOPE_PLUGIN_OK;
}

allocscope_plugin_status notes_event_v1(void*, const allocscope_event_v1*) {
    return ALLOCSCOPE_PLUGIN_OK;
}

const allocscope_evidence_v2 kNotesEvidence[2] = {{512, "layers.0", "forward", 1, 4, 0, 0},
                                                  {1024, "layers.0", "forward", 1, 5, 9, 0}};
const char* const kNotes[2] = {"derived from layers.0.weight: cast", nullptr};

allocscope_plugin_status notes_finish(void* state) {
    std::unique_ptr<NotesState<allocscope_host_v2>> s(
        static_cast<NotesState<allocscope_host_v2>*>(state));
    allocscope_finding_v2 f{};
    f.struct_size = sizeof f;
    f.severity = ALLOCSCOPE_SEVERITY_ERROR;
    f.summary = "notes";
    f.evidence = kNotesEvidence;
    f.evidence_count = 2;
    f.basis = "proven";
    f.evidence_notes = kNotes;
    s->host->emit(s->host->ctx, &f);
    return ALLOCSCOPE_PLUGIN_OK;
}

allocscope_plugin_status notes_finish_v1(void* state) {
    std::unique_ptr<NotesState<allocscope_host_v1>> s(
        static_cast<NotesState<allocscope_host_v1>*>(state));
    struct Appended {
        allocscope_finding_v1 base;
        const char* basis;
        const char* const* evidence_notes;
    } f{};
    f.base.struct_size = s->layout && std::string(s->layout) == "appended"
                             ? uint32_t{sizeof f}
                             : uint32_t{sizeof f.base};
    f.base.severity = ALLOCSCOPE_SEVERITY_ERROR;
    f.base.summary = "notes";
    f.base.evidence = kNotesEvidence;
    f.base.evidence_count = 2;
    f.basis = "proven";
    f.evidence_notes = kNotes;
    s->host->emit(s->host->ctx, &f.base);
    return ALLOCSCOPE_PLUGIN_OK;
}

}  // namespace

TEST_CASE("a finding's basis and evidence notes are kept; a version 1 finding's only if appended") {
    const allocscope_plugin_v2 p{sizeof(allocscope_plugin_v2),
                                 ALLOCSCOPE_PLUGIN_V2_ABI_VERSION,
                                 "notes",
                                 "emits basis and notes",
                                 0,
                                 notes_init<allocscope_host_v2>,
                                 notes_event,
                                 nullptr,
                                 notes_finish};
    const allocscope_plugin_v1 p1{sizeof(allocscope_plugin_v1),
                                  1,
                                  "notes",
                                  "emits basis and notes (version 1)",
                                  0,
                                  notes_init<allocscope_host_v1>,
                                  notes_event_v1,
                                  nullptr,
                                  notes_finish_v1};
    for (const char* layout : {"v2", "released", "appended"}) {
        CAPTURE(layout);
        const bool v2 = std::string(layout) == "v2";
        Captured c;
        PluginHost host(settings_for(c, {{"notes.layout", layout}}));
        if (v2) {
            host.add(&p, "inline");
        } else {
            host.add(&p1, "inline");
        }
        host.finish();
        CHECK(c.warnings.empty());
        REQUIRE(host.findings().size() == 1);
        const Finding& f = host.findings()[0];
        // The largest first: the 1,024 B allocation, given second; each
        // note stays with its allocation.
        REQUIRE(f.evidence.size() == 2);
        CHECK(f.evidence[0].size == 1024);
        CHECK(f.evidence[0].note == "");
        CHECK(f.evidence[1].size == 512);
        if (std::string(layout) != "released") {
            CHECK(f.basis == "proven");
            CHECK(f.evidence[1].note == "derived from layers.0.weight: cast");
        } else {
            // Version 1 as released has neither: the defaults.
            CHECK(f.basis == "");
            CHECK(f.evidence[1].note == "");
        }
        // Both survive the findings file.
        FindingsFile file;
        file.findings = host.findings();
        CHECK(parse_findings(to_json(file), "test") == file);
    }
}

TEST_CASE("a version 2 finding shorter than allocscope_finding_v2 disables its plugin") {
    struct Short {
        static allocscope_plugin_status init(const allocscope_host_v2* host, void** state) {
            *state = const_cast<allocscope_host_v2*>(host);
            return ALLOCSCOPE_PLUGIN_OK;
        }
        static allocscope_plugin_status finish(void* state) {
            const auto* host = static_cast<const allocscope_host_v2*>(state);
            allocscope_finding_v2 f{};
            f.struct_size = offsetof(allocscope_finding_v2, basis);
            f.summary = "short";
            host->emit(host->ctx, &f);
            return ALLOCSCOPE_PLUGIN_OK;
        }
    };
    const allocscope_plugin_v2 p{sizeof(allocscope_plugin_v2),
                                 ALLOCSCOPE_PLUGIN_V2_ABI_VERSION,
                                 "short",
                                 "emits a short finding",
                                 0,
                                 Short::init,
                                 nullptr,
                                 nullptr,
                                 Short::finish};
    Captured c;
    PluginHost host(settings_for(c));
    host.add(&p, "inline");
    host.finish();
    CHECK(host.findings().empty());
    REQUIRE(c.warnings.size() == 1);
    CHECK(contains(c.warnings[0], "plugin short disabled: emitted a finding with struct_size " +
                                      std::to_string(offsetof(allocscope_finding_v2, basis)) +
                                      ", expected at least " +
                                      std::to_string(sizeof(allocscope_finding_v2))));
}
