// End-to-end through LD_PRELOAD: tests/e2e/preload_program.cpp runs under
// `allocscope run` against a CUDA runtime it is dynamically linked with (the
// host-memory runtime in CI; the real one in the GPU variant), and the trace
// it leaves is checked event by event.
//
// Environment (set by tests/meson.build):
//   E2E_CLI      build/tools/allocscope
//   E2E_PROGRAM  the test program
//   E2E_GPU      1 for the real-runtime variant: exits 77 without a usable GPU
// Longer than 600 lines: the end-to-end specification of recording under
// LD_PRELOAD; its cases share the runner and trace helpers above.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "support.h"
#include "trace_reader.h"

namespace fs = std::filesystem;
using allocscope::test::count_lines;
using allocscope::test::run_shell;
using allocscope::test::ShellResult;
using allocscope::test::slurp;
using allocscope::test::TempDir;
using namespace allocscope;

namespace {

std::string g_cli;
std::string g_program;
std::string g_local_lib;
std::string g_local_loader;
bool g_gpu = false;

std::vector<fs::path> traces_in(const fs::path& dir) {
    std::vector<fs::path> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        if (e.path().extension() == ".trace") out.push_back(e.path());
    }
    std::sort(out.begin(), out.end());
    return out;
}

struct LoggedCall {
    std::string what, api;
    uint64_t ptr = 0;
    uint64_t bytes = 0;
    int rc = 0;
};

std::vector<LoggedCall> read_log(const fs::path& p) {
    std::vector<LoggedCall> calls;
    std::ifstream in(p);
    for (std::string line; std::getline(in, line);) {
        std::istringstream ls(line);
        LoggedCall c;
        std::string a, b;
        ls >> c.what >> c.api >> a >> b;
        if (c.what == "alloc") {
            c.ptr = std::stoull(a, nullptr, 16);
            c.bytes = std::stoull(b);
        } else if (c.what == "device") {
            c.rc = std::stoi(c.api);
        } else if (c.what == "free") {
            c.ptr = std::stoull(a, nullptr, 16);
            c.rc = std::stoi(b);
        } else {
            c.bytes = std::stoull(a);
            c.rc = std::stoi(b);
        }
        calls.push_back(c);
    }
    return calls;
}

// The script run shared by most cases, recorded once.
struct ScriptRun {
    TempDir scratch;
    ShellResult result;
    Trace trace;
    std::vector<LoggedCall> calls;

    explicit ScriptRun(const std::string& env = "") {
        fs::path out = scratch / "out";
        result = run_shell(env + " E2E_LOG=" + (scratch / "calls.log").string() + " " + g_cli +
                           " run --out " + out.string() + " -- " + g_program + " script");
        if (result.status != 0) std::fprintf(stderr, "program stderr:\n%s", result.err.c_str());
        auto files = traces_in(out);
        REQUIRE(files.size() == 1);
        trace = load_trace(files[0].string());
        calls = read_log(scratch / "calls.log");
    }

    std::vector<Event> events(EventKind kind) const {
        std::vector<Event> out;
        for (const Event& e : trace.events) {
            if (e.kind == kind) out.push_back(e);
        }
        return out;
    }
    // The alloc event of the n-th logged allocation. Both are in program
    // order (the script's one extra thread is joined before it goes on), and
    // matching by order rather than address is needed because the runtime
    // may hand out a freed address again.
    const Event* alloc_of(const LoggedCall& call) const {
        size_t n = 0;
        for (const LoggedCall& c : calls) {
            if (&c == &call) break;
            n += c.what == "alloc";
        }
        for (const Event& e : trace.events) {
            if (e.kind != EventKind::alloc || e.level != Level::segment) continue;
            if (n-- == 0) return e.address == call.ptr ? &e : nullptr;
        }
        return nullptr;
    }
    std::string layer(const Event& e) const { return trace.str(e.layer); }
    std::string phase(const Event& e) const { return trace.str(e.phase); }
};

const ScriptRun& script_run() {
    static ScriptRun run;
    return run;
}

}  // namespace

TEST_CASE("every hooked runtime function is interposed and its events carry the real sizes") {
    const ScriptRun& r = script_run();
    CHECK(r.result.status == 0);
    CHECK(r.result.out.find("script done: 0 failure(s)\n") != std::string::npos);
    int checked = 0;
    for (const LoggedCall& c : r.calls) {
        if (c.what != "alloc") continue;
        CAPTURE(c.api);
        const Event* e = r.alloc_of(c);
        REQUIRE(e != nullptr);
        CHECK(to_string(e->api) == c.api);
        CHECK(e->size == c.bytes);
        CHECK(e->level == Level::segment);
        CHECK(e->result == 0);
        ++checked;
    }
    CHECK(checked >= 13);
    for (std::string api :
         {"cudaMalloc", "cudaMallocAsync", "cudaMallocAsync_ptsz", "cudaMallocFromPoolAsync",
          "cudaMallocFromPoolAsync_ptsz", "cudaMallocManaged", "cudaMallocPitch", "cudaMallocHost",
          "cudaHostAlloc"}) {
        CAPTURE(api);
        CHECK(std::count_if(r.trace.events.begin(), r.trace.events.end(), [&](const Event& e) {
                  return e.kind == EventKind::alloc && to_string(e.api) == api;
              }) >= 1);
    }
}

TEST_CASE("device memory is attributed to the device current on the allocating thread") {
    const ScriptRun& r = script_run();
    int checked = 0;
    for (size_t i = 0; i + 1 < r.calls.size(); ++i) {
        const LoggedCall& c = r.calls[i];
        if (c.what != "alloc" || r.calls[i + 1].what != "device") continue;
        const Event* e = r.alloc_of(c);
        REQUIRE(e != nullptr);
        CHECK(e->device == r.calls[i + 1].rc);
        ++checked;
    }
    CHECK(checked >= 1);
    for (const Event& e : r.events(EventKind::alloc)) {
        if (e.memory == MemoryKind::host_pinned) {
            CHECK(e.device == -1);
        } else {
            CHECK(e.device >= 0);
        }
    }
}

TEST_CASE("memory kinds: managed, host pinned and device memory are told apart") {
    const ScriptRun& r = script_run();
    for (const LoggedCall& c : r.calls) {
        if (c.what != "alloc") continue;
        const Event* e = r.alloc_of(c);
        REQUIRE(e != nullptr);
        MemoryKind want = c.api == "cudaMallocManaged" ? MemoryKind::managed
                          : (c.api == "cudaMallocHost" || c.api == "cudaHostAlloc")
                              ? MemoryKind::host_pinned
                              : MemoryKind::device;
        CAPTURE(c.api);
        CHECK(e->memory == want);
    }
}

TEST_CASE("a runtime function calling another hooked one is recorded once") {
    // The host-memory runtime implements cudaMallocHost through cudaHostAlloc
    // via the PLT; the nested call must not produce a second event.
    const ScriptRun& r = script_run();
    auto host_allocs =
        std::count_if(r.trace.events.begin(), r.trace.events.end(), [](const Event& e) {
            return e.kind == EventKind::alloc && e.memory == MemoryKind::host_pinned;
        });
    CHECK(host_allocs == 2);
}

TEST_CASE("frees are recorded with the freed size and the real return code") {
    const ScriptRun& r = script_run();
    std::vector<LoggedCall> logged_frees;
    for (const LoggedCall& c : r.calls) {
        if (c.what == "free") logged_frees.push_back(c);
    }
    std::vector<Event> frees;
    for (const Event& e : r.events(EventKind::free)) {
        if (e.level == Level::segment) frees.push_back(e);
    }
    REQUIRE(frees.size() == logged_frees.size());
    std::map<uint64_t, const Event*> live;  // address -> its alloc, replayed in order
    size_t next_free = 0;
    for (const Event& e : r.trace.events) {
        if (e.level != Level::segment) continue;
        if (e.kind == EventKind::alloc) live[e.address] = &e;
        if (e.kind != EventKind::free) continue;
        const LoggedCall& c = logged_frees[next_free++];
        CAPTURE(c.api);
        CHECK(to_string(e.api) == c.api);
        CHECK(e.address == c.ptr);
        CHECK(e.result == c.rc);  // the real return code, unchanged
        auto it = live.find(e.address);
        if (c.rc == 0) {
            REQUIRE(it != live.end());
            CHECK(e.size == it->second->size);
            CHECK(it->second->seq < e.seq);  // per address, free follows alloc
            CHECK(e.flags == 0);
            live.erase(it);
        } else {
            CHECK(it == live.end());
            CHECK(e.size == 0);
        }
    }
    CHECK(next_free >= 14);
}

TEST_CASE("a double free and a free of an unknown pointer are counted and passed through") {
    const ScriptRun& r = script_run();
    int doubles = 0, unknown = 0;
    for (const Event& e : r.events(EventKind::free)) {
        if (e.flags & kFlagDoubleFree) {
            ++doubles;
            CHECK(e.result != 0);  // the runtime's error, passed through
        }
        if (e.flags & kFlagUnknownAddress) {
            ++unknown;
            CHECK(e.result != 0);
        }
    }
    CHECK(doubles == 1);
    CHECK(unknown == 1);
    REQUIRE(r.trace.footer.has_value());
    CHECK(r.trace.footer->double_frees == 1);
    CHECK(r.trace.footer->unknown_frees == 1);
}

TEST_CASE("a failed allocation is passed through unchanged and recorded as oom") {
    const ScriptRun& r = script_run();
    auto ooms = r.events(EventKind::oom);
    REQUIRE(ooms.size() == 1);
    CHECK(ooms[0].size == (uint64_t{1} << 50));
    CHECK(ooms[0].result == 2);  // cudaErrorMemoryAllocation
    CHECK(ooms[0].address == 0);
    CHECK(to_string(ooms[0].api) == "cudaMalloc");
    CHECK(r.layer(ooms[0]) == "layers.0");
}

TEST_CASE("allocations carry the tag of their thread: nesting, inheritance and new threads") {
    const ScriptRun& r = script_run();
    for (const LoggedCall& c : r.calls) {
        if (c.what != "alloc") continue;
        const Event* e = r.alloc_of(c);
        REQUIRE(e != nullptr);
        CAPTURE(c.bytes);
        if (c.bytes == 9000) {
            CHECK(r.layer(*e) == "layers.0.mlp");  // nested push
            CHECK(r.phase(*e) == "forward");       // phase inherited (NULL)
        } else if (c.bytes == 10000) {
            CHECK(e->layer == 0);  // a new thread starts untagged
            CHECK(e->phase == 0);
        } else if (c.bytes == 12000 || c.bytes == 13000 || c.bytes == 13001) {
            CHECK(e->layer == 0);  // after the last pop
            CHECK(e->step == 2);
        } else {
            CHECK(r.layer(*e) == "layers.0");
            CHECK(r.phase(*e) == "forward");
            CHECK(e->step == 1);
        }
    }
    CHECK(r.events(EventKind::tag_push).size() == 3);
    CHECK(r.events(EventKind::tag_pop).size() == 3);
    auto steps = r.events(EventKind::step);
    REQUIRE(steps.size() == 2);
    CHECK(steps[0].step == 1);
    CHECK(steps[1].step == 2);
}

TEST_CASE("caching-allocator block events, params and marks reach the trace") {
    const ScriptRun& r = script_run();
    int blocks = 0;
    for (const Event& e : r.trace.events) {
        if (e.level != Level::block) continue;
        ++blocks;
        CHECK(e.size == 256);
        CHECK(r.phase(e) == "backward");
    }
    CHECK(blocks == 2);
    // The registered parameter, and the one a provenance declaration named
    // without a registration (registered then, without sizes).
    REQUIRE(r.trace.params.size() == 2);
    const ParamRecord& p = r.trace.params[0];
    CHECK(r.trace.str(p.layer) == "layers.0");
    CHECK(r.trace.str(p.name) == "fc1.weight");
    CHECK(r.trace.str(p.dtype) == "bf16");
    CHECK(p.numel == 1024 * 256);
    CHECK(p.sharded_numel == 512 * 256);
    const ParamRecord& implicit = r.trace.params[1];
    CHECK(r.trace.str(implicit.layer) == "layers.9");
    CHECK(r.trace.str(implicit.name) == "bias");
    CHECK(implicit.numel == 0);
    auto marks = r.events(EventKind::mark);
    REQUIRE(marks.size() == 1);
    CHECK(r.trace.str(marks[0].aux) == "script begins");
}

TEST_CASE("provenance declarations reach the trace naming the allocation and the parameter") {
    const ScriptRun& r = script_run();
    std::optional<Event> first;  // the 1000 B allocation the declarations name
    for (const Event& e : r.events(EventKind::alloc)) {
        if (e.size == 1000 && !first) first = e;
    }
    REQUIRE(first.has_value());
    auto derived = r.events(EventKind::derived);
    REQUIRE(derived.size() == 2);
    CHECK(derived[0].address == first->address);
    CHECK(derived[0].seq > first->seq);
    CHECK(derived[0].aux == 0);
    CHECK(r.trace.str(uint32_t(derived[0].stream)) == "cast to fp8_e4m3");
    CHECK(r.layer(derived[0]) == "layers.0");
    CHECK(r.phase(derived[0]) == "forward");
    CHECK(derived[1].address == first->address);
    CHECK(derived[1].aux == 1);
    CHECK(derived[1].stream == 0);  // no text
}

TEST_CASE("allocation stacks start at the caller and resolve to the program") {
    const ScriptRun& r = script_run();
    CHECK(r.trace.header.stack_depth == 24);
    const std::string program = fs::canonical(g_program).filename().string();
    for (const Event& e : r.events(EventKind::alloc)) {
        if (e.level == Level::block) continue;
        REQUIRE(e.stack != 0);
        const auto& frames = r.trace.stacks.at(e.stack);
        REQUIRE(!frames.empty());
        CHECK(frames.size() <= 24);
        const ModuleRecord* owner = nullptr;
        for (const ModuleRecord& m : r.trace.modules) {
            if (frames[0] >= m.base && frames[0] < m.base + m.size) owner = &m;
        }
        REQUIRE(owner != nullptr);
        CHECK(fs::path(owner->path).filename().string() == program);
        CHECK(!owner->build_id.empty());
    }
}

TEST_CASE("the trace is complete and allocscope report reads it") {
    const ScriptRun& r = script_run();
    CHECK(!r.trace.truncated);
    REQUIRE(r.trace.footer.has_value());
    CHECK(r.trace.footer->events == r.trace.events.size());
    CHECK(r.trace.footer->events_dropped == 0);
    TempDir s;
    ShellResult rep = run_shell(g_cli + " report --full " + (r.scratch / "out").string());
    CHECK(rep.status == 0);
    CHECK(rep.out.find("cudaMallocFromPoolAsync_ptsz") != std::string::npos);
    CHECK(rep.out.find("frees of unknown addresses: 1, double frees: 1") != std::string::npos);
    CHECK(rep.out.find("failed allocations (oom): 1, largest request 1.00 PiB") !=
          std::string::npos);
    CHECK(rep.out.find("11.7 KiB in 1 allocation(s)") != std::string::npos);  // the kept 12000 B
    // The one caching-allocator block, alive at the block peak, with its tag:
    // the (layer, phase) row says 256 B allocated and 256 B live at the peak.
    bool block_row = false;
    std::istringstream lines(rep.out);
    for (std::string line; std::getline(lines, line);) {
        if (line.rfind("  layers.0 ", 0) == 0 && line.find(" backward ") != std::string::npos &&
            line.find("256 B") != line.rfind("256 B")) {
            block_row = true;
        }
    }
    CHECK(block_row);
}

TEST_CASE("the program's output and status are the same with and without allocscope") {
    TempDir s;
    ShellResult plain = run_shell(g_program + " script");
    ShellResult traced =
        run_shell(g_cli + " run --out " + (s / "out").string() + " -- " + g_program + " script");
    CHECK(plain.status == 0);
    CHECK(traced.status == plain.status);
    CHECK(traced.out == plain.out);
    ShellResult exit7 = run_shell(g_cli + " run --force --out " + (s / "out").string() + " -- " +
                                  g_program + " exit 7");
    CHECK(exit7.status == 7);
}

TEST_CASE("tags deeper than 64 are flagged and matched, and a stray pop is ignored") {
    TempDir s;
    fs::path out = s / "out";
    ShellResult r =
        run_shell(g_cli + " run --out " + out.string() + " -- " + g_program + " deep-tags");
    CHECK(r.status == 0);
    auto files = traces_in(out);
    REQUIRE(files.size() == 1);
    Trace t = load_trace(files[0].string());
    int pushes = 0, pops = 0, flagged_pushes = 0, flagged_pops = 0;
    for (const Event& e : t.events) {
        if (e.kind == EventKind::tag_push) {
            ++pushes;
            flagged_pushes += (e.flags & kFlagTagOverflow) != 0;
        }
        if (e.kind == EventKind::tag_pop) {
            ++pops;
            flagged_pops += (e.flags & kFlagTagOverflow) != 0;
        }
        if (e.kind == EventKind::alloc && e.size == 7070) {
            CHECK(t.str(e.layer) == "level.64");  // the deepest tag that fits
        }
        if (e.kind == EventKind::alloc && e.size == 7171) CHECK(e.layer == 0);
    }
    CHECK(pushes == 70);
    CHECK(pops == 70);  // the stray pop left no event
    CHECK(flagged_pushes == 6);
    CHECK(flagged_pops == 6);
}

TEST_CASE("a CUDA graph pool's blocks are counted apart and never judged as a leak") {
    TempDir s;
    // The same blocks as ordinary ones grow step after step: a leak.
    const fs::path control = s / "control", pool = s / "pool";
    ShellResult c = run_shell(g_cli + " run --out " + control.string() + " -- " + g_program +
                              " graph-pool-control");
    REQUIRE(c.status == 0);
    const std::string control_findings = slurp(control / "findings.json");
    CHECK(control_findings.find("\"plugin\": \"cross-step-leak\"") != std::string::npos);
    CHECK(control_findings.find("\"plugin\": \"phase-retention\"") != std::string::npos);

    ShellResult r =
        run_shell(g_cli + " run --out " + pool.string() + " -- " + g_program + " graph-pool");
    REQUIRE(r.status == 0);
    CHECK(r.out.find("graph-pool done") != std::string::npos);
    const std::string findings = slurp(pool / "findings.json");
    CHECK(findings.find("\"plugin\": \"cross-step-leak\"") == std::string::npos);
    CHECK(findings.find("\"plugin\": \"phase-retention\"") == std::string::npos);
    auto files = traces_in(pool);
    REQUIRE(files.size() == 1);
    Trace t = load_trace(files[0].string());
    // The declared pool's six blocks and the capture's own one; not the
    // undeclared pool's (a program's own, ordinary).
    size_t declared = 0, own = 0, ordinary = 0;
    for (const Event& e : t.events) {
        if (e.kind != EventKind::alloc) continue;
        if ((e.flags & kFlagGraphPool) == 0) {
            ordinary += e.size == 8192;
            continue;
        }
        CHECK(t.str(e.layer) == "layers.0");
        declared += e.aux == 7 && e.size == 1u << 20;
        own += e.aux == 5 && e.size == 2u << 20;
    }
    CHECK(declared == 6);
    CHECK(own == 1);
    CHECK(ordinary == 6);
    // The report counts them apart, in the blocks' totals too.
    const std::string report = slurp(pool / "report.txt");
    CHECK(report.find("CUDA graph pools: 7 blocks (8.00 MiB), at most 8.00 MiB live at once, "
                      "8.00 MiB in 7 at exit; held by the graphs for replay") != std::string::npos);
    ShellResult json = run_shell(g_cli + " report " + pool.string() + " --format json");
    REQUIRE(json.status == 0);
    CHECK(json.out.find("\"graph_pools\": {\"allocations\": 7, \"allocated_bytes\": 8388608, "
                        "\"peak_bytes\": 8388608, \"live_bytes_at_exit\": 8388608, "
                        "\"live_count_at_exit\": 7}") != std::string::npos);
}

TEST_CASE("keyed tags: a leave pops its own entry, nested enters drop what is over") {
    TempDir s;
    fs::path out = s / "out";
    ShellResult r =
        run_shell(g_cli + " run --out " + out.string() + " -- " + g_program + " keyed-tags");
    CHECK(r.status == 0);
    CHECK(r.err.find("returned") == std::string::npos);
    auto files = traces_in(out);
    REQUIRE(files.size() == 1);
    Trace t = load_trace(files[0].string());
    const std::map<uint64_t, std::pair<std::string, std::string>> want = {
        {20001, {"root", "forward"}},
        {20002, {"x", "forward"}},
        {20003, {"root", "forward"}},
        {20004, {"root", "forward"}},
        {20005, {"", ""}},
        {20006, {"root.b", "backward"}},
        {20007, {"root.a", "backward"}},
        {20008, {"root.e.fc", "backward"}},
        {20009, {"root.e", "backward"}},
        {20010, {"root", "backward"}},
        {20011, {"model", "optimizer"}},
        {20012, {"", ""}},
        {20013, {"", ""}},
        {20014, {"reused.first", "forward"}},
        {20015, {"reused.other", "forward"}},
        {20016, {"reused.other", "forward"}},
    };
    size_t seen = 0;
    int pushes = 0, pops = 0;
    for (const Event& e : t.events) {
        pushes += e.kind == EventKind::tag_push;
        pops += e.kind == EventKind::tag_pop;
        if (e.kind != EventKind::alloc) continue;
        auto it = want.find(e.size);
        if (it == want.end()) continue;
        ++seen;
        CAPTURE(e.size);
        CHECK(t.str(e.layer) == it->second.first);
        CHECK(t.str(e.phase) == it->second.second);
    }
    CHECK(seen == want.size());
    // Every entry left again, re-entered ones included: 3 forward and
    // plain, 7 backward (root.e.fc twice), 1 recomputation, 2 optimizer and
    // plain, 3 from the reused buffer.
    CHECK(pushes == 16);
    CHECK(pops == 16);
}

TEST_CASE("ALLOCSCOPE_STACK_DEPTH=0 turns stack capture off") {
    ScriptRun r("ALLOCSCOPE_STACK_DEPTH=0");
    CHECK(r.trace.header.stack_depth == 0);
    for (const Event& e : r.events(EventKind::alloc))
        CHECK(e.stack == 0);
    CHECK(r.trace.stacks.size() == 1);  // only the implicit "no stack"
}

TEST_CASE("ALLOCSCOPE_WALK_CYCLES=1 adds the cycles a frame cost by where its rule came from") {
    ScriptRun r("ALLOCSCOPE_LOG=debug ALLOCSCOPE_WALK_CYCLES=1");
    CHECK(r.result.status == 0);
    const std::string& err = r.result.err;
    const size_t at = err.find("; cycles per frame: ");
    REQUIRE(at != std::string::npos);
    unsigned long long memo = 0, recent = 0, process = 0;
    REQUIRE(std::sscanf(err.c_str() + at,
                        "; cycles per frame: %llu (rule from the memo), %llu (recent rules), %llu "
                        "(process-wide cache)",
                        &memo, &recent, &process) == 3);
#if defined(__x86_64__)
    CHECK(memo > 0);     // the script's loops walk the same frames again and again
    CHECK(process > 0);  // the first walk of each frame computes its rule
#endif
}

TEST_CASE("ALLOCSCOPE_LOG=debug reports at exit how many stacks were captured and their cost") {
    ScriptRun r("ALLOCSCOPE_LOG=debug");
    CHECK(r.result.status == 0);
    REQUIRE(count_lines(r.result.err, " stacks captured, ") == 1);
    const std::string err = r.result.err;
    const size_t at = err.find(" stacks captured, ");
    const size_t line = err.rfind('\n', at) + 1;  // npos + 1 == 0 on the first line
    unsigned long long captured = 0, ns = 0, ms = 0, walk_ns = 0, python = 0, fallbacks = 0,
                       frames = 0, memo = 0;
    REQUIRE(std::sscanf(err.c_str() + line,
                        "allocscope: %llu stacks captured, %llu ns each on average (%llu ms in "
                        "all; walking %llu ns, interning the rest), %llu Python frames appended, "
                        "%llu walks fell back to libgcc's unwinder; %llu native frames stepped "
                        "through per walk, %llu %% of their rules from the thread's memo of its "
                        "last walk",
                        &captured, &ns, &ms, &walk_ns, &python, &fallbacks, &frames, &memo) == 8);
    // One capture per allocation, failed ones (oom events) included: a
    // failed request's stack is where the report says it was made.
    CHECK(captured == r.events(EventKind::alloc).size() + r.events(EventKind::oom).size());
    CHECK(ns > 0);
    CHECK(walk_ns <= ns);
    CHECK(frames > 0);
    CHECK(memo <= 100);
    CHECK(python == 0);
    CHECK(fallbacks <= captured);
    unsigned long long recent = 0;
    REQUIRE(std::sscanf(err.c_str() + err.find(" % of their rules from the thread's memo", line),
                        " %% of their rules from the thread's memo of its last walk, %llu %% "
                        "from its recent rules",
                        &recent) == 1);
    CHECK(memo + recent <= 100);
    unsigned long long replayed = 0;
    REQUIRE(std::sscanf(err.c_str() + err.find(" % from its recent rules; ", line),
                        " %% from its recent rules; %llu captures replayed an earlier walk",
                        &replayed) == 1);
    // Whether any capture replays depends on the runtime (the script has no
    // loop; tests/unwind_test.cpp covers replay itself).
    CHECK(replayed <= captured);
    CHECK(err.find("cycles per frame", line) > err.find('\n', at));  // only when asked for
    // The writer thread's CPU time, against the time it was recording.
    REQUIRE(count_lines(err, "allocscope: the writer thread used ") == 1);
    double writer_cpu_ms = -1, recording_ms = -1, percent = -1;
    REQUIRE(std::sscanf(err.c_str() + err.find("allocscope: the writer thread used "),
                        "allocscope: the writer thread used %lf ms of CPU in %lf ms of recording "
                        "(%lf %% of a core",
                        &writer_cpu_ms, &recording_ms, &percent) == 3);
    CHECK(writer_cpu_ms > 0);
    CHECK(recording_ms > 0);
    CHECK(writer_cpu_ms <= recording_ms + 1);  // one thread, clocks of 0.1 ms print precision
    // The share agrees with the two times, to their printed precision (±0.05 ms).
    const double slack =
        100 * (0.05 / recording_ms + writer_cpu_ms * 0.05 / (recording_ms * recording_ms)) + 0.05;
    CHECK(std::abs(percent - 100 * writer_cpu_ms / recording_ms) <= slack);
    // Without debug logging nothing is timed and nothing is said.
    const ScriptRun& quiet = script_run();
    CHECK(count_lines(quiet.result.err, " stacks captured, ") == 0);
    CHECK(count_lines(quiet.result.err, "writer thread used") == 0);
}

TEST_CASE("an invalid setting prints one line naming it and the program runs on") {
    ScriptRun r("ALLOCSCOPE_LOG=loud");
    CHECK(r.result.status == 0);
    CHECK(count_lines(r.result.err, "ALLOCSCOPE_LOG") == 1);
    CHECK(r.result.err.find("quiet, info, debug") != std::string::npos);
    CHECK(r.trace.footer.has_value());
}

TEST_CASE("ALLOCSCOPE_DISABLE=1 records nothing and changes nothing") {
    TempDir s;
    ShellResult r = run_shell("ALLOCSCOPE_DISABLE=1 " + g_cli + " run --out " +
                              (s / "out").string() + " -- " + g_program + " script");
    CHECK(r.status == 0);
    CHECK(r.out.find("script done: 0 failure(s)\n") != std::string::npos);
    CHECK(traces_in(s / "out").empty());
}

TEST_CASE("an unwritable output directory gives one warning and the program runs on") {
    TempDir s;
    std::ofstream(s / "file") << "x";
    // A directory cannot be created below a regular file, even as root.
    ShellResult r = run_shell(
        "LD_PRELOAD=" +
        (fs::path(g_cli).parent_path() / ".." / "interposer" / "liballocscope.so").string() +
        " ALLOCSCOPE_OUT=" + (s / "file" / "out").string() + " " + g_program + " script");
    CHECK(r.status == 0);
    CHECK(r.out.find("script done: 0 failure(s)\n") != std::string::npos);
    CHECK(count_lines(r.err, "allocscope:") == 1);
    CHECK(r.err.find("recording disabled") != std::string::npos);
}

TEST_CASE("a forked child stops recording; the parent's trace stays whole") {
    TempDir s;
    fs::path out = s / "out";
    ShellResult r = run_shell(g_cli + " run --out " + out.string() + " -- " + g_program + " fork");
    CHECK(r.status == 0);
    CHECK(r.out == "fork done: child ok\n");
    auto files = traces_in(out);
    REQUIRE(files.size() == 1);
    Trace t = load_trace(files[0].string());
    CHECK(t.footer.has_value());
    std::vector<uint64_t> sizes;
    for (const Event& e : t.events) {
        if (e.kind == EventKind::alloc) sizes.push_back(e.size);
    }
    CHECK(sizes == std::vector<uint64_t>{3333});
    CHECK(std::count_if(t.events.begin(), t.events.end(),
                        [](const Event& e) { return e.kind == EventKind::mark; }) == 1);
}

TEST_CASE("children forked while other threads are inside hooks never hang") {
    TempDir s;
    fs::path out = s / "out";
    ShellResult r =
        run_shell(g_cli + " run --out " + out.string() + " -- " + g_program + " fork-busy");
    CHECK(r.status == 0);
    CHECK(r.out == "fork-busy done: 50 of 50 children exited cleanly\n");
    auto files = traces_in(out);
    REQUIRE(files.size() == 1);  // the children recorded nothing
    Trace t = load_trace(files[0].string());
    CHECK(t.footer.has_value());
    for (const Event& e : t.events) {
        if (e.kind == EventKind::mark) FAIL("a forked child's mark reached the parent's trace");
    }
}

TEST_CASE("an exec'd child with the preload records into its own file") {
    TempDir s;
    fs::path out = s / "out";
    ShellResult r =
        run_shell("RANK=3 " + g_cli + " run --out " + out.string() + " -- " + g_program + " exec");
    CHECK(r.status == 0);
    auto files = traces_in(out);
    REQUIRE(files.size() == 2);
    // Before exec: rank3.trace, cut short by exec. After: RANK removed, so
    // the same pid names the second file.
    CHECK(files[0].filename().string().rfind("pid", 0) == 0);
    CHECK(files[1].filename() == "rank3.trace");
    Trace after = load_trace(files[0].string());
    CHECK(after.footer.has_value());
    CHECK(after.header.rank == -1);
    Trace before = load_trace(files[1].string());
    CHECK(before.header.rank == 3);
    CHECK(before.header.pid == after.header.pid);
}

TEST_CASE("a runtime loaded RTLD_LOCAL by a dlopen'ed library is still interposed") {
    if (g_local_lib.empty()) return;  // only built against the host-memory runtime
    TempDir s;
    fs::path out = s / "out";
    ShellResult r = run_shell(g_cli + " run --out " + out.string() + " -- " + g_local_loader + " " +
                              g_local_lib);
    CHECK(r.status == 0);
    CHECK(r.out == "local done: 0\n");
    auto files = traces_in(out);
    REQUIRE(files.size() == 1);
    Trace t = load_trace(files[0].string());
    int allocs = 0, frees = 0;
    for (const Event& e : t.events) {
        if (e.kind == EventKind::alloc && e.size == 5555) ++allocs;
        if (e.kind == EventKind::free && e.size == 5555 && e.result == 0) ++frees;
    }
    CHECK(allocs == 1);
    CHECK(frees == 1);
}

TEST_CASE("allocscope run refuses to mix runs and reports bad input with exit 2") {
    TempDir s;
    fs::path out = s / "out";
    CHECK(run_shell(g_cli + " run --out " + out.string() + " -- " + g_program + " exit 0").status ==
          0);
    ShellResult again =
        run_shell(g_cli + " run --out " + out.string() + " -- " + g_program + " exit 0");
    CHECK(again.status == 2);
    CHECK(again.err.find("--force") != std::string::npos);
    ShellResult missing = run_shell(g_cli + " report " + (s / "nope.trace").string());
    CHECK(missing.status == 2);
    CHECK(missing.err.find("nope.trace") != std::string::npos);
    // A trace cut short (the process was killed) is reported up to its end,
    // with a warning naming the file and offset.
    fs::path trace = traces_in(out).at(0);
    fs::path cut = s / "cut.trace";
    fs::copy_file(trace, cut);
    fs::resize_file(cut, fs::file_size(trace) - 10);
    ShellResult truncated = run_shell(g_cli + " report " + cut.string());
    CHECK(truncated.status == 0);
    CHECK(truncated.out.find("warning: " + cut.string() +
                             ": trace cut off inside a record at byte") != std::string::npos);
    CHECK(truncated.out.find(" events over ") != std::string::npos);  // what precedes the cut
    // Corrupt the first payload byte of the first record after the header
    // (the host record, where the machine has a name): the trace is
    // unreadable at that record.
    allocscope::test::flip_byte(trace, 72 + 12);
    ShellResult corrupt = run_shell(g_cli + " report " + trace.string());
    CHECK(corrupt.status == 2);
    CHECK(corrupt.err.find("at byte 72") != std::string::npos);
    CHECK(count_lines(corrupt.err, "allocscope:") == 1);
    ShellResult no_cmd = run_shell(g_cli + " run --out " + out.string());
    CHECK(no_cmd.status == 2);
    ShellResult not_found =
        run_shell(g_cli + " run --force --out " + out.string() + " -- /nonexistent/program");
    CHECK(not_found.status == 127);
}

int main(int argc, char** argv) {
    const char* cli = std::getenv("E2E_CLI");
    const char* program = std::getenv("E2E_PROGRAM");
    if (!cli || !program) {
        std::fprintf(stderr, "E2E_CLI and E2E_PROGRAM must be set (see tests/meson.build)\n");
        return 2;
    }
    g_cli = cli;
    g_program = program;
    if (const char* lib = std::getenv("E2E_LOCAL_LIB")) g_local_lib = lib;
    if (const char* loader = std::getenv("E2E_LOCAL_LOADER")) g_local_loader = loader;
    const char* gpu = std::getenv("E2E_GPU");
    g_gpu = gpu && std::string(gpu) == "1";
    if (g_gpu) {
        int probe = std::system((g_program + " probe >/dev/null 2>&1").c_str());
        if (!WIFEXITED(probe) || WEXITSTATUS(probe) != 0) {
            std::fprintf(stderr, "no usable CUDA device: skipping the real-runtime variant\n");
            return 77;
        }
    }
    doctest::Context context(argc, argv);
    return context.run();
}
